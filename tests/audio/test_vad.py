"""Voice activity detection (seq2seq_engine.audio.vad, .silero) with the real Silero VAD weights on real speech
(pytest-audioeval clips) joined by generated silence, noise and tones: probabilities against the TorchScript module's
own frame-by-frame forward, regions against the silero-vad package's `get_speech_timestamps` run on that module, and
regions against the speech spans known by construction."""
import glob
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import require_speech_clips

from seq2seq_engine.audio import SAMPLE_RATE, load_audio, silero as silero_module
from seq2seq_engine.audio.vad import VadOptions, speech_regions

pytestmark = pytest.mark.usefixtures("one_thread")
SR = SAMPLE_RATE


def clip(name):
    return load_audio(os.path.join(require_speech_clips(), name))


def voiced_span(samples, floor_db=-35.0):
    """(first, last) sample of the 10 ms frames within floor_db of the clip's loudest frame: where its speech is."""
    frames = samples[:len(samples) // 160 * 160].reshape(-1, 160)
    level = 20 * np.log10(np.sqrt((frames.astype(np.float64) ** 2).mean(axis=1)) + 1e-10)
    loud = np.flatnonzero(level > level.max() + floor_db)
    return int(loud[0] * 160), int((loud[-1] + 1) * 160)


def build(parts):
    """Concatenate (kind, samples) parts; returns the audio and, per speech part, (start, end, voiced start, end)."""
    audio, spans, position = [], [], 0
    for kind, samples in parts:
        if kind == "speech":
            first, last = voiced_span(samples)
            spans.append((position, position + len(samples), position + first, position + last))
        audio.append(samples.astype(np.float32))
        position += len(samples)
    return np.concatenate(audio), spans


def tone(seconds):
    t = np.arange(int(seconds * SR)) / SR
    return 0.1 * np.sin(2 * np.pi * 440 * t) + 0.05 * np.sin(2 * np.pi * 1000 * t)


def noise(seconds, level=0.01, seed=0):
    return level * np.random.default_rng(seed).standard_normal(int(seconds * SR))


@pytest.fixture(scope="module")
def recording():
    """Three clips separated by 6 s of noise and 5 s of tones, with silence before and after."""
    return build([("silence", np.zeros(2 * SR)), ("speech", clip("en/hello_world.wav")), ("noise", noise(6)),
                  ("speech", clip("en/quick_brown_fox.wav")), ("tone", tone(5)),
                  ("speech", clip("en/counting.wav")), ("silence", np.zeros(3 * SR))])


@pytest.fixture(scope="module")
def long_speech():
    """~75 s of the three clips, back to back with 0.25 s pauses: speech far longer than a 30 s window."""
    clips = [clip(f"en/{name}.wav") for name in ("counting", "hello_world", "quick_brown_fox")]
    parts = []
    for k in range(27):
        parts += [("speech", clips[k % 3]), ("pause", noise(0.25, 0.001, seed=k))]
    return build(parts)


@pytest.fixture(scope="module")
def silero_reference():
    """The silero-vad package's own `get_speech_timestamps` (its import sets torch to 1 thread: undone here)."""
    threads = torch.get_num_threads()
    from silero_vad.utils_vad import get_speech_timestamps
    torch.set_num_threads(threads)
    return get_speech_timestamps


def streaming(module, audio):
    """Speech probabilities from the TorchScript module's own forward, one 512-sample frame at a time."""
    padded = np.pad(audio, (0, -len(audio) % 512))
    module.reset_states()
    with torch.no_grad():
        out = [module(torch.from_numpy(padded[i:i + 512])[None], SR).item() for i in range(0, len(padded), 512)]
    module.reset_states()
    return np.array(out)


def test_batched_probabilities_equal_the_modules_frame_by_frame_forward(recording, monkeypatch):
    audio, _ = recording
    model = silero_module.load_silero_vad()
    reference = streaming(model.module, audio)
    ours = model.probabilities(audio)
    assert ours.shape == reference.shape == (-(-len(audio) // 512),)
    assert np.abs(ours - reference).max() < 1e-4
    assert ((ours >= 0.5) == (reference >= 0.5)).all()
    monkeypatch.setattr(silero_module, "BLOCK_FRAMES", 7)  # the LSTM state carried across encoder blocks
    assert np.abs(model.probabilities(audio) - ours).max() < 1e-5


@pytest.mark.parametrize("options", [
    VadOptions(min_silence_duration_ms=2000),  # faster-whisper's VadOptions defaults (its transcribe)
    VadOptions(max_speech_duration_s=30),  # its batched pipeline's (min_silence_duration_ms 160, our default)
    VadOptions(threshold=0.6, neg_threshold=0.2, min_speech_duration_ms=250, min_silence_duration_ms=100,
               speech_pad_ms=30),  # silero-vad's own defaults, with other thresholds
    VadOptions(max_speech_duration_s=2.0, min_silence_duration_ms=300, speech_pad_ms=100),
])
@pytest.mark.parametrize("audio_name", ["recording", "long_speech"])
def test_regions_equal_silero_get_speech_timestamps(options, audio_name, request, silero_reference):
    audio, _ = request.getfixturevalue(audio_name)
    expected = silero_reference(
        torch.from_numpy(audio), silero_module.load_silero_vad().module, threshold=options.threshold,
        neg_threshold=options.neg_threshold, min_speech_duration_ms=options.min_speech_duration_ms,
        max_speech_duration_s=options.max_speech_duration_s, min_silence_duration_ms=options.min_silence_duration_ms,
        speech_pad_ms=options.speech_pad_ms, use_max_poss_sil_at_max_speech=False)  # faster-whisper's cut rule
    assert speech_regions(audio, options) == [(r["start"], r["end"]) for r in expected]


@pytest.mark.parametrize("min_silence_ms", [2000, 160])
def test_regions_cover_each_clip_and_leave_out_silence_noise_and_tones(recording, min_silence_ms):
    audio, spans = recording
    options = VadOptions(min_silence_duration_ms=min_silence_ms)
    regions = speech_regions(audio, options)
    assert len(regions) == 3
    pad = options.speech_pad_ms * SR // 1000
    tolerance = SR // 10
    for (start, end), (clip_start, clip_end, voiced_start, voiced_end) in zip(regions, spans):
        assert start <= voiced_start + tolerance and end >= voiced_end - tolerance  # the speech is inside
        assert start >= clip_start - pad - tolerance and end <= clip_end + pad + tolerance  # padding, no more


def test_no_regions_without_speech():
    for audio in (np.zeros(5 * SR), noise(5), noise(5, 0.2, seed=1), tone(5), np.zeros(100)):
        assert speech_regions(audio.astype(np.float32)) == []


def test_long_speech_is_cut_within_the_window_and_stays_covered(long_speech):
    audio, spans = long_speech
    options = VadOptions(max_speech_duration_s=30)  # what transcribe uses
    regions = speech_regions(audio, options)
    assert len(regions) >= 3
    assert all(end - start <= 30 * SR for start, end in regions)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(regions, regions[1:]))
    for _, _, voiced_start, voiced_end in spans:  # every sample of speech is in some region
        covered = sum(max(0, min(end, voiced_end) - max(start, voiced_start)) for start, end in regions)
        assert covered == voiced_end - voiced_start


def test_options_validation():
    assert VadOptions.from_parameters({"threshold": 0.4}) == VadOptions(threshold=0.4)
    assert VadOptions.from_parameters(VadOptions(speech_pad_ms=0), threshold=0.3) == VadOptions(0.3, speech_pad_ms=0)
    assert VadOptions.from_parameters(None) == VadOptions()
    with pytest.raises(ValueError, match="unknown vad_parameters"):
        VadOptions.from_parameters({"treshold": 0.2})
    for bad in ({"threshold": 1.5}, {"neg_threshold": -0.1}, {"min_silence_duration_ms": -1},
                {"speech_pad_ms": "400"}, {"threshold": True}):
        with pytest.raises(ValueError, match="vad"):
            VadOptions.from_parameters(bad)
    with pytest.raises(ValueError, match="must exceed twice speech_pad_ms"):
        VadOptions(max_speech_duration_s=30, speech_pad_ms=15000)
    with pytest.raises(TypeError):
        VadOptions.from_parameters([("threshold", 0.5)])


def test_model_loads_without_importing_the_silero_package_or_torchaudio():
    path = silero_module.model_path()
    assert path.endswith(os.path.join("silero_vad", "data", "silero_vad.jit"))
    assert glob.glob(os.path.join(os.path.dirname(path), "*.onnx"))  # the wheel's other formats sit beside it
    # In a fresh process: the package's __init__ would set torch to one thread for the whole process.
    code = ("import sys, numpy, torch; torch.set_num_threads(2); from seq2seq_engine.audio.vad import speech_regions; "
            "speech_regions(numpy.zeros(16000, numpy.float32)); "
            "print(torch.get_num_threads(), sorted(m for m in sys.modules if m.startswith(('silero', 'torchaudio'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split("\n")[-2] == "2 []"


def test_frames_of_a_block_are_the_rows_of_the_whole_recording():
    audio = np.random.default_rng(3).standard_normal(512 * 9 + 100).astype(np.float32)
    padded = np.concatenate([np.zeros(64, np.float32), audio, np.zeros(512 - 100, np.float32)])
    expected = np.stack([padded[k * 512:k * 512 + 576] for k in range(10)])  # 64 samples of context + the frame
    whole = silero_module.SileroVad.frames(audio).numpy()
    assert np.array_equal(whole, expected)
    for first, count in ((0, 3), (3, 4), (7, 5), (9, 1), (10, 2)):
        block = silero_module.SileroVad.frames(audio, first, count).numpy()
        assert np.array_equal(block, expected[first:first + count])
