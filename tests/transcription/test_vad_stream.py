"""One decode for VAD and windows (transcription/input/vad_stream.py): the windows streamed from blocks equal the
windows packed from the whole recording's speech regions (vad_windows.speech_windows over audio/vad.py's regions),
for real speech (pytest-audioeval clips) joined by silence and noise, any block size, several VAD settings and
clips; and the audio held stays bounded by the regions, not by the recording's length."""
import glob
import os

import numpy as np
import pytest
from conftest import require_speech_clips

from seq2seq_engine.audio import SAMPLE_RATE, load_audio
from seq2seq_engine.audio.silero import FRAME_SAMPLES, load_silero_vad
from seq2seq_engine.audio.vad import VadOptions, regions_from_probabilities
from seq2seq_engine.transcription.input.vad_stream import VadWindowStream
from seq2seq_engine.transcription.input.vad_windows import intersect_regions, speech_windows, window_vad_options
from seq2seq_engine.transcription.input.window_source import clip_spans

pytestmark = pytest.mark.usefixtures("one_thread")
SR = SAMPLE_RATE
W = 30 * SR


@pytest.fixture(scope="module")
def recording():
    """About three minutes: real clips in a seeded order, between gaps of 0.05-6 s of silence or noise."""
    rng = np.random.default_rng(7)
    paths = sorted(glob.glob(os.path.join(require_speech_clips(), "*", "*.wav")))
    parts, total = [np.zeros(SR // 2, np.float32)], 0
    while total < 180 * SR:
        gap = int(rng.uniform(0.05, 6.0) * SR)
        parts.append((rng.standard_normal(gap) * rng.choice([0.0, 0.003, 0.02])).astype(np.float32))
        parts.append(load_audio(paths[rng.integers(len(paths))]))
        total += gap + len(parts[-1])
    return np.concatenate(parts)


def _blocks(audio, frames):
    size = frames * FRAME_SAMPLES
    return [audio[start:start + size] for start in range(0, len(audio), size)]


def _expected(audio, blocks, options, spans):
    regions = regions_from_probabilities(load_silero_vad().stream_probabilities(iter(blocks)), len(audio), options)
    if spans is not None:
        regions = intersect_regions(regions, [(start, len(audio) if end is None else end) for start, end in spans])
    return speech_windows(audio, regions, W)


def _assert_same(cuts, windows):
    assert len(cuts) == len(windows) > 0
    for (start, samples, time_map), window in zip(cuts, windows):
        assert time_map.regions == window.time_map.regions and start == window.time_map.start_sample
        np.testing.assert_array_equal(samples, window.samples)


@pytest.mark.parametrize("options", [
    VadOptions(),
    VadOptions(min_silence_duration_ms=2000),
    VadOptions(speech_pad_ms=0, min_silence_duration_ms=0),
    VadOptions(max_speech_duration_s=3.0, speech_pad_ms=100, min_speech_duration_ms=250),
    VadOptions(threshold=0.8, speech_pad_ms=1500, min_silence_duration_ms=500),
])
@pytest.mark.parametrize("frames", [4096, 311, 8])   # silero.BLOCK_FRAMES (the reader's), and smaller blocks
def test_streamed_windows_equal_the_whole_recordings_windows(recording, options, frames):
    options = window_vad_options(True, options, W)
    blocks = _blocks(recording, frames)
    _assert_same(list(VadWindowStream(iter(blocks), options, W)), _expected(recording, blocks, options, None))


@pytest.mark.parametrize("clips", [(5.0, 40.0, 70.0), (12.5, 13.5, 100.0, 101.25), (150.0,)])
def test_streamed_windows_inside_clips(recording, clips):
    options = window_vad_options(True, None, W)
    blocks = _blocks(recording, 500)
    spans = clip_spans(clips, None)
    _assert_same(list(VadWindowStream(iter(blocks), options, W, spans)), _expected(recording, blocks, options, spans))


def test_audio_held_is_bounded_by_the_regions_not_the_recording(recording):
    """Ten minutes of silence and faint noise around the speech: the buffer holds a few blocks and the region under
    way, not the minutes read."""
    quiet = (np.random.default_rng(1).standard_normal(300 * SR) * 0.002).astype(np.float32)
    audio = np.concatenate([quiet, recording[:60 * SR], quiet])
    options = window_vad_options(True, None, W)
    stream = VadWindowStream(iter(_blocks(audio, 64)), options, W)   # blocks of ~2 s
    cuts = list(stream)
    assert cuts and stream.buffer.end == len(audio)
    block = 64 * FRAME_SAMPLES
    bound = W + 2 * int(options.speech_pad_ms * SR / 1000) + 2 * block
    assert stream.buffer.peak <= bound, (stream.buffer.peak / SR, bound / SR)
    assert stream.buffer.peak < len(audio) / 10
