"""The audio of `transcribe - --live`: a binary stream read as it arrives, raw s16le or any container FFmpeg decodes
(told apart by the container's signature in the first bytes, or named by --input-format), put on a queue as
float32 16 kHz blocks."""
from __future__ import annotations

import queue
from typing import Any, BinaryIO, Optional

from seq2seq_engine.transcription.live.pcm import Pcm16Stream

INPUT_FORMATS = ("auto", "s16le", "container")
READ_BYTES = 3200  # at most 100 ms of 16 kHz s16le per read
SNIFF_BYTES = 12
END = object()  # put on the queue after the last block
# Signatures of the containers auto detection recognises: (offset, bytes). Raw s16le has none; a raw stream starting
# with one of these byte strings is practically impossible (--input-format s16le forces raw all the same).
SIGNATURES = (
    (0, b"RIFF"), (0, b"RF64"), (0, b"OggS"), (0, b"fLaC"), (0, b"ID3"), (0, b"FORM"), (0, b"caff"),
    (0, b"\x1a\x45\xdf\xa3"), (4, b"ftyp"), (0, b"#!AMR"), (0, b"FLV"),
)
# MPEG audio frame syncs (MP3 layer III of MPEG 1, 2, 2.5; AAC in ADTS), second byte after 0xFF.
FRAME_SYNCS = (0xFB, 0xFA, 0xF3, 0xF2, 0xE3, 0xE2, 0xF1, 0xF9)


def looks_like_container(head: bytes) -> bool:
    """Whether the stream's first bytes are a container signature (or an MPEG audio frame sync)."""
    if any(head[offset:offset + len(magic)] == magic for offset, magic in SIGNATURES):
        return True
    return len(head) >= 2 and head[0] == 0xFF and head[1] in FRAME_SYNCS


class PrefixedStream:
    """A read-only stream over `source` as it arrives, whose first bytes can be looked at first (`peek`) and are still
    read after (PyAV reads through `read` alone, without seeking, as a pipe needs)."""

    def __init__(self, source: BinaryIO) -> None:
        self._head, self._read = b"", getattr(source, "read1", source.read)

    def peek(self, size: int) -> bytes:
        """The stream's first `size` bytes (fewer when it ends first), kept for the reads that follow."""
        while len(self._head) < size:
            data = self._read(size - len(self._head))
            if not data:
                break
            self._head += bytes(data)
        return self._head[:size]

    def read(self, size: int = -1) -> bytes:
        if self._head:
            size = len(self._head) if size is None or size < 0 else size
            out, self._head = self._head[:size], self._head[size:]
            return out
        return bytes(self._read(size if size and size > 0 else READ_BYTES))


def read_blocks(source: BinaryIO, input_format: str, sample_rate: Optional[int], blocks: "queue.Queue[Any]") -> None:
    """Thread body: the stream's samples as float32 16 kHz blocks on `blocks`, then END; an error (an AudioError for
    a container FFmpeg cannot read) is put on the queue instead, for the reading side to raise."""
    try:
        stream = PrefixedStream(source)
        sniffed = input_format == "auto" and looks_like_container(stream.peek(SNIFF_BYTES))
        if input_format == "container" or sniffed:
            _container_blocks(stream, blocks)
        else:
            _raw_blocks(stream, Pcm16Stream(sample_rate or 16000), blocks)
        blocks.put(END)
    except Exception as error:  # handed to the reading side, which raises it
        blocks.put(error)


def _container_blocks(stream: PrefixedStream, blocks: "queue.Queue[Any]") -> None:
    from seq2seq_engine.audio.av_decode import iter_av_live

    for block in iter_av_live(stream, "<stdin>"):
        blocks.put(block)


def _raw_blocks(stream: PrefixedStream, pcm: Pcm16Stream, blocks: "queue.Queue[Any]") -> None:
    odd = b""
    while True:
        data = stream.read(READ_BYTES)
        if not data:
            blocks.put(pcm.finish())
            return
        data = odd + data
        cut = len(data) - len(data) % 2
        data, odd = data[:cut], data[cut:]
        blocks.put(pcm.decode(data))
