"""Streaming windows (seq2seq_engine/audio/stream.py: iter_windows): the windows of a file equal load_audio's whole
array exactly (libsndfile blocks + soxr stream, FFmpeg frames), arrays come back as views, and a 10-minute file is
never held whole: tracemalloc's peak while walking its windows stays under 2.5 windows (4.8 MB), against the 38 MB
of the whole 16 kHz signal."""
import tracemalloc

import numpy as np
import pytest
import soundfile as sf
from av_media import encode, speech_clip, tone

from seq2seq_engine.audio import AudioError, load_audio
from seq2seq_engine.audio.base import AudioTooLong
from seq2seq_engine.audio.stream import iter_windows, samples_hint

WINDOW = 480_000  # 30 s at 16 kHz
LONG_SECONDS = 600


@pytest.mark.parametrize("rate,channels,fmt,subtype", [(44100, 2, "WAV", "PCM_16"), (22050, 1, "FLAC", "PCM_16"),
                                                       (16000, 1, "WAV", "FLOAT"), (8000, 3, "WAV", "PCM_24"),
                                                       (48000, 1, "OGG", "VORBIS")])
def test_windows_equal_the_whole_file(tmp_path, rate, channels, fmt, subtype):
    noise = 0.3 * np.random.default_rng(rate).standard_normal((int(rate * 71.3), channels)).astype(np.float32)
    path = str(tmp_path / f"noise.{fmt.lower()}")
    with sf.SoundFile(path, "w", rate, channels, format=fmt, subtype=subtype) as handle:
        for start in range(0, len(noise), rate):  # block writes: libsndfile's Vorbis encoder crashes on one big write
            handle.write(noise[start:start + rate])
    whole = load_audio(path)
    windows = list(iter_windows(path, WINDOW))
    assert [len(w) for w in windows] == [WINDOW, WINDOW, len(whole) - 2 * WINDOW]
    np.testing.assert_array_equal(np.concatenate(windows), whole)  # bit for bit: same numerics as the one-shot path
    assert all(w.dtype == np.float32 and w.flags["C_CONTIGUOUS"] for w in windows)
    assert samples_hint(path) == len(whole)


def test_arrays_and_tuples_come_back_as_views_or_resampled():
    x = tone(65.0, 16000)
    windows = list(iter_windows(x, WINDOW))
    assert [len(w) for w in windows] == [WINDOW, WINDOW, len(x) - 2 * WINDOW]
    assert all(np.shares_memory(w, x) for w in windows)
    resampled = list(iter_windows((x[::2], 8000), WINDOW))
    np.testing.assert_array_equal(np.concatenate(resampled), load_audio((x[::2], 8000)))
    with pytest.raises(AudioError, match="empty"):
        next(iter_windows(np.zeros(0, np.float32), WINDOW))
    with pytest.raises(ValueError, match="window_samples"):
        next(iter_windows(x, 0))


def _peak_while_walking(path):
    """(window lengths, tracemalloc peak in bytes) while taking the windows one at a time and dropping each."""
    lengths = []
    tracemalloc.start()
    try:
        for window in iter_windows(path, WINDOW):
            lengths.append(len(window))
            del window
        return lengths, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture(scope="module")
def long_wav(tmp_path_factory):
    """A 10-minute 44.1 kHz stereo PCM_16 wav, written block by block (never whole in memory)."""
    path = str(tmp_path_factory.mktemp("long") / "ten_minutes.wav")
    block = tone(10.0, 44100)
    with sf.SoundFile(path, "w", 44100, 2, subtype="PCM_16") as handle:
        for _ in range(LONG_SECONDS // 10):
            handle.write(np.stack([block, block / 2], axis=1))
    return path


@pytest.fixture(scope="module")
def long_mp3(tmp_path_factory):
    """A 10-minute mp3: 30 s encoded once, its frames repeated 20 times (MP3 frames decode independently)."""
    folder = tmp_path_factory.mktemp("long_mp3")
    piece = encode(folder / "piece.mp3", tone(30.0, 16000), 16000, "mp3")
    with open(piece, "rb") as handle:
        data = handle.read()
    path = folder / "ten_minutes.mp3"
    path.write_bytes(data * (LONG_SECONDS // 30))
    return str(path)


@pytest.mark.parametrize("which", ["long_wav", "long_mp3"])
def test_a_long_file_is_never_whole_in_memory(which, request):
    path = request.getfixturevalue(which)
    whole_bytes = LONG_SECONDS * 16000 * 4  # 38.4 MB as one float32 array
    lengths, peak = _peak_while_walking(path)
    assert all(n == WINDOW for n in lengths[:-1]) and 0 < lengths[-1] <= WINDOW
    # the repeated mp3 pieces each bring their encoder delay and padding (a few hundredths of a second)
    assert abs(sum(lengths) - LONG_SECONDS * 16000) < 2 * 16000
    # a window is 1.92 MB: the stream holds the one being filled plus a libsndfile block or FFmpeg frames (3.1 MB
    # measured), never the 38.4 MB of the whole
    assert peak < 2.5 * WINDOW * 4, f"peak {peak / 1e6:.1f} MB while streaming"
    tracemalloc.start()
    try:
        load_audio(path)
        whole_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert whole_peak > whole_bytes  # what loading it whole costs, for contrast


def _taken_before_error(windows) -> int:
    taken = 0
    with pytest.raises(AudioTooLong, match="longer than max_audio_seconds"):
        for window in windows:
            taken += len(window)
    return taken


def test_max_seconds_stops_the_decoder_at_the_limit():
    from silent_media import silent_file, silent_wav
    undeclared = silent_file(LONG_SECONDS, "webm", declare_duration=False)
    taken = _taken_before_error(iter_windows(undeclared, WINDOW, max_seconds=70))
    assert taken <= 70 * 16000  # only whole windows within the limit came out; the decoder stopped just past it
    for declared in (silent_file(LONG_SECONDS), silent_wav(LONG_SECONDS)):  # refused from the header, on opening
        assert _taken_before_error(iter_windows(declared, WINDOW, max_seconds=70)) == 0
    assert _taken_before_error(iter_windows(np.zeros(71 * 16000, np.float32), WINDOW, max_seconds=70)) == 0
    assert sum(map(len, iter_windows(undeclared, WINDOW, max_seconds=LONG_SECONDS))) == LONG_SECONDS * 16000


def test_vad_reads_a_long_file_as_one_stream_never_whole():
    """The one pass that feeds the VAD and the speech windows (transcription/input/vad_stream.py) holds a Silero block
    (131 s, 8 MB) and a window at most, not the 20-minute signal (77 MB); over the limit, it stops there; the windows
    are those of the whole signal."""
    from silent_media import silent_file

    from seq2seq_engine.audio.vad import VadOptions
    from seq2seq_engine.transcription.input.window_source import WindowReader
    seconds = 2 * LONG_SECONDS
    data = silent_file(seconds)
    tracemalloc.start()
    try:
        reader = WindowReader(data, WINDOW, vad=VadOptions())
        while reader.next_window() is not None:
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reader.position == seconds * 16000 and peak < 32e6, peak
    with pytest.raises(AudioTooLong):
        WindowReader(data, WINDOW, vad=VadOptions(), max_seconds=60).next_window()
    path_audio = np.tile(load_audio(speech_clip()[0]), 40)[:150 * 16000]
    whole = WindowReader(path_audio, WINDOW, vad=VadOptions())  # speech: the windows as the one-pass reading cut them
    from seq2seq_engine.transcription.input.vad_windows import detect_speech_windows
    expected = detect_speech_windows(path_audio, VadOptions(), WINDOW)
    cuts = iter(whole.next_window, None)
    for window, (start, samples, time_map) in zip(expected, cuts, strict=True):
        assert start == window.time_map.start_sample and time_map.regions == window.time_map.regions
        np.testing.assert_array_equal(samples, window.samples)
