"""Turn user prompts into validated `EncoderDecoderInputs`: tokenize, apply decoder defaults, check limits."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

from seq2seq_engine.config import ModelConfig
from seq2seq_engine.inputs.data import EncoderDecoderInputs, SingletonInputs
from seq2seq_engine.inputs.parse import ParsedExplicitPrompt, ParsedSingletonPrompt, parse_prompt


class InputPreprocessor:
    """Preprocess prompts for one model (vLLM semantics for encoder/decoder models).

    Encoder/decoder model:
      * a singleton prompt (`str`, `TextPrompt`, `TokensPrompt`) is the ENCODER prompt; the decoder gets the
        default decoder prompt `[decoder_start_token_id, bos_token_id]` (`[decoder_start_token_id]` when the
        model has no bos token or does not start its decoder with it: Marian, M2M100/NLLB, Pegasus). The
        default decoder prompt has `prompt=None` (no text is invented for it).
      * an `ExplicitEncoderDecoderPrompt` gives both halves; `decoder_prompt=None` means the default.
      * a decoder prompt not starting with `decoder_start_token_id` gets it prepended; its `prompt` stays the
        text the user gave (the prepended token has no text).
      * audio (Whisper): a singleton prompt with `multi_modal_data={"audio": (array, sr)}` puts the audio in the
        encoder and uses the prompt's own text/tokens as the DECODER prompt; in an explicit prompt the encoder
        part carries the audio and the decoder is as given. The encoder inputs are `max_source_positions`
        placeholder zeros (one per encoder position) plus the multi-modal dict; audio is not processed here.
    Decoder-only model: a singleton prompt is the decoder prompt as is (nothing prepended), `encoder=None`.

    Tokenization: encoder text uses the tokenizer's default special tokens (BART: `<s> ... </s>`). Decoder
    text also does, except that the eos a tokenizer appends to every text (probed on "") is dropped, so
    generation continues the prompt instead of following an end-of-sequence (vLLM keeps it). Decoder text
    of an audio request is tokenized without special tokens: Whisper prompts spell out their own special
    tokens (as in vLLM).
    """

    def __init__(self, model_config: ModelConfig, tokenizer: Any = None) -> None:
        self.model_config = model_config
        self.tokenizer = None if model_config.skip_tokenizer_init else tokenizer
        self._appends_eos: Optional[bool] = None

    # ---------------------------------------------------------------- public API
    def preprocess(self, prompt: Any, sampling_params: Any = None) -> EncoderDecoderInputs:
        """Parse, tokenize and validate one prompt. `sampling_params.max_tokens` (if any) is length-checked."""
        parsed = parse_prompt(prompt)
        max_tokens = getattr(sampling_params, "max_tokens", None)
        if not self.model_config.is_encoder_decoder:
            return self._preprocess_decoder_only(parsed, max_tokens)
        if isinstance(parsed, ParsedExplicitPrompt):
            encoder, decoder = parsed.encoder, parsed.decoder
        elif parsed.has_audio:
            encoder, decoder = parsed, parsed
        else:
            encoder, decoder = parsed, None
        if decoder is not None and decoder is not encoder and decoder.multi_modal_data:
            raise ValueError("decoder_prompt.multi_modal_data is not supported; put the audio in encoder_prompt")
        encoder_inputs = self._encoder_inputs(encoder, is_singleton_audio=decoder is encoder)
        decoder_inputs = self._decoder_inputs(decoder, audio_request=encoder.has_audio)
        self.check_decoder_length(decoder_inputs, max_tokens, "decoder prompt")
        return EncoderDecoderInputs(decoder=decoder_inputs, encoder=encoder_inputs)

    def default_decoder_prompt_token_ids(self) -> List[int]:
        """`[decoder_start_token_id, bos_token_id]`, or `[decoder_start_token_id]` if the model has no bos or
        does not put it after the start token (`default_decoder_prompt_has_bos`)."""
        config = self.model_config
        if config.bos_token_id is None or not config.default_decoder_prompt_has_bos:
            return [config.decoder_start_token_id]
        return [config.decoder_start_token_id, config.bos_token_id]

    # ---------------------------------------------------------------- helpers
    def _preprocess_decoder_only(self, parsed: Any, max_tokens: Optional[int]) -> EncoderDecoderInputs:
        if isinstance(parsed, ParsedExplicitPrompt):
            raise ValueError(f"model {self.model_config.model!r} is decoder-only; explicit encoder/decoder prompts "
                             f"(encoder_prompt/decoder_prompt) are not supported")
        if parsed.multi_modal_data:
            raise ValueError(f"multi_modal_data is not supported: model {self.model_config.model!r} is decoder-only "
                             f"and has no encoder for audio")
        token_ids = self._token_ids(parsed, "prompt", drop_appended_eos=True)
        if not token_ids:
            raise ValueError("prompt is empty (no tokens); a decoder-only model needs at least one prompt token")
        self._check_vocab(token_ids, "prompt")
        decoder = SingletonInputs(prompt_token_ids=token_ids, prompt=parsed.text)
        self.check_decoder_length(decoder, max_tokens, "prompt")
        return EncoderDecoderInputs(decoder=decoder, encoder=None)

    def _check_modality(self, encoder: ParsedSingletonPrompt) -> None:
        """An audio model's encoder takes audio (or log-mel features) only; a text model's takes no audio."""
        model, takes_audio = self.model_config.model, self.model_config.takes_audio
        if takes_audio and not encoder.has_audio:
            raise ValueError(f"model {model!r} transcribes audio: its encoder prompt needs multi_modal_data "
                             f"{{'audio': (samples, sample_rate)}} or {{'input_features': ...}}, not text or token "
                             f"ids (llm.transcribe(...) takes files and arrays)")
        if encoder.has_audio and takes_audio is False:
            raise ValueError(f"multi_modal_data: model {model!r} takes no audio (its config has no num_mel_bins)")

    def _encoder_inputs(self, encoder: ParsedSingletonPrompt, is_singleton_audio: bool) -> SingletonInputs:
        limit = self.model_config.max_source_positions
        self._check_modality(encoder)
        if encoder.has_audio:
            text = None if is_singleton_audio else encoder.text
            return SingletonInputs(prompt_token_ids=[0] * limit, prompt=text,
                                   multi_modal_data=encoder.multi_modal_data)
        token_ids = self._token_ids(encoder, "encoder_prompt", drop_appended_eos=False)
        if not token_ids:
            raise ValueError("encoder_prompt is empty (no tokens); an encoder/decoder model needs an encoder input")
        if len(token_ids) > limit:
            raise ValueError(f"encoder_prompt has {len(token_ids)} tokens, longer than max_source_positions ({limit})")
        self._check_vocab(token_ids, "encoder_prompt")
        return SingletonInputs(prompt_token_ids=token_ids, prompt=encoder.text)

    def _decoder_inputs(self, decoder: Optional[ParsedSingletonPrompt], audio_request: bool) -> SingletonInputs:
        if decoder is None:
            return SingletonInputs(prompt_token_ids=self.default_decoder_prompt_token_ids())
        token_ids = self._token_ids(decoder, "decoder_prompt", drop_appended_eos=not audio_request,
                                    add_special_tokens=not audio_request)
        self._check_vocab(token_ids, "decoder_prompt")
        start = self.model_config.decoder_start_token_id
        # A Whisper prompt conditioned on previous text (<|startofprev|> ... <|startoftranscript|> ...) already
        # carries the start token after its context: keep it as given, as HF's Whisper generate does.
        keeps_start = audio_request and start in token_ids
        if not token_ids or (token_ids[0] != start and not keeps_start):
            token_ids = [start] + token_ids
        return SingletonInputs(prompt_token_ids=token_ids, prompt=decoder.text)

    def _token_ids(self, parsed: ParsedSingletonPrompt, field: str, drop_appended_eos: bool,
                   add_special_tokens: bool = True) -> List[int]:
        if parsed.kind == "tokens":
            return list(parsed.token_ids)
        return self._tokenize(parsed.text, field, drop_appended_eos, add_special_tokens)

    def _tokenize(self, text: str, field: str, drop_appended_eos: bool, add_special_tokens: bool) -> List[int]:
        if self.tokenizer is None:
            reason = "skip_tokenizer_init=True" if self.model_config.skip_tokenizer_init else "no tokenizer was given"
            raise ValueError(f"{field} is text but {reason}; pass prompt_token_ids instead")
        if add_special_tokens:
            token_ids = list(self.tokenizer.encode(text))
        else:
            token_ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if drop_appended_eos and add_special_tokens and token_ids and self._tokenizer_appends_eos():
            token_ids.pop()
        return token_ids

    def _tokenizer_appends_eos(self) -> bool:
        """Whether `tokenizer.encode(text)` ends every text with eos (BART, T5); probed once on the empty text."""
        if self._appends_eos is None:
            eos_id = getattr(self.tokenizer, "eos_token_id", None)
            empty = list(self.tokenizer.encode(""))
            self._appends_eos = eos_id is not None and bool(empty) and empty[-1] == eos_id
        return self._appends_eos

    def _check_vocab(self, token_ids: Sequence[int], field: str) -> None:
        vocab_size = self.model_config.vocab_size
        for index, token_id in enumerate(token_ids):
            if not 0 <= token_id < vocab_size:
                raise ValueError(f"{field} token id {token_id} at position {index} is outside [0, vocab_size) "
                                 f"= [0, {vocab_size})")

    def check_decoder_length(self, decoder: SingletonInputs, max_tokens: Optional[int],
                             field: str = "decoder prompt") -> None:
        """ValueError when the decoder prompt, or it plus max_tokens new tokens, exceeds the model's positions."""
        limit, length = self.model_config.max_target_positions, len(decoder.prompt_token_ids)
        if length > limit:
            raise ValueError(f"{field} has {length} tokens, longer than max_target_positions ({limit})")
        if max_tokens is not None and length + max_tokens > limit:
            raise ValueError(f"{field} length ({length}) + max_tokens ({max_tokens}) = {length + max_tokens} is "
                             f"longer than max_target_positions ({limit})")
