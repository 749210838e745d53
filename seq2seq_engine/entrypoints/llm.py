"""The LLM class: offline batched generation over an LLMEngine, outputs in input order."""
from __future__ import annotations

import itertools
from typing import Any, Iterable, List, Mapping, Optional, Sequence as Seq, Union

from tqdm.auto import tqdm

from seq2seq_engine.beam_search_params import BeamSearchParams
from seq2seq_engine.engine.arg_utils import EngineArgs
from seq2seq_engine.engine.llm_engine import LLMEngine
from seq2seq_engine.lora_request import LoRARequest
from seq2seq_engine.outputs import RequestOutput
from seq2seq_engine.sampling_params import SamplingParams


class LLM:
    """`LLM(model="path/to/model_dir", dtype="float32", ...)`; keyword arguments are EngineArgs fields."""

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.llm_engine = LLMEngine.from_engine_args(EngineArgs(model=model, **kwargs))
        self._request_counter = itertools.count()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def translation_prompts(self, prompts: Any, src_lang: Optional[str] = None,
                            tgt_lang: Optional[str] = None) -> list:
        """`prompts` (one or a list) as translation requests for this model: the tokenizer set to `src_lang` and
        `tgt_lang` put where the family expects it (mBART/M2M100/NLLB: the decoder prompt after decoder_start;
        Marian: a `>>xx<<` token before the source); see seq2seq_engine.tokenization.languages."""
        from seq2seq_engine.tokenization.languages import translation_languages
        model_type = getattr(self.llm_engine.hf_config, "model_type", None)
        languages = translation_languages(self.get_tokenizer(), src_lang, tgt_lang, model_type)
        return list(languages.prompts(_as_prompt_list(prompts)))

    def transcribe(self, audio, options=None, **overrides):
        """Transcribe (or translate) audio with a Whisper model: one TranscriptionResult per input, in input order.
        `options` is a TranscriptionOptions; keyword overrides replace its fields (language, task, timestamps,
        temperature, beam_width, initial_prompt, clip_timestamps, vad_filter, word_timestamps, ...): see
        seq2seq_engine.transcription.transcribe."""
        from seq2seq_engine.transcription import transcribe
        return transcribe(self, audio, options, **overrides)

    def iter_transcribe(self, audio, options=None, **overrides):
        """As `transcribe` (same `options` and overrides), but yields `(input index, TranscriptionResult)` for each
        input as soon as it finishes."""
        from seq2seq_engine.transcription import iter_transcribe
        return iter_transcribe(self, audio, options, **overrides)

    def generate(self, prompts: Any, sampling_params: Optional[Union[SamplingParams, dict, Seq[Any]]] = None,
                 use_tqdm: bool = True, priority: Optional[List[int]] = None,
                 lora_request: Optional[Union[LoRARequest, Seq[Optional[LoRARequest]]]] = None) -> List[RequestOutput]:
        """Generate for one prompt or a list; `sampling_params` is one object or one per prompt, and so is
        `lora_request` (the LoRA adapter each prompt runs with; needs enable_lora=True). With n/best_of > 1
        each output holds the n most likely of best_of sampled sequences. `None` follows the model's
        generation_config.json (as HF `generate`: beam search when it sets num_beams > 1); a dict follows it with
        the dict's fields overridden (e.g. `{"max_tokens": 64}`)."""
        prompt_list = _as_prompt_list(prompts)
        if sampling_params is None or isinstance(sampling_params, dict):
            params_list = [sampling_params] * len(prompt_list)
        else:
            params_list = _params_per_prompt(sampling_params, len(prompt_list), (SamplingParams, dict),
                                             "sampling_params")
        return self._run_engine(self._add_requests(prompt_list, params_list, priority, lora_request), use_tqdm)

    def beam_search(self, prompts: Any, params: Union[BeamSearchParams, Seq[BeamSearchParams]],
                    use_tqdm: bool = True, lora_request: Optional[Union[LoRARequest, Seq[Any]]] = None
                    ) -> List[RequestOutput]:
        """Beam search for one prompt or a list, in input order: each output holds beam_width hypotheses, best
        first by cumulative_logprob / generated_len ** length_penalty (CompletionOutput.beam_score). `lora_request`:
        one adapter, or one per prompt."""
        prompt_list = _as_prompt_list(prompts)
        if params is None:
            raise TypeError("beam_search needs BeamSearchParams (beam_width, max_tokens, ...)")
        params_list = _params_per_prompt(params, len(prompt_list), (BeamSearchParams,), "params")
        return self._run_engine(self._add_requests(prompt_list, params_list, None, lora_request), use_tqdm)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block and encoder output (vLLM's name); False while requests are running."""
        return self.llm_engine.reset_prefix_cache()

    def _add_requests(self, prompt_list: list, params_list: list, priority: Optional[List[int]],
                      lora_request: Any = None) -> List[str]:
        """Queue every prompt; if one is refused, the ones already queued are aborted."""
        if priority is not None and len(priority) != len(prompt_list):
            raise ValueError(f"priority has {len(priority)} entries for {len(prompt_list)} prompts")
        adapters = _adapters_per_prompt(lora_request, len(prompt_list))
        request_ids = []
        try:
            for index, (prompt, params) in enumerate(zip(prompt_list, params_list)):
                request_id = str(next(self._request_counter))
                self.llm_engine.add_request(request_id, prompt, params, priority=priority[index] if priority else 0,
                                            lora_request=adapters[index])
                request_ids.append(request_id)
        except Exception:
            self.llm_engine.abort_request(request_ids)
            raise
        return request_ids

    def _run_engine(self, request_ids: List[str], use_tqdm: bool) -> List[RequestOutput]:
        finished = {}
        progress = tqdm(total=len(request_ids), desc="Processed prompts", unit="req", disable=not use_tqdm)
        try:
            while self.llm_engine.has_unfinished_requests():
                for output in self.llm_engine.step(finished_only=True):
                    if output.finished and output.request_id not in finished:
                        finished[output.request_id] = output
                        progress.update(1)
        except BaseException:
            self.llm_engine.abort_request(request_ids)
            raise
        finally:
            progress.close()
        return [finished[request_id] for request_id in request_ids]


def _as_prompt_list(prompts: Any) -> list:
    """One prompt (a str or a prompt dict) or an iterable of them, as a list; a TypeError names what is wrong."""
    if isinstance(prompts, (str, Mapping)):
        return [prompts]
    if isinstance(prompts, (bytes, bytearray)) or not isinstance(prompts, Iterable):
        raise TypeError(f"prompts must be a str, a prompt dict or a list of them, got {type(prompts).__name__}")
    prompt_list = list(prompts)
    for index, prompt in enumerate(prompt_list):
        if not isinstance(prompt, (str, Mapping)):
            raise TypeError(f"prompts[{index}] must be a str or a prompt dict, got {type(prompt).__name__}")
    return prompt_list


def _adapters_per_prompt(lora_request: Any, num_prompts: int) -> list:
    """One LoRARequest (or None) per prompt, from one or a list of one per prompt."""
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * num_prompts
    if isinstance(lora_request, (list, tuple)):
        if len(lora_request) != num_prompts:
            raise ValueError(f"got {len(lora_request)} lora_request entries for {num_prompts} prompts")
        for index, entry in enumerate(lora_request):
            if entry is not None and not isinstance(entry, LoRARequest):
                raise TypeError(f"lora_request[{index}] must be a LoRARequest or None, got {type(entry).__name__}")
        return list(lora_request)
    raise TypeError(f"lora_request must be a LoRARequest or a list of them, got {type(lora_request).__name__}")


def _params_per_prompt(params, num_prompts: int, types: tuple, argument: str) -> list:
    """One params object for every prompt, from one object or one per prompt (each an instance of `types`)."""
    names = " or ".join(t.__name__ for t in types)
    if isinstance(params, types):
        return [params] * num_prompts
    if isinstance(params, (list, tuple)):
        if len(params) != num_prompts:
            raise ValueError(f"got {len(params)} {argument} for {num_prompts} prompts; pass one {names} or one per "
                             f"prompt")
        if all(isinstance(p, types) for p in params):
            return list(params)
    raise TypeError(f"{argument} must be a {names} or a list of them, got {type(params).__name__}")
