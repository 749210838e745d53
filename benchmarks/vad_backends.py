"""Silero VAD speed and agreement per way of running it: TorchScript or ONNX, frame by frame or batched.

    python -m benchmarks.vad_backends [--seconds 300] [--repeat 3] [--threads 1] [--quick]

The audio is the English pytest-audioeval clips cycled with 0.5-4 s of low noise between them, cut to `--seconds`.
Rows (all from the silero-vad wheel's files; the ONNX rows need onnxruntime, the `bench` extra, else skipped):

* jit-frames: `silero_vad.jit`'s own streaming forward, one 512-sample frame per call (the package's reference);
* jit-batched: what the engine runs (seq2seq_engine/audio/silero.py): the module's extractor and encoder over blocks
  of frames, the LSTM over the sequence;
* onnx-frames: `silero_vad.onnx` one frame per `session.run`, state carried (the package's OnnxWrapper loop);
* onnx-blocks: `silero_vad_16k_sequence.onnx`, 512 frames per `session.run` (as faster-whisper runs its VAD model).

Columns: best wall time, x real time, the largest probability difference from jit-frames, the frames on the other
side of 0.5, and whether the speech regions (default VadOptions) equal jit-frames'.
"""
import argparse
import os
import time
from typing import Callable, Dict, List

import numpy as np
import torch

from benchmarks.lib.clips import load_clips
from benchmarks.lib.common import print_markdown, print_run_header
from seq2seq_engine.audio import SAMPLE_RATE
from seq2seq_engine.audio.silero import CONTEXT_SAMPLES, FRAME_SAMPLES, SileroVad, model_path
from seq2seq_engine.audio.vad import VadOptions, regions_from_probabilities


def test_audio(seconds: float) -> np.ndarray:
    clips = [c.samples for c in load_clips("en", 0)]
    rng = np.random.default_rng(0)
    parts, total, i = [], 0, 0
    while total < seconds * SAMPLE_RATE:
        gap = (0.01 * rng.standard_normal(int(rng.uniform(0.5, 4) * SAMPLE_RATE))).astype(np.float32)
        parts += [clips[i % len(clips)], gap]
        total += len(parts[-2]) + len(gap)
        i += 1
    return np.concatenate(parts)[:int(seconds * SAMPLE_RATE)]


def onnx_session(name: str):
    import onnxruntime
    options = onnxruntime.SessionOptions()
    options.inter_op_num_threads = 1
    options.intra_op_num_threads = torch.get_num_threads()
    path = os.path.join(os.path.dirname(model_path()), name)
    return onnxruntime.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])


def backends() -> Dict[str, Callable[[], Callable[[np.ndarray], np.ndarray]]]:
    """name -> a loader returning a function from audio to per-frame probabilities (loading is not timed)."""
    def jit_frames():
        module = SileroVad(model_path()).module

        def run(audio):
            module.reset_states()
            with torch.no_grad():
                frames = SileroVad.frames(audio)[:, CONTEXT_SAMPLES:]
                return torch.cat([module(frame[None], SAMPLE_RATE) for frame in frames]).reshape(-1).numpy()
        return run

    def onnx_frames():
        session = onnx_session("silero_vad.onnx")

        def run(audio):
            state, rate, out = np.zeros((2, 1, 128), np.float32), np.array(SAMPLE_RATE, np.int64), []
            for row in SileroVad.frames(audio).numpy():
                probability, state = session.run(None, {"input": row[None], "state": state, "sr": rate})
                out.append(probability)
            return np.concatenate(out).reshape(-1)
        return run

    def onnx_blocks():
        session = onnx_session("silero_vad_16k_sequence.onnx")

        def run(audio):
            frames, out = SileroVad.frames(audio).numpy(), []
            h = c = np.zeros((1, 1, 128), np.float32)
            for first in range(0, len(frames), 512):
                probability, h, c = session.run(None, {"input": frames[first:first + 512], "h": h, "c": c})
                out.append(probability)
            return np.concatenate(out).reshape(-1)
        return run

    return {"jit-frames": jit_frames, "jit-batched": lambda: SileroVad(model_path()).probabilities,
            "onnx-frames": onnx_frames, "onnx-blocks": onnx_blocks}


def main(argv: List[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per backend; the fastest is reported")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (and ONNX intra-op threads)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 20 s of audio, one timed run")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.repeat = 20.0, 1
    torch.set_num_threads(args.threads)
    print_run_header(args.threads)
    audio = test_audio(args.seconds)
    onnx = True
    try:
        import onnxruntime
        print(f"onnxruntime {onnxruntime.__version__}")
    except ImportError:
        onnx = False
        print("onnxruntime is not installed: the onnx rows are skipped (pip install -e '.[bench]')")
    rows, reference, reference_regions = [], None, None
    for name, load in backends().items():
        if name.startswith("onnx") and not onnx:
            continue
        run = load()
        walls = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            probabilities = run(audio)
            walls.append(time.perf_counter() - start)
        regions = regions_from_probabilities(probabilities, len(audio), VadOptions())
        if reference is None:
            reference, reference_regions = probabilities, regions
        rows.append([name, f"{min(walls):.3f}", f"{len(audio) / SAMPLE_RATE / min(walls):.0f}x",
                     f"{np.abs(probabilities - reference).max():.1e}",
                     str(int(((probabilities >= 0.5) != (reference >= 0.5)).sum())),
                     "yes" if regions == reference_regions else "no", " ".join(f"{w:.3f}" for w in walls)])
    print(f"audio {len(audio) / SAMPLE_RATE:.1f} s, {-(-len(audio) // FRAME_SAMPLES)} frames of 32 ms")
    print_markdown(["engine", "wall s", "x real time", "max abs diff vs jit-frames", "flips at 0.5", "same regions",
                    "all runs s"], rows)


if __name__ == "__main__":
    main()
