"""The LLM class: offline batched generation over an LLMEngine, outputs in input order."""
from __future__ import annotations

import itertools
from typing import Any, List, Optional, Sequence as Seq, Union

from tqdm.auto import tqdm

from seq2seq_engine.engine.arg_utils import EngineArgs
from seq2seq_engine.engine.llm_engine import LLMEngine
from seq2seq_engine.outputs import RequestOutput
from seq2seq_engine.sampling_params import SamplingParams


class LLM:
    """`LLM(model="path/to/model_dir", dtype="float32", ...)`; keyword arguments are EngineArgs fields."""

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.llm_engine = LLMEngine.from_engine_args(EngineArgs(model=model, **kwargs))
        self._request_counter = itertools.count()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def transcribe(self, audio, **kwargs):
        """Transcribe (or translate) audio with a Whisper model: one TranscriptionResult per input, in input order.
        Keyword arguments: see seq2seq_engine.transcription.transcribe (language, task, timestamps,
        condition_on_previous_text, max_new_tokens, use_tqdm, max_in_flight, skip_silence)."""
        from seq2seq_engine.transcription import transcribe
        return transcribe(self, audio, **kwargs)

    def generate(self, prompts: Any, sampling_params: Optional[Union[SamplingParams, Seq[SamplingParams]]] = None,
                 use_tqdm: bool = True, priority: Optional[List[int]] = None) -> List[RequestOutput]:
        """Generate for one prompt or a list; `sampling_params` is one object or one per prompt."""
        prompt_list = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        params_list = self._params_per_prompt(sampling_params, len(prompt_list))
        if priority is not None and len(priority) != len(prompt_list):
            raise ValueError(f"priority has {len(priority)} entries for {len(prompt_list)} prompts")
        request_ids = []
        try:
            for index, (prompt, params) in enumerate(zip(prompt_list, params_list)):
                request_id = str(next(self._request_counter))
                self.llm_engine.add_request(request_id, prompt, params,
                                            priority=priority[index] if priority else 0)
                request_ids.append(request_id)
        except Exception:
            self.llm_engine.abort_request(request_ids)
            raise
        return self._run_engine(request_ids, use_tqdm)

    @staticmethod
    def _params_per_prompt(sampling_params, num_prompts: int) -> List[SamplingParams]:
        if sampling_params is None:
            return [SamplingParams()] * num_prompts
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * num_prompts
        if len(sampling_params) != num_prompts:
            raise ValueError(f"got {len(sampling_params)} sampling_params for {num_prompts} prompts; "
                             f"pass one SamplingParams or one per prompt")
        return list(sampling_params)

    def _run_engine(self, request_ids: List[str], use_tqdm: bool) -> List[RequestOutput]:
        finished = {}
        progress = tqdm(total=len(request_ids), desc="Processed prompts", unit="req", disable=not use_tqdm)
        try:
            while self.llm_engine.has_unfinished_requests():
                for output in self.llm_engine.step():
                    if output.finished and output.request_id not in finished:
                        finished[output.request_id] = output
                        progress.update(1)
        except BaseException:
            self.llm_engine.abort_request(request_ids)
            raise
        finally:
            progress.close()
        return [finished[request_id] for request_id in request_ids]
