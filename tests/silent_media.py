"""Long silent recordings made in a second or two: 8 kHz mono, compressed at a low bitrate, or WAV at 1 kHz."""
import fractions
import io

import numpy as np


class _Unseekable(io.RawIOBase):
    """An output the muxer cannot seek back into, so it writes no duration (a live recording, a browser's webm)."""

    def __init__(self) -> None:
        super().__init__()
        self.data = io.BytesIO()

    def writable(self) -> bool:
        return True

    def write(self, chunk) -> int:
        return self.data.write(chunk)


def silent_file(seconds: float, container_format: str = "ogg", codec: str = "libopus",
                declare_duration: bool = True) -> bytes:
    """`seconds` of silence at 8 kHz mono, encoded by FFmpeg (libopus in ogg: ~3.6 s per hour); with
    declare_duration False the container is written as a stream and says nothing of its length."""
    import av
    from av_media import require_encoders

    require_encoders(codec)
    rate, block = 8000, 80000
    output = io.BytesIO() if declare_duration else _Unseekable()
    with av.open(output, "w", format=container_format) as container:
        stream = container.add_stream(codec, rate=rate, layout="mono")
        stream.bit_rate = 6000
        zeros = np.zeros((1, block), np.float32)
        for start in range(0, int(seconds * rate), block):
            frame = av.AudioFrame.from_ndarray(zeros, format="fltp", layout="mono")
            frame.sample_rate, frame.pts, frame.time_base = rate, start, fractions.Fraction(1, rate)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return (output if declare_duration else output.data).getvalue()


def silent_wav(seconds: float, sample_rate: int = 1000) -> bytes:
    """`seconds` of silence as 8-bit WAV at `sample_rate` (1 kHz: 3.6 MB an hour, written in well under a second)."""
    import soundfile

    output = io.BytesIO()
    soundfile.write(output, np.zeros(int(seconds * sample_rate), np.float32), sample_rate, subtype="PCM_U8",
                    format="WAV")
    return output.getvalue()
