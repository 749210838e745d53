"""Tests for seq2seq_engine.audio.features: the mel filter bank and Whisper log-mel features against HF's
WhisperFeatureExtractor (single, batched, espeak-ng speech, CUDA); loading and windows: test_audio.py."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import soundfile as sf
import torch
from audio_signals import SR, signal

from seq2seq_engine.audio import (N_FRAMES, AudioError, is_silent, load_audio, log_mel_spectrogram,
                                  log_mel_spectrogram_batch, mel_filter_bank)


# ---------------------------------------------------------------- helpers
def make_speech_wav(text: str, path) -> None:
    """Synthesise ``text`` to a WAV file with espeak-ng (22.05 kHz mono int16)."""
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True, timeout=60)


_FE_CACHE: dict = {}


def hf_features(x, n_mels: int) -> np.ndarray:
    from transformers import WhisperFeatureExtractor

    if n_mels not in _FE_CACHE:
        _FE_CACHE[n_mels] = WhisperFeatureExtractor(feature_size=n_mels)
    return _FE_CACHE[n_mels](x, sampling_rate=SR, return_tensors="np").input_features


# ---------------------------------------------------------------- features
@pytest.mark.parametrize("n_mels", [80, 128])
@pytest.mark.parametrize("fmax", [8000.0, 7600.0])
def test_mel_filter_bank_matches_transformers(n_mels, fmax):
    """Computed by the package (no transformers at run time), bit for bit transformers' filterbank."""
    from transformers.audio_utils import mel_filter_bank as hf_mel_filter_bank

    ref = hf_mel_filter_bank(201, n_mels, 0.0, fmax, SR, norm="slaney", mel_scale="slaney")
    ours = mel_filter_bank(n_mels, fmax=fmax)
    assert ours.shape == (201, n_mels)
    np.testing.assert_array_equal(ours, ref)
    ours[:] = 0  # callers get a copy: the cached filterbank is unchanged
    np.testing.assert_array_equal(mel_filter_bank(n_mels, fmax=fmax), ref)


@pytest.mark.parametrize("n_mels", [80, 128])
@pytest.mark.parametrize("kind", ["noise", "sweep", "short", "long", "silence"])
def test_log_mel_matches_whisper_feature_extractor(kind, n_mels):
    x = signal(kind)
    ref = hf_features(x, n_mels)[0]
    got = log_mel_spectrogram(x, n_mels=n_mels)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    assert tuple(got.shape) == (n_mels, N_FRAMES) == ref.shape
    assert float(np.abs(got.numpy() - ref).max()) <= 1e-4
    # the clamp to max - 8 and the (x + 4) / 4 scaling are applied
    assert float(got.max() - got.min()) <= 2.0 + 1e-6


def test_log_mel_accepts_float64_and_torch_and_int16():
    x = signal("short")
    ref = log_mel_spectrogram(x)
    torch.testing.assert_close(log_mel_spectrogram(x.astype(np.float64)), ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(log_mel_spectrogram(torch.from_numpy(x)), ref, rtol=0, atol=0)
    pcm = np.round(x * 32767).astype(np.int16)
    from_int = log_mel_spectrogram(pcm)
    torch.testing.assert_close(from_int, log_mel_spectrogram(pcm.astype(np.float32) / 32768), rtol=0, atol=1e-6)


def test_log_mel_without_padding():
    x = signal("short")
    out = log_mel_spectrogram(x, n_samples=None)
    assert tuple(out.shape) == (80, len(x) // 160)


def test_log_mel_rejects_bad_input():
    with pytest.raises(AudioError, match="1-D"):
        log_mel_spectrogram(np.zeros((2, 16000), np.float32))
    with pytest.raises(AudioError, match="NaN"):
        log_mel_spectrogram(np.full(16000, np.nan, np.float32))
    with pytest.raises(AudioError, match="dtype"):
        log_mel_spectrogram(np.zeros(16000, np.complex64))
    with pytest.raises(AudioError, match="empty"):
        log_mel_spectrogram(np.zeros(0, np.float32))


@pytest.mark.parametrize("n_mels", [80, 128])
def test_batched_equals_unbatched_and_hf_batch(n_mels):
    items = [signal(k) for k in ("noise", "sweep", "short", "long", "silence")]
    batch = log_mel_spectrogram_batch(items, n_mels=n_mels)
    assert tuple(batch.shape) == (len(items), n_mels, N_FRAMES)
    for i, x in enumerate(items):
        single = log_mel_spectrogram(x, n_mels=n_mels)
        assert float((batch[i] - single).abs().max()) <= 1e-5
    ref = hf_features(items, n_mels)
    assert float(np.abs(batch.numpy() - ref).max()) <= 1e-4
    # one STFT over the whole batch, or one per item, gives the same result
    for mb in (1, 3, len(items)):
        other = log_mel_spectrogram_batch(items, n_mels=n_mels, micro_batch=mb)
        assert float((other - batch).abs().max()) <= 1e-5
    # a 2-D array is a batch too
    stacked = np.stack([signal("noise"), signal("sweep")])
    torch.testing.assert_close(log_mel_spectrogram_batch(stacked, n_mels=n_mels), batch[:2], rtol=0, atol=1e-5)
    assert tuple(log_mel_spectrogram_batch([], n_mels=n_mels).shape) == (0, n_mels, N_FRAMES)


# ---------------------------------------------------------------- real speech
@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed")
def test_espeak_speech_loads_and_is_not_silent(tmp_path):
    path = tmp_path / "hello.wav"
    make_speech_wav("hello world", path)
    info = sf.info(str(path))
    audio = load_audio(path)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(len(audio) - info.frames * SR / info.samplerate) <= 1
    assert 0.3 * SR < len(audio) < 5 * SR
    assert not is_silent(audio)
    assert np.abs(audio).max() <= 1.0
    feats = log_mel_spectrogram(audio)
    assert torch.isfinite(feats).all()
    ref = hf_features(audio, 80)[0]
    assert float(np.abs(feats.numpy() - ref).max()) <= 1e-4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_log_mel_on_cuda_matches_cpu():
    items = [signal("noise"), signal("short")]
    cpu = log_mel_spectrogram_batch(items)
    gpu = log_mel_spectrogram_batch(items, device="cuda")
    assert gpu.device.type == "cuda"
    assert float((gpu.cpu() - cpu).abs().max()) <= 1e-4
    single = log_mel_spectrogram(torch.from_numpy(items[1]).cuda(), device="cuda")
    assert float((single.cpu() - cpu[1]).abs().max()) <= 1e-4
