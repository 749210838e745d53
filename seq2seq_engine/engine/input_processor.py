"""The one input processor: (prompt, params, model) to a validated request, or an error naming the field.

Every way in (`LLM`, the server, Ray, transcription jobs) goes through `LLMEngine.add_request`, which asks this
object; nothing reaches the scheduler before it has checked the prompt against the model (modality, form, lengths,
vocabulary) and the parameters against the engine (beam width, best_of, logprobs, tokenizer-only options).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Union

from seq2seq_engine.audio import encoder_window_samples, load_audio, log_mel_spectrogram
from seq2seq_engine.beam_search_params import BeamSearchParams
from seq2seq_engine.config import ModelConfig, SchedulerConfig
from seq2seq_engine.errors import ParameterError
from seq2seq_engine.generation_defaults import GenerationDefaults
from seq2seq_engine.inputs.data import EncoderDecoderInputs
from seq2seq_engine.inputs.preprocess import InputPreprocessor
from seq2seq_engine.sampling.logits_processors import tokenize_bad_words
from seq2seq_engine.sampling_params import SamplingParams

RequestParams = Optional[Union[SamplingParams, BeamSearchParams, Dict[str, Any]]]


@dataclasses.dataclass(frozen=True)
class ProcessedRequest:
    """A request ready for the scheduler: its inputs (audio already turned into features), its sampling
    parameters, and the beam search parameters when it is one."""
    inputs: EncoderDecoderInputs
    params: SamplingParams
    beam_params: Optional[BeamSearchParams]


class InputProcessor:
    """Validates and prepares requests for one engine's model."""

    def __init__(self, model_config: ModelConfig, scheduler_config: SchedulerConfig, tokenizer: Any,
                 generation_defaults: GenerationDefaults) -> None:
        self.model_config = model_config
        self.scheduler_config = scheduler_config
        self.tokenizer = tokenizer
        self.preprocessor = InputPreprocessor(model_config, tokenizer)
        self.generation_defaults = generation_defaults

    def process(self, prompt: Any, params: RequestParams = None) -> ProcessedRequest:
        """`params=None` takes the model's generation_config.json defaults, a dict those defaults with its fields
        overridden; SamplingParams or BeamSearchParams are taken as given."""
        inputs = None
        if params is None or isinstance(params, dict):
            inputs = self.preprocessor.preprocess(prompt)
            params = self.generation_defaults.request_params(
                len(inputs.decoder.prompt_token_ids), self.model_config.max_model_len, **(params or {}))
            # The file's lengths are capped to the model; an overridden max_tokens may not be.
            self.preprocessor.check_decoder_length(inputs.decoder, params.max_tokens)
        beam_params = None
        if isinstance(params, BeamSearchParams):
            self._check_beam_width(params)
            beam_params, params = params, params.to_sampling_params()
        elif not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, BeamSearchParams, a dict or None, got "
                            f"{type(params).__name__}")
        self._check_supported(params)
        params = self._with_processor_token_ids(params)
        if inputs is None:
            inputs = self.preprocessor.preprocess(prompt, params)
        self._check_prompt_hooks(params, len(inputs.decoder.prompt_token_ids))
        return ProcessedRequest(self._audio_to_features(inputs), params, beam_params)

    def _check_beam_width(self, params: BeamSearchParams) -> None:
        max_beam_width = self.scheduler_config.max_beam_width
        if params.beam_width > max_beam_width:
            raise ParameterError(f"beam_width={params.beam_width} exceeds max_beam_width={max_beam_width} "
                                 f"(an engine argument, at most max_num_seqs={self.scheduler_config.max_num_seqs})",
                                 "beam_width")

    def _check_supported(self, params: SamplingParams) -> None:
        """Options that this engine cannot honour fail loudly instead of being ignored."""
        if params.stop and self.tokenizer is None:
            raise ParameterError("stop strings need a tokenizer; this engine runs with skip_tokenizer_init=True",
                                 "stop")
        max_num_seqs = self.scheduler_config.max_num_seqs
        if params.best_of > max_num_seqs:
            raise ParameterError(f"best_of={params.best_of} exceeds max_num_seqs={max_num_seqs}: all of a request's "
                                 f"sequences run in the same step", "best_of")
        max_logprobs = self.model_config.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > max_logprobs:
                raise ParameterError(f"{name}={value} exceeds max_logprobs={max_logprobs} (an engine argument)", name)

    def _with_processor_token_ids(self, params: SamplingParams) -> SamplingParams:
        """Tokenize `bad_words` (into a copy of the params) and check every token id against the vocabulary."""
        if params.bad_words:
            if self.tokenizer is None:
                raise ParameterError("bad_words need a tokenizer; this engine runs with skip_tokenizer_init=True "
                                     "(pass token ids as bad_words_ids instead)", "bad_words")
            params = dataclasses.replace(
                params, _bad_words_token_ids=tokenize_bad_words(params.bad_words, self.tokenizer))
        params.verify_token_ids(self.model_config.vocab_size)
        return params

    @staticmethod
    def _check_prompt_hooks(params: SamplingParams, prompt_len: int) -> None:
        if any(position >= prompt_len for position, _ in params.prompt_logits_hooks or []):
            raise ParameterError(f"prompt_logits_hooks name positions {[p for p, _ in params.prompt_logits_hooks]}; "
                                 f"the decoder prompt has {prompt_len} tokens (positions 0 to {prompt_len - 1})",
                                 "prompt_logits_hooks")

    def _audio_to_features(self, inputs: EncoderDecoderInputs) -> EncoderDecoderInputs:
        """Raw audio in an encoder prompt becomes Whisper log-mel features once, at admission."""
        encoder = inputs.encoder
        if encoder is None or not encoder.multi_modal_data or "audio" not in encoder.multi_modal_data:
            return inputs
        num_mel_bins = getattr(self.model_config.hf_config, "num_mel_bins", None)
        if num_mel_bins is None:
            raise ValueError(f"model {self.model_config.model!r} takes no audio (its config has no num_mel_bins)")
        features = log_mel_spectrogram(load_audio(encoder.multi_modal_data["audio"]), n_mels=num_mel_bins,
                                       n_samples=encoder_window_samples(self.model_config.max_encoder_len))
        encoder = dataclasses.replace(encoder, multi_modal_data={"input_features": features})
        return dataclasses.replace(inputs, encoder=encoder)
