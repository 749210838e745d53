"""Where windows come from (window_source.py): clips cut from a stream equal clips cut from the whole signal, a
WindowReader streams without VAD and packs speech inside the clips with it (one decode: vad_stream.py), and it
counts what no window covers; TranscriptionOptions carries the VAD settings and the CLI turns every flag into one
options object."""
import argparse

import numpy as np
import pytest
import soundfile

from seq2seq_engine.audio import iter_windows, load_audio
from seq2seq_engine.audio.silero import FRAME_SAMPLES
from seq2seq_engine.audio.vad import VadOptions
from seq2seq_engine.entrypoints import transcribe_cli
from seq2seq_engine.transcription import TranscriptionOptions
from seq2seq_engine.transcription.input import vad_stream
from seq2seq_engine.transcription.input.vad_windows import intersect_regions, pack_regions
from seq2seq_engine.transcription.input.window_source import WindowReader, clip_spans, clip_stream, clip_windows

SR = 16000
W = 30 * SR


def _blocks(audio, size):
    return iter([audio[i:i + size] for i in range(0, len(audio), size)])


@pytest.mark.parametrize("clips", [(), (5.0, 40.0), (60.0,), (1.2345, 2.0, 69.0, 90.0, 95.0), (0.5, 0.5, 10.0, 75.0),
                                   (100.0, 120.0), (0.0, 31.0, 31.0, 62.0)])
@pytest.mark.parametrize("block", [W, 7001, 3 * W])
def test_clip_stream_equals_clip_windows(clips, block):
    audio = np.random.default_rng(0).standard_normal(70 * SR + 123).astype(np.float32)
    expected = clip_windows(audio, clips, W)
    streamed = list(clip_stream(_blocks(audio, block), clip_spans(clips, None), W))
    assert [start for start, _ in streamed] == [start for start, _ in expected]
    for (_, got), (_, want) in zip(streamed, expected):
        np.testing.assert_array_equal(got, want)


def test_clip_stream_reads_the_blocks_to_the_end():
    audio = np.ones(90 * SR, np.float32)
    blocks = _blocks(audio, W)
    assert [s for s, _ in clip_stream(blocks, clip_spans((1.0, 2.0), None), W)] == [SR]
    assert next(blocks, None) is None


def _read_all(reader):
    cuts = []
    while True:
        cut = reader.next_window()
        if cut is None:
            return cuts
        cuts.append(cut)


def test_reader_streams_a_file_without_vad(tmp_path):
    audio = (0.1 * np.random.default_rng(1).standard_normal(75 * SR)).astype(np.float32)
    path = tmp_path / "a.flac"
    soundfile.write(path, audio, SR)
    reader = WindowReader(str(path), W)
    first = reader.next_window()
    assert first[0] == 0 and len(first[1]) == W and first[2] is None and reader.position == W and not reader.done
    rest = _read_all(reader)
    windows = [first[1]] + [samples for _, samples, _ in rest]
    expected = list(iter_windows(str(path), W))
    assert [len(w) for w in windows] == [len(w) for w in expected]
    assert all(np.array_equal(a, b) for a, b in zip(windows, expected))
    assert reader.done and reader.position == len(load_audio(str(path))) and reader.skipped == 0


def test_reader_counts_the_audio_outside_the_clips(tmp_path):
    audio = np.full(75 * SR, 0.1, np.float32)
    path = tmp_path / "a.wav"
    soundfile.write(path, audio, SR)
    reader = WindowReader(str(path), W, clip_timestamps=(10.0, 50.0, 70.0))
    cuts = _read_all(reader)
    assert [(start / SR, len(samples) / SR) for start, samples, _ in cuts] == [(10, 30), (40, 10), (70, 5)]
    assert reader.position == 75 * SR and reader.covered == 45 * SR and reader.skipped == 30 * SR


class _LoudFramesAreSpeech:
    """Stands in for Silero: a frame is speech (probability 1) where its samples are loud."""

    @staticmethod
    def iter_probabilities(blocks):
        for block in blocks:
            frames = np.pad(block, (0, -len(block) % FRAME_SAMPLES)).reshape(-1, FRAME_SAMPLES)
            yield (np.abs(frames).max(axis=1) > 0.25).astype(np.float32)


def test_reader_packs_speech_inside_the_clips(monkeypatch):
    frames = [(64, 250), (625, 940), (1560, 2810)]  # speech at about 2-8 s, 20-30 s and 50-90 s
    audio = np.zeros(3125 * FRAME_SAMPLES, np.float32)
    for first, last in frames:
        audio[first * FRAME_SAMPLES:last * FRAME_SAMPLES] = 0.5
    monkeypatch.setattr(vad_stream, "load_silero_vad", lambda: _LoudFramesAreSpeech)
    vad = VadOptions(speech_pad_ms=0, min_silence_duration_ms=0)  # regions are exactly the loud frames
    reader = WindowReader((audio, SR), W, clip_timestamps=(5.0, 25.0, 60.0), vad=vad)
    cuts = _read_all(reader)
    regions = [(first * FRAME_SAMPLES, last * FRAME_SAMPLES) for first, last in frames]
    inside = intersect_regions(regions, [(5 * SR, 25 * SR), (60 * SR, len(audio))])
    expected = pack_regions(inside, W)  # 5-8 s with 20-25 s in one window, then 60-90 s
    assert [time_map.regions for _, _, time_map in cuts] == expected and len(expected) == 2
    assert [start for start, _, _ in cuts] == [5 * SR, 60 * SR]
    assert cuts[0][2].to_original(4.0) == 21.0
    for (_, samples, _), group in zip(cuts, expected):
        np.testing.assert_array_equal(samples, np.concatenate([audio[start:end] for start, end in group]))
    covered = sum(end - start for start, end in inside)
    assert reader.position == len(audio) and reader.skipped == len(audio) - covered


def test_options_carry_the_vad_settings():
    options = TranscriptionOptions(vad_filter=True, vad_parameters={"min_silence_duration_ms": 500})
    assert options.vad_parameters == VadOptions(min_silence_duration_ms=500)
    assert TranscriptionOptions().vad_parameters == VadOptions() and TranscriptionOptions().vad_filter is None
    assert options.to_dict()["vad_parameters"]["min_silence_duration_ms"] == 500
    with pytest.raises(ValueError, match="unknown vad_parameters"):
        TranscriptionOptions(vad_parameters={"treshold": 0.3})  # checked with VAD off too
    with pytest.raises(ValueError, match="vad_filter must be None .* True or False"):
        TranscriptionOptions(vad_filter="yes")
    with pytest.raises(TypeError, match="vad_parameters must be a dict or VadOptions"):
        TranscriptionOptions(vad_parameters=[0.5])


def test_cli_flags_make_one_options_object():
    parser = transcribe_cli.configure_parser(argparse.ArgumentParser())
    args = parser.parse_args(["folder", "--recursive", "--vad-filter", "--vad-min-silence-ms", "500",
                              "--temperature", "0,0.4", "--clip-timestamps", "0,60", "--initial-prompt", "Names.",
                              "--condition-on-previous-text", "--beam-width", "2", "--quiet"])
    options = transcribe_cli.options_from_args(args)
    assert options.vad_filter and options.vad_parameters.min_silence_duration_ms == 500
    assert options.temperature == (0.0, 0.4) and options.clip_timestamps == (0.0, 60.0)
    assert options.initial_prompt == "Names." and options.condition_on_previous_text and options.beam_width == 2
    assert args.recursive and not options.use_tqdm
