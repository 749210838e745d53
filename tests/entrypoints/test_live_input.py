"""The audio of `transcribe - --live` read from a real pipe: containers recognised by their first bytes and decoded
by FFmpeg as they arrive (the same samples as decoding the file), raw s16le otherwise, errors handed to the reader."""
import os
import queue
import threading
import time

import numpy as np
import pytest
import soundfile as sf
from av_media import encode, speech_clip

from seq2seq_engine.audio import AudioError
from seq2seq_engine.audio.av_decode import decode_av
from seq2seq_engine.entrypoints.live_input import END, looks_like_container, read_blocks

STREAMABLE = ["ogg", "webm", "mp3", "flac"]  # containers FFmpeg reads front to back (m4a/mp4 need their index)


def _wav(path, samples):
    sf.write(str(path), samples, 16000, subtype="PCM_16")
    return str(path)


def _pipe_reader(data, close=True):
    """The read end of an OS pipe, with `data` written by a thread (then closed, unless `close` is False)."""
    read_fd, write_fd = os.pipe()

    def write():
        with os.fdopen(write_fd, "wb", buffering=0) if close else open(os.dup(write_fd), "wb", buffering=0) as pipe:
            pipe.write(data)

    threading.Thread(target=write, daemon=True).start()
    return os.fdopen(read_fd, "rb", buffering=0), write_fd


def _drain(blocks, timeout=60):
    out = []
    while True:
        item = blocks.get(timeout=timeout)
        if item is END:
            return np.concatenate(out) if out else np.zeros(0, np.float32)
        if isinstance(item, Exception):
            raise item
        out.append(item)


def _read_all(data, input_format="auto", sample_rate=None):
    pipe, _ = _pipe_reader(data)
    blocks = queue.Queue()
    read_blocks(pipe, input_format, sample_rate, blocks)
    return _drain(blocks)


@pytest.fixture(scope="module")
def clip():
    return speech_clip()[1][:3 * 16000]


@pytest.mark.parametrize("name", ["wav", "m4a"] + STREAMABLE)
def test_container_signatures_are_recognised_and_raw_speech_is_not(tmp_path, clip, name):
    path = _wav(tmp_path / "a.wav", clip) if name == "wav" else encode(tmp_path / f"a.{name}", clip, 16000, name)
    with open(path, "rb") as handle:
        assert looks_like_container(handle.read(12))
    raw = (clip * 32767).astype("<i2").tobytes()
    assert not looks_like_container(raw[:12]) and not looks_like_container(b"") and not looks_like_container(b"\0")


@pytest.mark.parametrize("name", STREAMABLE)
def test_a_piped_container_decodes_to_the_files_samples(tmp_path, clip, name):
    path = encode(tmp_path / f"a.{name}", clip, 16000, name)
    with open(path, "rb") as handle:
        samples = _read_all(handle.read())
    expected = decode_av(path, "file")
    # read from a pipe an mp3's end padding is not trimmed (the gapless info needs a seekable file): under 0.1 s more
    assert 0 <= len(samples) - len(expected) <= 1600
    np.testing.assert_allclose(samples[:len(expected)], expected, atol=1e-6)


def test_a_piped_wav_and_raw_s16le_give_the_same_samples(tmp_path, clip):
    path = _wav(tmp_path / "a.wav", clip)
    with open(path, "rb") as handle:
        from_wav = _read_all(handle.read())
    raw = sf.read(path, dtype="int16")[0].astype("<i2").tobytes()  # the wav's own samples
    from_raw = _read_all(raw)
    np.testing.assert_array_equal(from_wav, np.frombuffer(raw, "<i2").astype(np.float32) / 32768)
    np.testing.assert_array_equal(from_raw, from_wav)
    assert len(_read_all(raw, "s16le", 24000)) == pytest.approx(len(raw) // 2 * 2 / 3, abs=2)  # resampled


def test_the_first_audio_of_a_container_arrives_before_the_stream_ends(tmp_path, clip):
    path = encode(tmp_path / "a.ogg", np.tile(clip, 2), 16000, "ogg")
    with open(path, "rb") as handle:
        data = handle.read()
    pipe, write_fd = _pipe_reader(data[:len(data) // 2], close=False)  # half the stream, the pipe kept open
    blocks = queue.Queue()
    threading.Thread(target=read_blocks, args=(pipe, "auto", None, blocks), daemon=True).start()
    got, deadline = 0, time.monotonic() + 30
    while got < 16000 and time.monotonic() < deadline:
        try:
            block = blocks.get(timeout=1)
        except queue.Empty:
            continue
        assert isinstance(block, np.ndarray), block  # neither the end nor an error: the pipe is still open
        got += len(block)
    assert got >= 16000  # at least a second of the three sent, while the writer still holds the pipe
    os.close(write_fd)


def test_a_stream_ffmpeg_cannot_read_is_an_audio_error_on_the_queue():
    with pytest.raises(AudioError, match="<stdin>.*cannot decode"):
        _read_all(b"not audio at all " * 200, "container")
