"""Tests for InputPreprocessor (encoder/decoder, audio and decoder-only paths); prompt parsing: test_parse.py."""
import numpy as np
import pytest

from seq2seq_engine.config import ModelConfig
from seq2seq_engine.inputs import (ExplicitEncoderDecoderPrompt, InputPreprocessor, TextPrompt, TokensPrompt,
                                   zip_enc_dec_prompts)
from seq2seq_engine.sampling_params import SamplingParams

START, BOS, EOS = 2, 0, 2          # BART-like: decoder_start_token_id = eos = 2, bos = 0
WHISPER_START = 5                  # stands in for <|startoftranscript|>
VOCAB, MAX_SRC, MAX_TGT = 256, 24, 32
TEXT = "hello world the quick brown fox"


def enc_dec_config(**overrides):
    fields = dict(model="tiny-bart", vocab_size=VOCAB, max_target_positions=MAX_TGT, is_encoder_decoder=True,
                  max_source_positions=MAX_SRC, decoder_start_token_id=START, bos_token_id=BOS,
                  eos_token_id=EOS, pad_token_id=1)
    fields.update(overrides)
    return ModelConfig(**fields)


def whisper_config():
    return enc_dec_config(model="tiny-whisper", max_source_positions=30, decoder_start_token_id=WHISPER_START,
                          bos_token_id=None, takes_audio=True)


def dec_only_config(**overrides):
    fields = dict(model="tiny-gpt", vocab_size=VOCAB, max_target_positions=MAX_TGT, is_encoder_decoder=False,
                  bos_token_id=BOS, eos_token_id=EOS)
    fields.update(overrides)
    return ModelConfig(**fields)


def audio(num_samples=1600, sample_rate=16000):
    return (np.zeros(num_samples, dtype=np.float32), sample_rate)


@pytest.fixture
def enc_dec(spm_tokenizer):
    return InputPreprocessor(enc_dec_config(), spm_tokenizer)


@pytest.fixture
def dec_only(spm_tokenizer):
    return InputPreprocessor(dec_only_config(), spm_tokenizer)


@pytest.fixture
def whisper(spm_bart_tokenizer):
    return InputPreprocessor(whisper_config(), spm_bart_tokenizer)


# ---------------------------------------------------------------- encoder/decoder
@pytest.mark.parametrize("form", ["str", "text", "tokens"])
def test_singleton_prompt_is_encoder_with_default_decoder(enc_dec, spm_tokenizer, form):
    expected = spm_tokenizer.encode(TEXT)
    prompt = {"str": TEXT, "text": TextPrompt(prompt=TEXT), "tokens": TokensPrompt(prompt_token_ids=expected)}[form]
    inputs = enc_dec.preprocess(prompt)
    assert inputs.is_encoder_decoder
    assert inputs.encoder_prompt_token_ids == expected
    assert inputs.encoder_prompt == (None if form == "tokens" else TEXT)
    assert inputs.prompt_token_ids == [START, BOS]
    assert inputs.prompt is None


def test_default_decoder_prompt_without_bos(spm_tokenizer):
    preprocessor = InputPreprocessor(enc_dec_config(bos_token_id=None), spm_tokenizer)
    assert preprocessor.preprocess({"prompt_token_ids": [7, 8]}).prompt_token_ids == [START]


def test_explicit_prompt_every_form(enc_dec, spm_tokenizer):
    enc_ids, dec_ids = spm_tokenizer.encode(TEXT), spm_tokenizer.encode("lazy dog")
    encoders = [TEXT, TextPrompt(prompt=TEXT), TokensPrompt(prompt_token_ids=enc_ids)]
    decoders = ["lazy dog", TextPrompt(prompt="lazy dog"), TokensPrompt(prompt_token_ids=dec_ids)]
    for encoder in encoders:
        for decoder in decoders:
            inputs = enc_dec.preprocess(ExplicitEncoderDecoderPrompt(encoder_prompt=encoder, decoder_prompt=decoder))
            assert inputs.encoder_prompt_token_ids == enc_ids
            assert inputs.prompt_token_ids == [START] + dec_ids
            assert inputs.prompt == (None if "prompt_token_ids" in decoder else "lazy dog")


def test_decoder_start_prepended_only_when_missing(enc_dec):
    def decode(decoder_ids):
        return enc_dec.preprocess({"encoder_prompt": {"prompt_token_ids": [9]},
                                   "decoder_prompt": {"prompt_token_ids": decoder_ids}}).prompt_token_ids
    assert decode([BOS, 40]) == [START, BOS, 40]
    assert decode([START, BOS, 40]) == [START, BOS, 40]
    assert decode([]) == [START]


@pytest.mark.parametrize("explicit", [{"encoder_prompt": "fox"}, {"encoder_prompt": "fox", "decoder_prompt": None}])
def test_explicit_without_decoder_gets_default(enc_dec, explicit):
    inputs = enc_dec.preprocess(explicit)
    assert inputs.prompt_token_ids == [START, BOS] and inputs.prompt is None


def test_zip_enc_dec_prompts_batch(enc_dec, spm_tokenizer):
    prompts = zip_enc_dec_prompts(["hello world", {"prompt_token_ids": [7]}], [None, "quick fox"])
    assert prompts[1] == {"encoder_prompt": {"prompt_token_ids": [7]}, "decoder_prompt": "quick fox"}
    first, second = [enc_dec.preprocess(prompt, SamplingParams(max_tokens=4)) for prompt in prompts]
    assert first.encoder_prompt_token_ids == spm_tokenizer.encode("hello world")
    assert first.prompt_token_ids == [START, BOS]
    assert second.encoder_prompt_token_ids == [7]
    assert second.prompt_token_ids == [START] + spm_tokenizer.encode("quick fox")
    with pytest.raises(ValueError, match="equal length"):
        zip_enc_dec_prompts(["a"], [])


def test_bart_style_tokenizer_special_tokens(spm_bart_tokenizer, spm_tokenizer):
    preprocessor = InputPreprocessor(enc_dec_config(), spm_bart_tokenizer)
    plain = spm_tokenizer.encode("lazy dog")
    assert spm_bart_tokenizer.encode("lazy dog") == [BOS] + plain + [EOS]
    inputs = preprocessor.preprocess({"encoder_prompt": TEXT, "decoder_prompt": "lazy dog"})
    assert inputs.encoder_prompt_token_ids == spm_bart_tokenizer.encode(TEXT)
    # the eos the tokenizer appended is dropped so generation continues the decoder prompt
    assert inputs.prompt_token_ids == [START, BOS] + plain
    literal_eos = preprocessor.preprocess({"encoder_prompt": TEXT, "decoder_prompt": "lazy dog</s>"})
    # an eos the user wrote is kept; only the one the tokenizer appends is dropped
    assert literal_eos.prompt_token_ids == [START] + spm_bart_tokenizer.encode("lazy dog</s>")[:-1]
    assert literal_eos.prompt_token_ids[-1] == EOS


# ---------------------------------------------------------------- audio
def test_audio_singleton_text_is_decoder_prompt(whisper, spm_bart_tokenizer):
    mm_data = {"audio": audio()}
    inputs = whisper.preprocess({"prompt": "hello world", "multi_modal_data": mm_data})
    assert inputs.encoder_prompt_token_ids == [0] * 30
    assert inputs.multi_modal_data == mm_data and inputs.encoder.multi_modal_data["audio"] is mm_data["audio"]
    assert inputs.encoder_prompt is None
    # Whisper prompts carry their own special tokens: no <s> / </s> is added to decoder text
    assert inputs.prompt_token_ids == [WHISPER_START] + spm_bart_tokenizer.encode("hello world",
                                                                                  add_special_tokens=False)
    assert inputs.prompt == "hello world" and inputs.decoder.multi_modal_data is None


@pytest.mark.parametrize("prompt", [TEXT, {"prompt_token_ids": [7, 8]},
                                    {"encoder_prompt": TEXT, "decoder_prompt": {"prompt_token_ids": [5]}}])
def test_an_audio_model_refuses_an_encoder_prompt_without_audio(whisper, prompt):
    with pytest.raises(ValueError, match="model 'tiny-whisper' transcribes audio: its encoder prompt needs "
                                         "multi_modal_data"):
        whisper.preprocess(prompt)


def test_a_text_model_refuses_audio_and_an_unknown_one_is_not_checked(spm_tokenizer):
    bart = InputPreprocessor(enc_dec_config(takes_audio=False), spm_tokenizer)
    with pytest.raises(ValueError, match="multi_modal_data: model 'tiny-bart' takes no audio"):
        bart.preprocess({"prompt": "hi", "multi_modal_data": {"audio": audio()}})
    unknown = InputPreprocessor(enc_dec_config(max_source_positions=30), spm_tokenizer)
    assert unknown.preprocess({"prompt": "hi", "multi_modal_data": {"audio": audio()}}).encoder.multi_modal_data


def test_audio_singleton_tokens_is_decoder_prompt(whisper):
    inputs = whisper.preprocess({"prompt_token_ids": [WHISPER_START, 50, 51], "multi_modal_data": {"audio": audio()}})
    assert inputs.prompt_token_ids == [WHISPER_START, 50, 51]
    assert len(inputs.encoder_prompt_token_ids) == 30


def test_audio_explicit_prompt(whisper):
    mm_data = {"audio": audio(sample_rate=8000)}
    inputs = whisper.preprocess({"encoder_prompt": {"prompt": "", "multi_modal_data": mm_data},
                                 "decoder_prompt": {"prompt_token_ids": [WHISPER_START, 60]}})
    assert inputs.encoder_prompt_token_ids == [0] * 30 and inputs.multi_modal_data == mm_data
    assert inputs.prompt_token_ids == [WHISPER_START, 60]
    default = whisper.preprocess({"encoder_prompt": {"prompt_token_ids": [], "multi_modal_data": mm_data}})
    assert default.prompt_token_ids == [WHISPER_START]


def test_audio_in_decoder_prompt_rejected(whisper):
    with pytest.raises(ValueError, match="decoder_prompt.multi_modal_data"):
        whisper.preprocess({"encoder_prompt": "a", "decoder_prompt": {"prompt": "b", "multi_modal_data":
                                                                      {"audio": audio()}}})


# ---------------------------------------------------------------- decoder-only
@pytest.mark.parametrize("form", ["str", "text", "tokens"])
def test_decoder_only_prompt(dec_only, spm_tokenizer, form):
    expected = spm_tokenizer.encode(TEXT)
    prompt = {"str": TEXT, "text": {"prompt": TEXT}, "tokens": {"prompt_token_ids": expected}}[form]
    inputs = dec_only.preprocess(prompt)
    assert inputs.encoder is None and not inputs.is_encoder_decoder
    assert inputs.prompt_token_ids == expected
    assert inputs.prompt == (None if form == "tokens" else TEXT)


def test_decoder_only_rejects_explicit_and_audio(dec_only):
    with pytest.raises(ValueError, match="decoder-only"):
        dec_only.preprocess({"encoder_prompt": "a", "decoder_prompt": "b"})
    with pytest.raises(ValueError, match="multi_modal_data"):
        dec_only.preprocess({"prompt": "a", "multi_modal_data": {"audio": audio()}})


# ---------------------------------------------------------------- errors
def test_empty_prompts(enc_dec, dec_only, spm_tokenizer):
    assert spm_tokenizer.encode("") == []
    for prompt in ["", {"prompt_token_ids": []}, {"encoder_prompt": "", "decoder_prompt": "a"}]:
        with pytest.raises(ValueError, match="encoder_prompt is empty"):
            enc_dec.preprocess(prompt)
    for prompt in ["", {"prompt_token_ids": []}]:
        with pytest.raises(ValueError, match="prompt is empty"):
            dec_only.preprocess(prompt)


@pytest.mark.parametrize("bad_id", [VOCAB, -1, 10_000])
def test_token_ids_out_of_vocab(enc_dec, dec_only, bad_id):
    with pytest.raises(ValueError, match="encoder_prompt.*vocab_size"):
        enc_dec.preprocess({"prompt_token_ids": [5, bad_id]})
    with pytest.raises(ValueError, match="decoder_prompt.*vocab_size"):
        enc_dec.preprocess({"encoder_prompt": "a", "decoder_prompt": {"prompt_token_ids": [START, bad_id]}})
    with pytest.raises(ValueError, match="prompt.*vocab_size"):
        dec_only.preprocess({"prompt_token_ids": [bad_id]})
    assert enc_dec.preprocess({"prompt_token_ids": [0, VOCAB - 1]}).encoder_prompt_token_ids == [0, VOCAB - 1]


def test_encoder_prompt_too_long(enc_dec):
    assert len(enc_dec.preprocess({"prompt_token_ids": [7] * MAX_SRC}).encoder_prompt_token_ids) == MAX_SRC
    with pytest.raises(ValueError, match="max_source_positions"):
        enc_dec.preprocess({"prompt_token_ids": [7] * (MAX_SRC + 1)})


def test_decoder_prompt_plus_max_tokens_too_long(enc_dec):
    def explicit(decoder_len):
        return {"encoder_prompt": {"prompt_token_ids": [7]},
                "decoder_prompt": {"prompt_token_ids": [START] + [9] * (decoder_len - 1)}}
    assert enc_dec.preprocess(explicit(10), SamplingParams(max_tokens=MAX_TGT - 10)).prompt_token_ids[0] == START
    with pytest.raises(ValueError, match="max_tokens.*max_target_positions"):
        enc_dec.preprocess(explicit(10), SamplingParams(max_tokens=MAX_TGT - 9))
    with pytest.raises(ValueError, match="decoder prompt.*max_target_positions"):
        enc_dec.preprocess(explicit(MAX_TGT + 1))
    assert len(enc_dec.preprocess(explicit(MAX_TGT), SamplingParams(max_tokens=None)).prompt_token_ids) == MAX_TGT


def test_decoder_only_prompt_too_long(dec_only):
    with pytest.raises(ValueError, match="max_tokens.*max_target_positions"):
        dec_only.preprocess({"prompt_token_ids": [9] * 20}, SamplingParams(max_tokens=13))
    with pytest.raises(ValueError, match="prompt.*max_target_positions"):
        dec_only.preprocess({"prompt_token_ids": [9] * (MAX_TGT + 1)})


def test_text_prompt_without_tokenizer(spm_tokenizer):
    skipping = InputPreprocessor(enc_dec_config(skip_tokenizer_init=True), spm_tokenizer)
    with pytest.raises(ValueError, match="encoder_prompt.*skip_tokenizer_init"):
        skipping.preprocess("hello")
    with pytest.raises(ValueError, match="decoder_prompt.*skip_tokenizer_init"):
        skipping.preprocess({"encoder_prompt": {"prompt_token_ids": [4]}, "decoder_prompt": "hi"})
    assert skipping.preprocess({"prompt_token_ids": [4]}).encoder_prompt_token_ids == [4]
    with pytest.raises(ValueError, match="prompt.*tokenizer"):
        InputPreprocessor(dec_only_config()).preprocess("hello")


def test_decoder_only_drops_appended_eos(spm_bart_tokenizer, spm_tokenizer):
    inputs = InputPreprocessor(dec_only_config(), spm_bart_tokenizer).preprocess(TEXT)
    assert inputs.prompt_token_ids == [BOS] + spm_tokenizer.encode(TEXT)


def test_precomputed_input_features_go_to_the_encoder_like_audio():
    from seq2seq_engine.config import ModelConfig
    from seq2seq_engine.inputs.preprocess import InputPreprocessor
    config = ModelConfig(model="w", vocab_size=100, max_target_positions=32, is_encoder_decoder=True,
                         max_source_positions=6, decoder_start_token_id=3, skip_tokenizer_init=True)
    features = np.ones((4, 12), dtype=np.float32)
    inputs = InputPreprocessor(config).preprocess(
        {"prompt_token_ids": [3, 7], "multi_modal_data": {"input_features": features}})
    assert inputs.encoder_prompt_token_ids == [0] * 6
    assert inputs.prompt_token_ids == [3, 7]
    assert inputs.multi_modal_data["input_features"] is features
    with pytest.raises(TypeError, match="input_features"):
        InputPreprocessor(config).preprocess(
            {"prompt_token_ids": [3], "multi_modal_data": {"input_features": np.ones(5)}})
