"""Tests for seq2seq_engine.audio loading: formats, resampling to 16 kHz mono, validation errors, silence and
30 s windows; the log-mel features: test_audio_features.py."""
from __future__ import annotations

import math

import numpy as np
import pytest
import soundfile as sf
import torch
from audio_signals import SR, peak_hz, sine

from seq2seq_engine.audio import (N_FRAMES, AudioError, is_silent, load_audio, log_mel_spectrogram_batch,
                                  split_into_windows)


# ---------------------------------------------------------------- loading
def test_load_wav_int16_stereo_44k_to_mono_16k(tmp_path):
    sr, dur = 44100, 2.5
    left = sine(440.0, dur, sr=sr, amp=0.6)
    right = sine(440.0, dur, sr=sr, amp=0.2)
    path = tmp_path / "stereo.wav"
    sf.write(path, np.stack([left, right], axis=1), sr, subtype="PCM_16")
    assert sf.info(str(path)).channels == 2

    audio = load_audio(path)
    assert audio.dtype == np.float32 and audio.ndim == 1 and audio.flags["C_CONTIGUOUS"]
    n_in = int(round(dur * sr))
    assert len(audio) == math.ceil(n_in * SR / sr)
    assert abs(len(audio) - dur * SR) <= 1
    assert abs(peak_hz(audio) - 440.0) < 1.0
    # mono mean of 0.6 and 0.2 amplitude -> 0.4, HQ resampling keeps the level
    mid = audio[SR // 2:-SR // 2]
    assert abs(np.abs(mid).max() - 0.4) < 0.01
    assert np.abs(audio).max() <= 1.0
    # same output as transformers' soundfile+soxr loader
    from transformers.audio_utils import load_audio as hf_load_audio

    ref = hf_load_audio(str(path), sampling_rate=SR, backend="soundfile")
    np.testing.assert_allclose(audio, ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("fmt,subtype", [("FLAC", "PCM_16"), ("OGG", "VORBIS"), ("WAV", "FLOAT")])
def test_load_flac_ogg_float_wav(tmp_path, fmt, subtype):
    sr = 22050
    x = sine(440.0, 1.5, sr=sr)
    path = tmp_path / f"clip.{fmt.lower()}"
    sf.write(path, x, sr, format=fmt, subtype=subtype)
    audio = load_audio(str(path))
    assert audio.dtype == np.float32
    assert abs(len(audio) - 1.5 * SR) <= 1
    assert abs(peak_hz(audio) - 440.0) < 1.5
    assert not is_silent(audio)
    # bytes and file objects decode the same
    data = path.read_bytes()
    np.testing.assert_array_equal(load_audio(data), audio)
    with open(path, "rb") as f:
        np.testing.assert_array_equal(load_audio(f), audio)


def test_load_arrays_and_tuples():
    x = sine(300.0, 1.0)
    out = load_audio(x)
    np.testing.assert_array_equal(out, x)
    np.testing.assert_allclose(load_audio(x.astype(np.float64)), x, atol=1e-7)
    np.testing.assert_allclose(load_audio(torch.from_numpy(x)), x)
    np.testing.assert_allclose(load_audio(list(x[:100])), x[:100])

    pcm16 = np.round(x * 32767).astype(np.int16)
    np.testing.assert_allclose(load_audio(pcm16), x, atol=1e-4)
    pcm32 = np.round(x.astype(np.float64) * (2**31 - 1)).astype(np.int32)
    np.testing.assert_allclose(load_audio(pcm32), x, atol=1e-6)
    assert load_audio(np.array([-32768, 32767], np.int16)).min() == -1.0

    # stereo in either layout -> mean
    st = np.stack([x, np.zeros_like(x)])
    np.testing.assert_allclose(load_audio(st), x / 2, atol=1e-7)  # (channels, frames)
    np.testing.assert_allclose(load_audio(st.T), x / 2, atol=1e-7)  # (frames, channels)
    np.testing.assert_allclose(load_audio(st.T, channels_first=False), x / 2, atol=1e-7)

    # (array, sr) tuple resamples
    x8 = sine(440.0, 2.0, sr=8000)
    up = load_audio((x8, 8000))
    assert len(up) == 2 * SR and abs(peak_hz(up) - 440.0) < 1.0
    x48 = sine(440.0, 2.0, sr=48000)
    down = load_audio((x48, 48000))
    assert len(down) == 2 * SR and abs(peak_hz(down) - 440.0) < 1.0
    assert len(load_audio((x, 16000))) == len(x)
    # custom target rate
    assert len(load_audio((x, 16000), target_sr=8000)) == len(x) // 2


def test_silence_is_not_an_error():
    z = load_audio(np.zeros(SR, np.float32))
    assert is_silent(z)
    assert is_silent(1e-5 * np.random.default_rng(0).standard_normal(SR))
    assert not is_silent(sine(440.0, 0.5, amp=0.1))
    assert is_silent(np.zeros(0))
    assert not is_silent(torch.from_numpy(sine(440.0, 0.5)))


# ---------------------------------------------------------------- errors
def test_error_text_file_renamed_wav(tmp_path):
    p = tmp_path / "notes.wav"
    p.write_text("this is not audio at all\n" * 20)
    with pytest.raises(AudioError, match=r"notes\.wav: cannot decode audio file"):
        load_audio(p)


def test_error_truncated_and_empty_files(tmp_path):
    good = tmp_path / "good.wav"
    sf.write(good, sine(440.0, 0.5), SR, subtype="PCM_16")
    bad = tmp_path / "truncated.wav"
    bad.write_bytes(good.read_bytes()[:20])
    with pytest.raises(AudioError, match=r"truncated\.wav: cannot decode"):
        load_audio(bad)
    empty = tmp_path / "zero_bytes.flac"
    empty.write_bytes(b"")
    with pytest.raises(AudioError, match=r"zero_bytes\.flac: cannot decode"):
        load_audio(empty)
    no_frames = tmp_path / "no_frames.wav"
    sf.write(no_frames, np.zeros(0, np.float32), SR)
    with pytest.raises(AudioError, match=r"no_frames\.wav: audio file contains no samples"):
        load_audio(no_frames)
    with pytest.raises(AudioError, match="cannot decode"):
        load_audio(b"RIFF garbage bytes")


def test_error_missing_file_and_directory(tmp_path):
    with pytest.raises(AudioError, match=r"does_not_exist\.wav: file not found"):
        load_audio(tmp_path / "does_not_exist.wav")
    with pytest.raises(AudioError, match="is a directory"):
        load_audio(str(tmp_path))


def test_error_nan_in_file(tmp_path):
    x = sine(440.0, 0.2)
    x[100] = np.nan
    p = tmp_path / "nan.wav"
    sf.write(p, x, SR, subtype="FLOAT")
    with pytest.raises(AudioError, match=r"nan\.wav: 1 of \d+ samples are NaN"):
        load_audio(p)


@pytest.mark.parametrize(
    "arr,match",
    [
        (np.zeros(0, np.float32), "empty"),
        (np.zeros((0, 2), np.float32), "empty"),
        (np.full(1000, np.nan, np.float32), "1000 of 1000 samples are NaN"),
        (np.array([0.0, np.nan, 0.5], np.float64), "1 of 3 samples are NaN"),
        (np.array([0.0, np.inf, 0.5], np.float32), "infinite"),
        (np.zeros(100, np.complex64), "unsupported dtype complex64"),
        (np.array([0.1, "x"], dtype=object), "unsupported dtype object"),
        (np.array(["a", "b"]), "unsupported dtype <U1"),
        (np.zeros(10, bool), "unsupported dtype bool"),
        (np.zeros(10, np.int64), "unsupported integer dtype int64"),
        (np.zeros((2, 3, 4), np.float32), "3-D"),
    ],
)
def test_error_bad_arrays(arr, match):
    with pytest.raises(AudioError, match=match):
        load_audio(arr)


def test_error_bad_tuples():
    x = sine(440.0, 0.1)
    with pytest.raises(AudioError, match="sample rate must be a positive integer"):
        load_audio((x, 0))
    with pytest.raises(AudioError, match="sample rate must be a positive integer"):
        load_audio((x, 16000.5))
    with pytest.raises(AudioError, match="expected \\(array, sample_rate\\)"):
        load_audio((x, 16000, 1))
    with pytest.raises(AudioError, match="NaN"):
        load_audio((np.array([np.nan] * 10, np.float32), 8000))
    assert issubclass(AudioError, ValueError)


# ---------------------------------------------------------------- windows
def test_split_into_windows():
    x = np.arange(75 * SR, dtype=np.float32)
    wins = split_into_windows(x)
    assert [s for s, _ in wins] == [0, 30 * SR, 60 * SR]
    assert [len(c) for _, c in wins] == [30 * SR, 30 * SR, 15 * SR]
    np.testing.assert_array_equal(np.concatenate([c for _, c in wins]), x)
    for start, chunk in wins:
        assert chunk[0] == x[start]

    assert [(s, len(c)) for s, c in split_into_windows(x[: 10 * SR])] == [(0, 10 * SR)]
    assert [(s, len(c)) for s, c in split_into_windows(x[: 60 * SR])] == [(0, 30 * SR), (30 * SR, 30 * SR)]
    assert split_into_windows(x[:0]) == []
    over = split_into_windows(x[: 50 * SR], window_s=30.0, stride_s=20.0)
    assert [(s, len(c)) for s, c in over] == [(0, 30 * SR), (20 * SR, 30 * SR)]
    feats = log_mel_spectrogram_batch([c for _, c in wins])
    assert tuple(feats.shape) == (3, 80, N_FRAMES)
    with pytest.raises(ValueError):
        split_into_windows(x, window_s=0)


@pytest.mark.parametrize("gain", [1.5, 32768.0, 1e6])
def test_float_samples_above_full_scale_are_scaled_to_a_peak_of_one(gain, caplog):
    x = sine(440.0, 0.5, amp=0.9)
    with caplog.at_level("WARNING", logger="seq2seq_engine"):
        loaded = load_audio((x * gain).astype(np.float32))
    assert math.isclose(float(np.abs(loaded).max()), 1.0, rel_tol=1e-6)
    np.testing.assert_allclose(loaded, x / np.abs(x).max(), rtol=1e-5, atol=1e-6)
    assert "above full scale" in caplog.text


def test_float_samples_within_full_scale_are_untouched():
    x = (sine(300.0, 0.25) * 0.999).astype(np.float32)
    assert np.array_equal(load_audio(x), x)
