"""Whisper transcription (seq2seq_engine.transcription), unit level, no model: the logits processors against
transformers' own processors on random logits and token histories (identical outputs), segment splitting and window
stitching on hand-built token sequences, srt/vtt. The real-model tests are in test_transcription.py.
"""
import random

import pytest
import torch
import transformers
from transformers.generation.logits_process import (SuppressTokensAtBeginLogitsProcessor, SuppressTokensLogitsProcessor,
                                                    WhisperTimeStampLogitsProcessor)

from seq2seq_engine.transcription import (Segment, SuppressTokens, SuppressTokensAtBegin, TranscriptionResult,
                                          WhisperTimestamps, WhisperTokens, WindowTokens, format_timestamp,
                                          split_segments, stitch, to_srt, to_vtt, whisper_processors)
from seq2seq_engine.transcription.decode.processors import OnlyTokens

# The English-only vocabulary layout (tiny.en), for tests that need ids but no model.
EN = WhisperTokens(sot=50257, eot=50256, no_timestamps=50362, vocab_size=51864, max_target_positions=448,
                   is_multilingual=False, language_ids={"en": 50258, "zh": 50259, "de": 50260},
                   transcribe=50358, translate=50357, start_of_prev=50360, suppress_tokens=(1, 2, 7, 50357, 50361),
                   begin_suppress_tokens=(220, 50256), max_initial_timestamp_index=50)
TB = EN.timestamp_begin  # <|0.00|>


def ts(seconds: float) -> int:
    return TB + int(round(seconds / 0.02))


# ---------------------------------------------------------------------------------------------- processors
def _random_history(rng: random.Random, length: int):
    """Arbitrary mixes of text tokens, timestamps (often repeated/decreasing) and eos: the processors must agree
    with HF on any history, not only well-formed ones."""
    out = []
    for _ in range(length):
        kind = rng.random()
        if kind < 0.45:
            out.append(rng.randrange(0, EN.eot))
        elif kind < 0.9:
            out.append(TB + rng.choice([0, 1, 2, 49, 50, 51, 200, 1500, rng.randrange(0, 1501)]))
        else:
            out.append(rng.choice([EN.eot, EN.no_timestamps, EN.sot]))
    return out


def _random_logits(rng: random.Random, gen: torch.Generator):
    logits = torch.randn(EN.vocab_size, generator=gen) * rng.choice([0.5, 2.0, 8.0])
    if rng.random() < 0.5:  # make the timestamps' total probability beat the best text token now and then
        logits[TB:] += rng.choice([2.0, 4.0, 6.0])
    if rng.random() < 0.3:
        logits[rng.randrange(0, TB)] += 25.0
    return logits


pytestmark = pytest.mark.usefixtures("one_thread")


def _hf(processor, prompt, history, logits):
    return processor(torch.tensor([prompt + history]), logits.clone()[None])[0]


def test_processors_equal_hf_processors_on_random_logits_and_histories():
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    hf_config = transformers.GenerationConfig(no_timestamps_token_id=EN.no_timestamps, eos_token_id=EN.eot,
                                              max_initial_timestamp_index=EN.max_initial_timestamp_index)
    forced = 0
    for case in range(400):
        prompt = [EN.sot] + [rng.randrange(0, EN.vocab_size) for _ in range(rng.choice([0, 1, 3]))]
        history = _random_history(rng, rng.choice([0, 0, 1, 1, 2, 2, 3, 5, 8]))
        logits = _random_logits(rng, gen)
        begin = len(prompt)
        pairs = [
            (SuppressTokens(EN.suppress_tokens), SuppressTokensLogitsProcessor(EN.suppress_tokens)),
            (SuppressTokensAtBegin(EN.begin_suppress_tokens),
             SuppressTokensAtBeginLogitsProcessor(EN.begin_suppress_tokens, begin_index=begin)),
            (WhisperTimestamps(EN.no_timestamps, EN.eot, EN.max_initial_timestamp_index),
             WhisperTimeStampLogitsProcessor(hf_config, begin_index=begin)),
        ]
        for ours, theirs in pairs:
            expected = _hf(theirs, prompt, history, logits)
            got = ours(list(history), logits.clone())
            assert torch.equal(got, expected), (case, type(ours).__name__, prompt, history)
        if torch.isinf(_hf(pairs[2][1], prompt, history, logits)[:TB]).all():
            forced += 1
    assert 40 < forced < 360  # both branches of the "force a timestamp" rule were exercised


def test_processor_chain_equals_hf_chain_in_generate_order():
    """begin-suppress, suppress, timestamps in that order (HF `_retrieve_logit_processors`)."""
    rng, gen = random.Random(1), torch.Generator().manual_seed(1)
    hf_config = transformers.GenerationConfig(no_timestamps_token_id=EN.no_timestamps, eos_token_id=EN.eot,
                                              max_initial_timestamp_index=EN.max_initial_timestamp_index)
    for case in range(100):
        prompt = [EN.sot]
        history = _random_history(rng, rng.choice([0, 1, 2, 4]))
        logits = _random_logits(rng, gen)
        theirs = [SuppressTokensAtBeginLogitsProcessor(EN.begin_suppress_tokens, begin_index=1),
                  SuppressTokensLogitsProcessor(EN.suppress_tokens),
                  WhisperTimeStampLogitsProcessor(hf_config, begin_index=1)]
        expected = logits.clone()[None]
        for processor in theirs:
            expected = processor(torch.tensor([prompt + history]), expected)
        got = logits.clone()
        for processor in whisper_processors(EN, timestamps=True):
            got = processor(history, got)
        assert torch.equal(got, expected[0]), (case, history)
    assert len(whisper_processors(EN, timestamps=False)) == 2


def test_only_tokens_keeps_exactly_the_language_tokens():
    logits = torch.randn(EN.vocab_size, generator=torch.Generator().manual_seed(2))
    out = OnlyTokens(EN.language_ids.values())([], logits.clone())
    kept = torch.isfinite(out).nonzero().flatten().tolist()
    assert kept == sorted(EN.language_ids.values())
    assert torch.equal(out[kept], logits[kept])


# ---------------------------------------------------------------------------------------------- segments
def _decode(ids):
    return "".join(f" w{i}" for i in ids)


def test_split_segments_pairs_single_ending_and_open_end():
    tokens = [ts(0), 11, 12, ts(1.2), ts(1.4), 13, ts(2.0)]
    assert split_segments(tokens, EN, 30.0) == [(0.0, 1.2, [11, 12]), (1.4, 2.0, [13])]
    # double timestamp at the end, then text cut by the window end (no closing timestamp)
    tokens = [ts(0.5), 11, ts(3.0), ts(3.0), 12, 13]
    assert split_segments(tokens, EN, 10.0) == [(0.5, 3.0, [11]), (3.0, 10.0, [12, 13])]
    # no timestamps at all: one segment over the window; special tokens are ignored
    assert split_segments([EN.sot, 11, 12], EN, 7.5) == [(0.0, 7.5, [11, 12])]
    # empty openings are replaced by later ones; timestamps past the window are clamped to it
    assert split_segments([ts(0), ts(0.4), 11, ts(29.0)], EN, 5.0) == [(0.4, 5.0, [11])]
    assert split_segments([], EN, 30.0) == []


def test_stitch_shifts_window_segments_by_their_offsets():
    windows = [WindowTokens(0.0, 30.0, [ts(0), 11, ts(2.5), ts(2.5), 12, 13, ts(29.9)]),
               WindowTokens(30.0, 30.0, [ts(0.2), 14, ts(4.0)]),
               WindowTokens(60.0, 12.25, [ts(1.0), 15, 16])]
    text, segments = stitch(windows, EN, _decode, timestamps=True)
    assert segments == [Segment(0.0, 2.5, "w11"), Segment(2.5, 29.9, "w12 w13"), Segment(30.2, 34.0, "w14"),
                        Segment(61.0, 72.25, "w15 w16")]
    assert text == "w11 w12 w13 w14 w15 w16"


def test_stitch_without_timestamps_gives_one_segment_per_window_with_text():
    windows = [WindowTokens(0.0, 30.0, [11, 12]), WindowTokens(30.0, 30.0, []), WindowTokens(60.0, 3.5, [13])]
    text, segments = stitch(windows, EN, _decode, timestamps=False)
    assert text == "w11 w12 w13"
    assert segments == [Segment(0.0, 30.0, "w11 w12"), Segment(60.0, 63.5, "w13")]


# ---------------------------------------------------------------------------------------------- formats
def test_srt_and_vtt_formatting():
    result = TranscriptionResult("Hello there. General Kenobi!", "en",
                                 [Segment(0.0, 2.5, "Hello there."), Segment(3661.0015, 3663.9996, "General Kenobi!"),
                                  Segment(4000.0, 4001.0, "  ")], None, 4001.0)
    assert to_srt(result) == ("1\n00:00:00,000 --> 00:00:02,500\nHello there.\n\n"
                              "2\n01:01:01,002 --> 01:01:04,000\nGeneral Kenobi!\n")
    assert to_vtt(result) == ("WEBVTT\n\n00:00:00.000 --> 00:00:02.500\nHello there.\n\n"
                              "01:01:01.002 --> 01:01:04.000\nGeneral Kenobi!\n")
    assert format_timestamp(59.9999) == "00:01:00.000"
    assert format_timestamp(5.25, ",", always_include_hours=False) == "00:05,250"
    with pytest.raises(ValueError):
        format_timestamp(-1.0)
