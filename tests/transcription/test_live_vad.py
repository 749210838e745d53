"""The streaming Silero VAD fed real speech in chunks of random sizes gives the probabilities of the whole-signal
SileroVad and of the TorchScript module's own frame-by-frame loop; pcm16 decoding against int16 arithmetic and a
sampled sine (24 kHz input resampled to 16 kHz, whole and as a stream)."""
import os

import numpy as np
import pytest
import torch
from conftest import require_speech_clips

from seq2seq_engine.audio import load_audio
from seq2seq_engine.audio.silero import load_silero_vad
from seq2seq_engine.transcription.live.pcm import Pcm16Stream, decode_pcm16
from seq2seq_engine.transcription.live.vad_stream import StreamingVad

pytestmark = pytest.mark.usefixtures("one_thread")
SR = 16000


@pytest.fixture(scope="module")
def speech():
    folder = os.path.join(require_speech_clips(), "en")
    rng = np.random.default_rng(3)
    parts = []
    for name in ("hello_world.wav", "counting.wav", "quick_brown_fox.wav"):
        parts += [0.01 * rng.standard_normal(int(0.7 * SR)), load_audio(os.path.join(folder, name))]
    return np.concatenate(parts).astype(np.float32)


def chunked(vad, audio, rng, low=1, high=5000):
    out, pos = [], 0
    while pos < len(audio):
        size = int(rng.integers(low, high))
        out.append(vad.feed(audio[pos:pos + size]))
        pos += size
    return np.concatenate(out)


def test_chunked_probabilities_equal_the_whole_signal_ones(speech):
    whole = load_silero_vad().probabilities(speech)
    vad = StreamingVad()
    probs = chunked(vad, speech, np.random.default_rng(0))
    assert len(probs) == vad.frames_done == len(speech) // 512
    np.testing.assert_allclose(probs, whole[:len(probs)], atol=2e-5)
    assert probs.max() > 0.9 and probs.min() < 0.1  # real speech and real pauses
    vad.reset()  # a new stream: the same numbers again
    np.testing.assert_allclose(chunked(vad, speech, np.random.default_rng(1), 300, 1700), probs, atol=2e-5)


@torch.inference_mode()
def test_probabilities_equal_the_torchscript_frame_loop(speech):
    piece = speech[:160 * 512]
    module = load_silero_vad().module
    module.reset_states()
    expected = [float(module(torch.from_numpy(piece[k * 512:(k + 1) * 512].copy()), SR)) for k in range(160)]
    probs = chunked(StreamingVad(), piece, np.random.default_rng(2), 320, 1600)
    np.testing.assert_allclose(probs, expected, atol=2e-5)


def test_pcm16_at_16k_is_the_int16_value_over_32768():
    values = np.random.default_rng(4).integers(-32768, 32768, 999).astype("<i2")
    np.testing.assert_array_equal(decode_pcm16(values.tobytes(), 16000), values.astype(np.float32) / 32768)
    with pytest.raises(ValueError, match="whole 2-byte samples"):
        decode_pcm16(values.tobytes()[:-1], 16000)
    with pytest.raises(ValueError, match="sample_rate"):
        decode_pcm16(values.tobytes(), 44100)
    with pytest.raises(TypeError, match="bytes"):
        decode_pcm16("abc", 16000)


def test_pcm16_at_24k_becomes_the_same_sine_at_16k_whole_and_streamed():
    seconds, freq = 2.0, 437.0
    t24 = np.arange(int(seconds * 24000)) / 24000
    data = np.round(0.5 * np.sin(2 * np.pi * freq * t24) * 32767).astype("<i2").tobytes()
    expected = 0.5 * np.sin(2 * np.pi * freq * np.arange(int(seconds * SR)) / SR)
    whole = decode_pcm16(data, 24000)
    assert len(whole) == len(expected)
    inner = slice(800, -800)  # away from the resampler's edges
    np.testing.assert_allclose(whole[inner], expected[inner], atol=2e-3)
    stream, out, pos, rng = Pcm16Stream(24000), [], 0, np.random.default_rng(5)
    while pos < len(data):
        size = 2 * int(rng.integers(100, 2400))
        out.append(stream.decode(data[pos:pos + size]))
        pos += size
    out.append(stream.finish())
    streamed = np.concatenate(out)
    assert abs(len(streamed) - len(expected)) <= 2
    np.testing.assert_allclose(streamed[inner], expected[inner], atol=2e-3)
