"""Audio in any container/codec (seq2seq_engine/audio/av_decode.py via PyAV, loading.py's fallback): files of each
format encoded on the fly with PyAV decode to the source signal (duration, correlation at lag 0), stereo is averaged,
bytes and file objects decode like the path, and undecodable files (not audio, no audio stream, truncated) raise an
AudioError naming the file and the problem."""
import io

import numpy as np
import pytest
import soxr
from av_media import FORMATS, encode, tone, video_only

from seq2seq_engine.audio import AudioError, load_audio
from seq2seq_engine.audio.loading import open_soundfile
from seq2seq_engine.audio.stream import iter_windows, samples_hint

pytest.importorskip("av")

SOURCE_RATE = 22050
SECONDS = 3.0


@pytest.fixture(scope="module")
def source():
    """The 22.05 kHz source signal and its 16 kHz reference (soxr HQ, as the wav path resamples)."""
    signal = tone(SECONDS, SOURCE_RATE)
    return signal, soxr.resample(signal, SOURCE_RATE, 16000, quality="HQ")


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_each_format_decodes_to_the_source(tmp_path, source, name):
    signal, reference = source
    path = encode(tmp_path / f"clip.{name}", signal, SOURCE_RATE, name)
    audio = load_audio(path)
    assert audio.dtype == np.float32 and audio.ndim == 1
    # AAC adds up to a frame of padding at the end (1024 samples at 22.05 kHz = 0.046 s)
    assert SECONDS - 0.005 <= len(audio) / 16000 <= SECONDS + 0.05
    n = len(reference) - 800  # leave out the codecs' start/end transients
    assert np.corrcoef(audio[800:n], reference[800:n])[0, 1] > 0.999
    assert abs(np.abs(audio[800:n]).max() - np.abs(reference[800:n]).max()) < 0.05
    np.testing.assert_array_equal(np.concatenate(list(iter_windows(path, 16000))), audio)
    assert abs(samples_hint(path) - len(audio)) <= 0.05 * 16000  # from the container's header


@pytest.mark.parametrize("name", ["m4a", "ogg", "flac"])
def test_stereo_is_the_mean_of_the_channels(tmp_path, name):
    left = tone(2.0, SOURCE_RATE, amplitude=0.6)
    path = encode(tmp_path / f"stereo.{name}", np.stack([left, left / 3], axis=1), SOURCE_RATE, name)
    audio = load_audio(path)
    # mean of 0.6 and 0.2 peaks is 0.4 (FFmpeg's own mono downmix would give 0.8 / sqrt(2) = 0.57)
    assert abs(np.abs(audio[4000:-4000]).max() - 0.4) < 0.02


@pytest.mark.parametrize("name", ["m4a", "webm", "mp3"])
def test_bytes_and_file_objects_decode_like_the_path(tmp_path, source, name):
    path = encode(tmp_path / f"clip.{name}", source[0], SOURCE_RATE, name)
    audio = load_audio(path)
    with open(path, "rb") as handle:
        data = handle.read()
    np.testing.assert_array_equal(load_audio(data), audio)
    np.testing.assert_array_equal(load_audio(io.BytesIO(data)), audio)
    np.testing.assert_array_equal(np.concatenate(list(iter_windows(data, 7000))), audio)


def test_mp3_is_decoded_by_ffmpeg_not_libsndfile(tmp_path, source):
    # libsndfile reads MP3 too, but its samples depend on the size of its reads, so the stream could not equal the
    # whole file: MP3 always goes to FFmpeg, for paths and bytes alike.
    path = encode(tmp_path / "clip.mp3", source[0], SOURCE_RATE, "mp3")
    with open(path, "rb") as handle:
        data = handle.read()
    assert open_soundfile(path, path) is None and open_soundfile(data, "<bytes>") is None
    wav = tmp_path / "clip.wav"
    import soundfile
    soundfile.write(wav, source[0], SOURCE_RATE)
    handle = open_soundfile(str(wav), str(wav))
    assert handle is not None and handle.format == "WAV"
    handle.close()


def test_not_audio_and_no_audio_stream(tmp_path):
    text = tmp_path / "notes.m4a"
    text.write_text("this is not audio at all\n" * 50)
    with pytest.raises(AudioError, match=r"notes\.m4a: cannot decode audio file"):
        load_audio(text)
    with pytest.raises(AudioError, match=r"notes\.m4a: cannot decode audio file"):
        next(iter_windows(str(text), 16000))
    movie = video_only(tmp_path / "silent_movie.mp4")
    with pytest.raises(AudioError, match=r"silent_movie\.mp4: no audio stream in the file \(it has video streams\)"):
        load_audio(movie)
    with pytest.raises(AudioError, match="cannot decode audio file: it is empty"):
        load_audio(b"")


def test_truncated_files(tmp_path):
    signal = tone(8.0, SOURCE_RATE)
    m4a = encode(tmp_path / "whole.m4a", signal, SOURCE_RATE, "m4a")
    with open(m4a, "rb") as handle:
        data = handle.read()
    cut = tmp_path / "cut.m4a"  # the index (moov) is written at the end: the cut file cannot be opened
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(AudioError, match=r"cut\.m4a: cannot decode audio file"):
        load_audio(cut)
    mp3 = encode(tmp_path / "whole.mp3", signal, SOURCE_RATE, "mp3")
    with open(mp3, "rb") as handle:
        data = handle.read()
    half = tmp_path / "half.mp3"  # the header declares 8 s (LAME's Xing frame); only about 4 s remain
    half.write_bytes(data[:len(data) // 2])
    with pytest.raises(AudioError, match=r"half\.mp3: audio file is truncated: decoded 3\.\d+ s of the 8\.\d+ s"):
        load_audio(half)
    windows = iter_windows(str(half), 16000)  # streamed: the windows before the end come first, then the error
    assert len(next(windows)) == 16000
    with pytest.raises(AudioError, match="truncated"):
        list(windows)
    header_only = tmp_path / "header.mp3"
    header_only.write_bytes(data[:100])
    with pytest.raises(AudioError, match=r"header\.mp3: "):
        load_audio(header_only)


@pytest.mark.parametrize("layout, channels", [("mono", 1), ("stereo", 2), ("2.1", 3), ("5.1", 6)])
def test_a_frames_channel_mean_equals_numpys_mean_of_its_planes(layout, channels):
    """av_decode._mono reads the planes directly: bitwise what to_ndarray().mean(axis=0) gives, and its own copy."""
    import av

    from seq2seq_engine.audio.av_decode import _mono
    planes = np.random.default_rng(channels).standard_normal((channels, 1151)).astype(np.float32)
    frame = av.AudioFrame.from_ndarray(planes, format="fltp", layout=layout)
    mono = _mono(frame)
    expected = frame.to_ndarray().mean(axis=0, dtype=np.float32)
    assert mono.dtype == np.float32 and mono.shape == (1151,) and np.array_equal(mono, expected)
    assert not np.shares_memory(mono, np.frombuffer(frame.planes[0], dtype=np.float32))
