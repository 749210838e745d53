"""Word-timing pieces without a model: DTW, median filter, word splitting, punctuation, word cues, CLI flags."""
import io
import itertools
import json

import numpy as np
import pytest
import torch

from seq2seq_engine.models.whisper_alignment import alignment_heads
from seq2seq_engine.transcription.output.results import Segment, TranscriptionResult, Word, render, to_srt, to_vtt
from seq2seq_engine.transcription.timing.token_timing import dtw, median_filter
from seq2seq_engine.transcription.timing.word_timestamps import distribute
from seq2seq_engine.transcription.timing.words import (WordTiming, merge_punctuations, split_on_spaces,
                                                       split_on_unicode, time_words)


def _dtw_loop(x):
    """The textbook loop (openai's dtw_cpu / HF's _dynamic_time_warping)."""
    n, m = x.shape
    cost = np.full((n + 1, m + 1), np.inf, dtype=np.float32)
    trace = -np.ones((n + 1, m + 1))
    cost[0, 0] = 0
    for j, i in itertools.product(range(1, m + 1), range(1, n + 1)):
        c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
        c, t = (c0, 0) if c0 < c1 and c0 < c2 else (c1, 1) if c1 < c0 and c1 < c2 else (c2, 2)
        cost[i, j] = x[i - 1, j - 1] + c
        trace[i, j] = t
    trace[0, :], trace[:, 0] = 2, 1
    i, j, path = n, m, []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        i, j = (i - 1, j - 1) if trace[i, j] == 0 else (i - 1, j) if trace[i, j] == 1 else (i, j - 1)
    return path[::-1]


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (7, 3), (12, 40)])
def test_dtw_equals_the_plain_loop(shape):
    x = np.random.default_rng(sum(shape)).normal(size=shape)
    x[0, 0] = x[0, 1] if shape[1] > 1 else x[0, 0]  # a tie
    rows, cols = dtw(x)
    assert list(zip(rows.tolist(), cols.tolist())) == _dtw_loop(x)


def test_median_filter_reflects_edges():
    x = torch.tensor([[5.0, 1.0, 9.0, 2.0, 7.0]])
    # reflect padding of 1: [1, 5, 1, 9, 2, 7, 2] -> medians of 3
    assert median_filter(x, 3).tolist() == [[1.0, 5.0, 2.0, 7.0, 2.0]]
    with pytest.raises(ValueError):
        median_filter(x, 4)


def test_alignment_heads_default_to_the_last_half_of_the_decoder():
    class Config:
        decoder_layers, decoder_attention_heads = 4, 2
    assert alignment_heads(Config(), {}) == [(2, 0), (2, 1), (3, 0), (3, 1)]
    Config.alignment_heads = [[1, 0], [3, 1]]
    assert alignment_heads(Config(), {}) == [(1, 0), (3, 1)]
    assert alignment_heads(Config(), {"alignment_heads": [[2, 1]]}) == [(2, 1)]  # generation_config.json first


PIECES = {1: " Hello", 2: ",", 3: " wor", 4: "ld", 5: " (", 6: " yes", 7: ")", 8: "!", 99: "<|endoftext|>"}


def _decode(ids):
    return "".join(PIECES[i] for i in ids)


def test_split_on_spaces_and_merge_punctuations():
    words, groups = split_on_spaces([1, 2, 3, 4, 5, 6, 7, 8, 99], _decode, eot=99)
    assert words == [" Hello", ",", " world", " (", " yes", ")", "!", "<|endoftext|>"]
    assert groups[2] == [3, 4]
    timings = [WordTiming(w, g, float(k), float(k + 1), 0.5) for k, (w, g) in enumerate(zip(words[:-1], groups))]
    merge_punctuations(timings)
    assert [t.word for t in timings] == [" Hello,", "", " world", "", " ( yes)!", "", ""]
    assert timings[4].tokens == [5, 6, 7, 8] and timings[4].start == 4.0


def test_split_on_unicode_keeps_multibyte_characters_whole():
    good = "\u597d".encode()
    token_bytes = {1: "\u4f60".encode(), 2: good[:2], 3: good[2:], 4: " a".encode()}

    def decode(ids):
        return b"".join(token_bytes[i] for i in ids).decode("utf-8", errors="replace")
    words, groups = split_on_unicode([1, 2, 3, 4], decode)
    assert words == ["\u4f60", "\u597d", " a"] and groups == [[1], [2, 3], [4]]


def test_time_words_uses_start_frames_and_mean_probability():
    words = time_words([1, 3, 4], np.array([0.9, 0.5, 0.7]), np.array([0, 10, 12, 30]), _decode, 99, "en", 0.02)
    assert [(w.word, w.start, w.end) for w in words] == [(" Hello", 0.0, 0.2), (" world", 0.2, 0.6)]
    assert words[1].probability == pytest.approx(0.6)


def _result():
    words = [Word(0.0, 0.4, " One", 0.9), Word(0.4, 0.9, " two", 0.8), Word(0.9, 1.5, " three.", 0.7)]
    segment = Segment(0.0, 1.6, "One two three.", words=words)
    return TranscriptionResult("One two three.", "en", [segment], None, 2.0)


def test_word_cues_and_json_words():
    result = _result()
    assert to_srt(result, 2) == ("1\n00:00:00,000 --> 00:00:00,900\nOne two\n\n"
                                 "2\n00:00:00,900 --> 00:00:01,500\nthree.\n")
    assert to_vtt(result, 1).count("-->") == 3
    # one cue, timed by its words (the segment runs on to 1.6 s)
    assert render(result, "srt") == "1\n00:00:00,000 --> 00:00:01,500\nOne two three.\n"
    record = json.loads(render(result, "json"))
    assert record["segments"][0]["words"][1] == {"start": 0.4, "end": 0.9, "word": " two", "probability": 0.8}
    assert "words" not in Segment(0.0, 1.0, "x").to_dict()
    with pytest.raises(ValueError):
        to_srt(result, 0)


def test_cli_max_words_per_line():
    import argparse

    from seq2seq_engine.entrypoints import transcribe_cli
    out = io.StringIO()
    assert transcribe_cli.write_results([_result()], ["a.wav"], "vtt", None, out, io.StringIO(), 3) == 0
    assert "One two three." in out.getvalue()
    parser = argparse.ArgumentParser(prog="seq2seq-engine")
    transcribe_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["transcribe", "a.wav", "--word-timestamps", "--max-words-per-line", "0"])
    err = io.StringIO()
    assert args.word_timestamps and transcribe_cli.run(args, io.StringIO(), err) == 2
    assert "--max-words-per-line" in err.getvalue()


def test_cli_word_flags_make_options_and_reach_the_folder_writer(tmp_path):
    import argparse

    from seq2seq_engine.entrypoints import transcribe_cli
    from seq2seq_engine.entrypoints.audio_files import AudioJob
    from seq2seq_engine.entrypoints.transcribe_flags import options_from_args
    from seq2seq_engine.entrypoints.transcribe_outputs import OutputWriter
    parser = transcribe_cli.configure_parser(argparse.ArgumentParser())
    assert not options_from_args(parser.parse_args(["a.wav"])).word_timestamps
    assert options_from_args(parser.parse_args(["a.wav", "--word-timestamps"])).word_timestamps
    assert options_from_args(parser.parse_args(["a.wav", "--max-words-per-line", "2"])).word_timestamps
    writer = OutputWriter([AudioJob("a.wav", "a")], str(tmp_path), "srt", 2)
    writer(0, _result())
    assert (tmp_path / "a.srt").read_text(encoding="utf-8") == to_srt(_result(), 2)
    assert to_srt(_result(), 2).count("-->") == 2


def _timed(text, start, end):
    return WordTiming(text, [1], start, end, 0.9)


def test_distribute_shortens_the_first_words_after_a_pause():
    """openai-whisper's rule by hand, median 0.3 s (longest 0.6 s)."""
    words = [_timed(" The", 0.0, 10.2), _timed(" fox.", 10.2, 10.5)]
    (only,) = distribute(words, [(0.0, 12.0, [1, 2])], 30.0, median=0.3)
    assert [(w.start, w.end) for w in only] == [(9.6, 10.2), (10.2, 10.5)]   # ends 10.2 s after the start
    words = [_timed(" The", 0.0, 10.2), _timed(" big", 10.2, 11.0), _timed(" fox", 11.0, 11.3)]
    (only,) = distribute(words, [(0.0, 12.0, [1, 2, 3])], 30.0, median=0.3)
    # the second word is long too: both meet at max(11.0 / 2, 11.0 - 0.6) = 10.4, the first keeps 0.6 s
    assert [(w.start, w.end) for w in only] == [(9.8, 10.4), (10.4, 11.0), (11.0, 11.3)]
    words = [_timed(" a", 0.2, 0.5), _timed(" b.", 0.5, 0.8), _timed(" c", 0.8, 2.0)]
    first, second = distribute(words, [(0.0, 0.8, [1, 2]), (0.8, 2.0, [3])], 30.0, median=0.3)
    assert [(w.start, w.end) for w in second] == [(0.8, 2.0)]   # ends 1.2 s after the speech: not a pause


def test_median_filter_equals_openai_whisper_sort_median():
    # openai-whisper's filter: reflect padding, then the middle of each sorted window (NaN ranks last)
    generator = torch.Generator().manual_seed(0)
    for width in (1, 3, 7, 9):
        pad = width // 2
        for weights in (torch.randn(3, 50, 301, generator=generator), torch.randint(0, 4, (2, 7, 40)).float()):
            padded = torch.nn.functional.pad(weights.reshape(-1, 1, weights.shape[-1]), (pad, pad), mode="reflect")
            reference = padded.unfold(-1, width, 1).sort()[0][..., pad].reshape(weights.shape)
            assert torch.equal(median_filter(weights, width), reference), width
    with_nan = torch.randn(2, 5, 30, generator=generator)
    with_nan[0, 1, 10:14] = float("nan")
    padded = torch.nn.functional.pad(with_nan.reshape(-1, 1, 30), (3, 3), mode="reflect")
    reference = padded.unfold(-1, 7, 1).sort()[0][..., 3].reshape(with_nan.shape)
    assert torch.equal(median_filter(with_nan, 7).nan_to_num(-9.0), reference.nan_to_num(-9.0))
