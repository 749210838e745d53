"""Transcription of any audio format and of long files read as a stream, with the packaged whisper-tiny.en: a speech
clip encoded to each format (PyAV, on the fly) gives the wav's transcript while a broken file and a video without
audio fail alone; a 10-minute file is transcribed with only the windows in flight in memory and the same tokens as
the whole signal; iter_transcribe hands back each input's result as soon as it is done."""
import tracemalloc
import weakref

import numpy as np
import pytest
from av_media import FORMATS, encode, speech_clip, video_only

from seq2seq_engine.audio import load_audio
from seq2seq_engine.transcription.input import window_source

pytestmark = pytest.mark.usefixtures("one_thread")
pytest.importorskip("av")

LONG_UNITS = 10  # 60 s each: speech at 0 s and at 30 s, so every 30 s window has some


def test_every_format_gives_the_wav_transcript_and_broken_files_fail_alone(tmp_path, tiny_llm):
    wav, _, reference = speech_clip("quick_brown_fox")
    samples = load_audio(wav)
    names = sorted(FORMATS)
    paths = [encode(tmp_path / f"fox.{name}", samples, 16000, name) for name in names]
    broken = tmp_path / "broken.m4a"
    broken.write_bytes(b"\x00\x00\x00\x18ftypM4A " + b"garbage" * 100)
    movie = video_only(tmp_path / "no_sound.mp4")
    results = tiny_llm.transcribe([wav, *paths, str(broken), movie], max_new_tokens=32, use_tqdm=False)
    expected = results[0].text
    assert expected.strip(" .").lower() == reference.strip(" .").lower()
    for name, result in zip(names, results[1:-2]):
        assert result.error is None, (name, result.error)
        assert result.text == expected, name
        assert result.duration == pytest.approx(len(samples) / 16000, abs=0.07), name  # AAC: + up to 1 frame
    assert "broken.m4a: cannot decode audio file" in results[-2].error
    assert "no_sound.mp4: no audio stream" in results[-1].error
    assert not tiny_llm.llm_engine.has_unfinished_requests()


@pytest.fixture(scope="module")
def long_mp3(tmp_path_factory):
    """(path, seconds): 10 minutes of mp3, a 60 s unit (two speech clips 30 s apart) encoded once and its frames
    repeated (MP3 frames decode independently)."""
    _, fox, _ = speech_clip("quick_brown_fox")
    _, counting, _ = speech_clip("counting")
    unit = np.zeros(60 * 16000, np.float32)
    unit[16000:16000 + len(fox)] = fox
    unit[31 * 16000:31 * 16000 + len(counting)] = counting
    folder = tmp_path_factory.mktemp("long")
    with open(encode(folder / "unit.mp3", unit, 16000, "mp3"), "rb") as handle:
        data = handle.read()
    path = folder / "ten_minutes.mp3"
    path.write_bytes(data * LONG_UNITS)
    return str(path)


def _counting_windows(monkeypatch):
    """Wrap the pipeline's window stream: counts the windows it made that are still alive; returns the stats."""
    stats = {"made": 0, "live": 0, "peak": 0}
    real = window_source.iter_windows

    def gone():
        stats["live"] -= 1

    def counting(*args, **kwargs):
        for window in real(*args, **kwargs):
            stats["made"] += 1
            stats["live"] += 1
            stats["peak"] = max(stats["peak"], stats["live"])
            weakref.finalize(window, gone)
            yield window
            del window

    monkeypatch.setattr(window_source, "iter_windows", counting)
    return stats


def test_a_long_file_holds_only_the_windows_in_flight(long_mp3, tiny_llm, window_tokens, monkeypatch):
    stats = _counting_windows(monkeypatch)
    tracemalloc.start()
    try:
        streamed = tiny_llm.transcribe([long_mp3], max_new_tokens=24, use_tqdm=False, max_in_flight=4,
                                       vad_filter=False)[0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    whole = load_audio(long_mp3)
    assert streamed.error is None and streamed.duration == pytest.approx(len(whole) / 16000)
    n_windows = -(-len(whole) // 480000)
    assert stats["made"] == n_windows >= 20
    # 4 requests in flight plus the window being read; never the 20-odd windows of the file
    assert stats["peak"] <= 4 + 1, stats
    # numpy's share of memory: the windows held (4 in flight = 7.7 MB between steps) plus one being read and the
    # float64 copies is_silent makes of it (15.5 MB measured); loading the file whole would hold 38.4 MB
    assert peak < whole.nbytes / 2, f"tracemalloc peak {peak / 1e6:.1f} MB, the whole file {whole.nbytes / 1e6:.1f}"
    loaded = tiny_llm.transcribe([(whole, 16000)], max_new_tokens=24, use_tqdm=False, max_in_flight=4,
                                 vad_filter=False)[0]
    assert window_tokens[0] == window_tokens[1] and len(window_tokens[0]) == n_windows
    assert (streamed.text, streamed.segments) == (loaded.text, loaded.segments)
    assert "quick brown fox" in streamed.text.lower()


def test_iter_transcribe_hands_back_each_result_as_soon_as_it_is_done(tmp_path, tiny_llm, monkeypatch):
    _, fox, _ = speech_clip("quick_brown_fox")
    _, counting, _ = speech_clip("counting")
    long_audio = np.zeros(95 * 16000, np.float32)
    for start in (0, 30, 60, 90):
        long_audio[start * 16000:start * 16000 + len(counting)] = counting
    missing = str(tmp_path / "missing.wav")
    inputs = [(fox, 16000), (long_audio, 16000), missing]
    engine = tiny_llm.llm_engine
    steps = [0]
    real_step = engine.step

    def counted_step(**kwargs):
        steps[0] += 1
        return real_step(**kwargs)

    monkeypatch.setattr(engine, "step", counted_step)
    seen = []
    # two requests at a time: the clip and the long input's first window start together; the missing file is
    # reached when the long input's last window has been queued
    for index, result in tiny_llm.iter_transcribe(inputs, max_new_tokens=24, use_tqdm=False, max_in_flight=2):
        seen.append((index, result, steps[0]))
    assert [index for index, _, _ in seen] == [0, 2, 1]
    # each handed back at its own engine step, the clip and the missing file well before the long input's end
    assert 0 < seen[0][2] < seen[1][2] < seen[2][2] == steps[0]
    listed = tiny_llm.transcribe(inputs, max_new_tokens=24, use_tqdm=False, max_in_flight=2)
    by_index = {index: result for index, result, _ in seen}
    assert [by_index[i].text for i in range(3)] == [r.text for r in listed]
    assert "file not found" in by_index[2].error
    # stopping early aborts what is still running
    iterator = tiny_llm.iter_transcribe(inputs, max_new_tokens=24, use_tqdm=False, max_in_flight=2)
    assert next(iterator)[0] == 0
    iterator.close()
    assert not engine.has_unfinished_requests()
