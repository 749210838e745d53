"""Tests for prompt parsing (seq2seq_engine.inputs.parse): every singleton and explicit form, token ids from arrays,
and each malformed prompt raising the right error naming the field."""
import numpy as np
import pytest

from seq2seq_engine.inputs import ParsedExplicitPrompt, ParsedSingletonPrompt, TextPrompt, TokensPrompt, parse_prompt


@pytest.mark.parametrize("prompt, kind", [("hi", "text"), ({"prompt": "hi"}, "text"), (TextPrompt(prompt="hi"), "text"),
                                          ({"prompt_token_ids": [5, 6]}, "tokens"),
                                          (TokensPrompt(prompt_token_ids=[5, 6]), "tokens")])
def test_parse_singleton_forms(prompt, kind):
    parsed = parse_prompt(prompt)
    assert isinstance(parsed, ParsedSingletonPrompt) and parsed.kind == kind
    assert (parsed.text, parsed.token_ids) == (("hi", None) if kind == "text" else (None, [5, 6]))


def test_parse_explicit_and_array_token_ids():
    parsed = parse_prompt({"encoder_prompt": "a", "decoder_prompt": {"prompt_token_ids": np.array([2, 7])}})
    assert isinstance(parsed, ParsedExplicitPrompt)
    assert parsed.encoder.text == "a" and parsed.decoder.token_ids == [2, 7]
    assert all(type(t) is int for t in parsed.decoder.token_ids)
    assert parse_prompt({"encoder_prompt": "a"}).decoder is None
    assert parse_prompt({"encoder_prompt": "a", "decoder_prompt": None}).decoder is None


@pytest.mark.parametrize("prompt, error, match", [
    (42, TypeError, "prompt"),
    (["a"], TypeError, "prompt"),
    ({"prompt": "a", "foo": 1}, ValueError, "foo"),
    ({"prompt": "a", "prompt_token_ids": [1]}, ValueError, "prompt_token_ids"),
    ({}, ValueError, "prompt_token_ids"),
    ({"prompt": 3}, TypeError, "prompt must be a str"),
    ({"prompt_token_ids": "12"}, TypeError, "prompt_token_ids"),
    ({"prompt_token_ids": [1, "2"]}, TypeError, r"prompt_token_ids\[1\]"),
    ({"prompt_token_ids": [1, 2.0]}, TypeError, r"prompt_token_ids\[1\]"),
    ({"prompt_token_ids": [True]}, TypeError, r"prompt_token_ids\[0\]"),
    ({"decoder_prompt": "a"}, ValueError, "encoder_prompt"),
    ({"encoder_prompt": "a", "prompt": "b"}, ValueError, "prompt"),
    ({"encoder_prompt": {"encoder_prompt": "a"}}, ValueError, "encoder_prompt"),
    ({"encoder_prompt": "a", "decoder_prompt": {"encoder_prompt": "b"}}, ValueError, "decoder_prompt"),
    ({"encoder_prompt": 7}, TypeError, "encoder_prompt"),
    ({"encoder_prompt": "a", "decoder_prompt": {"prompt_token_ids": [None]}}, TypeError,
     r"decoder_prompt\.prompt_token_ids\[0\]"),
    ({"prompt": "a", "multi_modal_data": [1]}, TypeError, "multi_modal_data"),
    ({"prompt": "a", "multi_modal_data": {"image": 1}}, ValueError, "multi_modal_data"),
    ({"prompt": "a", "multi_modal_data": {"audio": np.zeros(4)}}, TypeError, "multi_modal_data.audio"),
    ({"prompt": "a", "multi_modal_data": {"audio": ("abc", 16000)}}, TypeError, r"audio\[0\]"),
    ({"prompt": "a", "multi_modal_data": {"audio": (np.zeros(0), 16000)}}, ValueError, r"audio\[0\]"),
    ({"prompt": "a", "multi_modal_data": {"audio": (np.zeros(4), 16000.0)}}, TypeError, "sample rate"),
    ({"prompt": "a", "multi_modal_data": {"audio": (np.zeros(4), 0)}}, ValueError, "sample rate"),
])
def test_parse_errors(prompt, error, match):
    with pytest.raises(error, match=match):
        parse_prompt(prompt)
