"""The srt/vtt flags of `seq2seq-engine transcribe` without a model: --max-line-width, --max-line-count,
--max-words-per-line and --highlight-words become SubtitleOptions (bad values: a usage error naming the flag), the
timing defaults of srt/vtt (explicit flags win), and the writers of stdout, --output-dir and --ray's rows all cut
the same cues."""
import argparse
import io

import pytest

from seq2seq_engine.entrypoints import transcribe_cli
from seq2seq_engine.entrypoints.audio_files import AudioJob
from seq2seq_engine.entrypoints.transcribe_flags import SUBTITLE_TIMING, options_from_args, subtitle_options
from seq2seq_engine.entrypoints.transcribe_outputs import OutputWriter
from seq2seq_engine.integrations.rows import result_to_row, row_to_result
from seq2seq_engine.transcription.output.results import Segment, TranscriptionResult, Word, render
from seq2seq_engine.transcription.output.subtitles import SubtitleOptions


def _args(*flags):
    return transcribe_cli.configure_parser(argparse.ArgumentParser()).parse_args(["a.wav", *flags])


def _result():
    words = [Word(0.5 * k, 0.5 * k + 0.4, f" word{k}", 0.9) for k in range(12)]
    after = [Word(8.0, 8.3, " Then", 0.9), Word(8.3, 8.4, " a", 0.9), Word(8.4, 9.0, " pause.", 0.9)]
    return TranscriptionResult("text", "en", [Segment(0.0, 6.0, "".join(w.word for w in words).strip(), words=words),
                                              Segment(8.0, 9.0, "Then a pause.", words=after)], None, 9.0)


def test_cue_flags_become_subtitle_options():
    assert subtitle_options(_args()) == SubtitleOptions()
    options = subtitle_options(_args("--max-line-width", "20", "--max-line-count", "3", "--max-words-per-line", "4",
                                     "--highlight-words"))
    assert options == SubtitleOptions(max_line_width=20, max_line_count=3, max_words_per_line=4, highlight_words=True)


@pytest.mark.parametrize("flags, timing", [
    (["--output-format", "srt"], SUBTITLE_TIMING), (["--output-format", "vtt"], SUBTITLE_TIMING),
    ([], (False, False)), (["--output-format", "json"], (False, False)),
    (["--output-format", "srt", "--no-timestamps"], (False, False)),
    (["--output-format", "srt", "--word-timestamps"], (False, True)),
    (["--output-format", "srt", "--no-word-timestamps"], (False, False)),
    (["--output-format", "vtt", "--timestamps"], (True, False)),
    (["--output-format", "srt", "--highlight-words"], (SUBTITLE_TIMING[0], True)),
    (["--output-format", "srt", "--max-words-per-line", "3"], (SUBTITLE_TIMING[0], True)),
    (["--output-format", "srt", "--max-words-per-line", "3", "--no-word-timestamps"], (False, False)),
    (["--max-line-width", "30"], (False, False)),
])
def test_srt_and_vtt_timing_defaults_and_explicit_flags(flags, timing):
    options = options_from_args(_args(*flags))
    assert (options.timestamps, options.word_timestamps) == timing


@pytest.mark.parametrize("flags, message", [
    (["--max-line-width", "0"], "--max-line-width must be an int >= 1"),
    (["--max-line-count", "-1"], "--max-line-count must be an int >= 1"),
    (["--max-words-per-line", "0"], "--max-words-per-line must be an int >= 1"),
    (["--highlight-words", "--no-word-timestamps"], "--highlight-words needs word timestamps"),
])
def test_bad_cue_flags_are_usage_errors_naming_the_flag(flags, message):
    err = io.StringIO()
    assert transcribe_cli.run(_args("--output-format", "srt", *flags), io.StringIO(), err) == 2
    assert message in err.getvalue()


def test_stdout_folder_and_ray_rows_write_the_same_cues(tmp_path):
    options = subtitle_options(_args("--max-line-width", "16", "--highlight-words"))
    expected = render(_result(), "vtt", options)
    assert expected.count("<u>") == 15 and "\nThen a <u>pause.</u>\n" in expected
    out = io.StringIO()
    assert transcribe_cli.write_results([_result()], ["a.wav"], "vtt", None, out, io.StringIO(), options) == 0
    assert out.getvalue() == expected
    writer = OutputWriter([AudioJob("a.wav", "a")], str(tmp_path), "vtt", options)
    writer(0, _result())
    # --ray: the replicas' rows become results again, handed to the same writer
    writer = OutputWriter([AudioJob("b.wav", "b")], str(tmp_path), "vtt", options)
    writer(0, row_to_result(result_to_row(_result())))
    assert (tmp_path / "a.vtt").read_text(encoding="utf-8") == (tmp_path / "b.vtt").read_text(encoding="utf-8")
    assert (tmp_path / "a.vtt").read_text(encoding="utf-8") == expected
