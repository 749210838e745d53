"""Audio input for speech models (Whisper): loading/resampling, streaming windows and log-mel features.

CPU-only dependencies: soundfile (decode WAV/FLAC/OGG...), PyAV (FFmpeg: MP3, m4a/aac, opus, webm, mp4/mkv audio,
...), soxr (resample), torch.stft (features). torchaudio is deliberately not used (its PyPI wheel is a CUDA build
that fails on CPU torch).
"""

from .base import SAMPLE_RATE, AudioError
from .features import (CHUNK_LENGTH, CPU_MICRO_BATCH, HOP_LENGTH, N_FFT, N_FRAMES, N_SAMPLES, encoder_window_samples,
                       log_mel_spectrogram, log_mel_spectrogram_batch, mel_filter_bank, num_frames, pad_or_trim)
from .loading import is_silent, load_audio, resample, split_into_windows
from .stream import iter_windows

__all__ = [
    "AudioError", "SAMPLE_RATE", "N_FFT", "HOP_LENGTH", "CHUNK_LENGTH", "CPU_MICRO_BATCH", "N_SAMPLES", "N_FRAMES",
    "load_audio", "iter_windows", "resample", "is_silent", "split_into_windows", "mel_filter_bank", "pad_or_trim",
    "log_mel_spectrogram", "log_mel_spectrogram_batch", "num_frames", "encoder_window_samples",
]
