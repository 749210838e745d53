"""Ray Data batch inference: one engine per actor, each batch of rows fed into its continuous batch at once.

    import ray
    from seq2seq_engine.integrations.ray_data import ReplicaConfig, TranscribeBatch

    config = ReplicaConfig("whisper-tiny.en", engine_kwargs={"kv_cache_space_gb": 1.0})
    ds = ray.data.from_items([{"path": p} for p in paths])
    ds = ds.map_batches(TranscribeBatch, fn_constructor_kwargs={"config": config},
                        compute=ray.data.ActorPoolStrategy(size=4), num_cpus=2, batch_size=16)
    for row in ds.iter_rows(): row["text"], row["segments"], row["error"]

TranscribeBatch reads audio rows (`path` or `bytes`, optional `language`, `task`, `options`: a dict of
TranscriptionOptions fields) and writes `source, text, language, language_probability, duration, segments, words,
error`. GenerateBatch reads prompt rows (`prompt`, `prompt_token_ids`, `encoder_prompt`/`decoder_prompt` or
`prompt_json`, and optional sampling fields such as `max_tokens`, `temperature`) and writes `prompt_text, text,
token_ids, finish_reason, cumulative_logprob, alternatives, error`. Rows of both may name a LoRA adapter in a `lora`
column (a name of ReplicaConfig.lora_modules or an adapter directory; none: ReplicaConfig.lora); rows of different
adapters share the replica's continuous batch. Other input columns pass through. A row that cannot be run carries its
error and the others are unaffected. Neither class imports ray: they are plain callables.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from seq2seq_engine.engine_port import EnginePort
from seq2seq_engine.integrations.adapters import AdaptedPrompt, AdapterEngine, AdapterTable, lora_engine_kwargs
from seq2seq_engine.integrations.rows import (AUDIO_OUTPUT_COLUMNS, BYTES_LABEL, PROMPT_OUTPUT_COLUMNS, audio_options,
                                              audio_source, batch_to_rows, error_row, output_to_row,
                                              passthrough_columns, prompt_of_row, relabel, result_to_row, rows_to_batch,
                                              sampling_of_row)
from seq2seq_engine.transcription.options import TranscriptionOptions


@dataclasses.dataclass(frozen=True)
class ReplicaConfig:
    """What each replica (Ray actor) runs: `model` (a directory or packaged name, resolved on the replica's node),
    `engine_kwargs` (LLM keyword arguments: dtype, kv_cache_space_gb, max_num_seqs, ...), the defaults of its rows:
    `transcription` (TranscriptionOptions of audio rows; progress bars are off on replicas) and `sampling` (the
    sampling overrides of prompt rows, over the model's generation_config.json), for translation `src_lang` /
    `tgt_lang` (language codes as `seq2seq-engine translate` takes them), `working_dir`: the folder relative
    audio and adapter paths are read from (None: the actor's own working folder, which Ray chooses), and the LoRA
    adapters: `lora_modules` ({name: PEFT adapter directory}) that rows name in their `lora` column, and `lora`
    (a name of lora_modules or a directory) for rows that name none. With adapters the engine is built with
    enable_lora and a max_lora_rank that fits them, unless `engine_kwargs` sets those; a bad `lora` fails the
    replica at start, a bad adapter a row names fails that row."""

    model: str
    engine_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    transcription: Optional[TranscriptionOptions] = None
    sampling: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    src_lang: Optional[str] = None
    tgt_lang: Optional[str] = None
    working_dir: Optional[str] = None
    lora: Optional[str] = None
    lora_modules: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must be a model directory or packaged name, got {self.model!r}")
        if self.transcription is not None and not isinstance(self.transcription, TranscriptionOptions):
            raise TypeError(f"transcription must be a TranscriptionOptions, got {type(self.transcription).__name__}")

    def build_engine(self) -> EnginePort:
        """The replica's LLMEngine (what LLM(model, **engine_kwargs) would hold); its actors use it as an
        EnginePort."""
        from seq2seq_engine.engine.arg_utils import EngineArgs
        from seq2seq_engine.engine.llm_engine import LLMEngine
        named = self.lora is not None and self.lora in self.lora_modules
        paths = [*self.lora_modules.values(), *([self.lora] if self.lora is not None and not named else [])]
        kwargs = lora_engine_kwargs([os.path.join(self.working_dir or "", path) for path in paths], self.engine_kwargs)
        return LLMEngine.from_engine_args(EngineArgs(model=self.model, **kwargs))

    def adapter_table(self, engine: EnginePort) -> AdapterTable:
        """The adapters the replica's rows run with (the default one read now)."""
        return AdapterTable(engine, self.lora_modules, self.lora, self.working_dir)


class TranscribeBatch:
    """`ds.map_batches(TranscribeBatch, fn_constructor_kwargs={"config": ReplicaConfig(...)}, ...)`: audio rows to
    transcripts. The rows of a batch that share their options (and adapter) are one transcription job, and the jobs
    of a batch run together (every window of every file in one continuous batch); a file's windows stay on this
    replica."""

    def __init__(self, config: ReplicaConfig) -> None:
        if config.working_dir is not None:
            os.chdir(config.working_dir)  # this actor's own process
        self.engine = config.build_engine()
        self.adapters = config.adapter_table(self.engine)
        self.options = dataclasses.replace(config.transcription or TranscriptionOptions(), use_tqdm=False)

    def __call__(self, batch: Mapping[str, Any]) -> Dict[str, list]:
        rows = batch_to_rows(batch)
        outputs: List[Optional[Dict[str, Any]]] = [None] * len(rows)
        groups: Dict[str, tuple] = {}  # repr(options) -> (options, row positions, sources, labels of bytes)
        for position, row in enumerate(rows):
            try:
                source, options = audio_source(row), self._options(row)
            except (ValueError, TypeError) as error:
                outputs[position] = error_row(str(error))
                continue
            group = groups.setdefault(repr(options), (options, [], [], []))
            group[1].append(position)
            group[2].append(source)
            group[3].append(None if isinstance(source, str) else row.get("path") or BYTES_LABEL)
        self._transcribe(list(groups.values()), outputs)
        columns = passthrough_columns(batch, AUDIO_OUTPUT_COLUMNS)
        return rows_to_batch([{**row, **output} for row, output in zip(rows, outputs)], columns)

    def _options(self, row: Mapping[str, Any]) -> TranscriptionOptions:
        options = audio_options(self.options, row)
        adapter = self.adapters.request_for(row.get("lora"))
        return options if adapter is None else dataclasses.replace(options, lora_request=adapter)

    def _transcribe(self, groups: List[tuple], outputs: List[Optional[Dict[str, Any]]]) -> None:
        from seq2seq_engine.transcription.job import TranscriptionJob
        jobs = []
        for options, positions, sources, labels in groups:
            try:
                jobs.append((TranscriptionJob(self.engine, sources, options), positions, labels))
            except (ValueError, TypeError) as error:  # options this model refuses (e.g. a task it has no token for)
                for position in positions:
                    outputs[position] = error_row(str(error))
        ran = run_together(self.engine, [job for job, _, _ in jobs])
        for (_, positions, labels), (finished, error) in zip(jobs, ran):
            for index, result in finished:
                if labels[index] is not None:  # bytes: named by the row, not by their place in this batch
                    result = relabel(result, labels[index])
                outputs[positions[index]] = result_to_row(result)
            for position in positions:
                if outputs[position] is None:
                    outputs[position] = error_row(str(error))


def run_together(engine: EnginePort, jobs: Sequence[Any]) -> List[Tuple[List[Tuple[int, Any]], Any]]:
    """Drive TranscriptionJobs on one engine at once, their requests in one continuous batch (as the server's engine
    loop does); per job, its (input index, result) pairs and the ValueError/TypeError that stopped it (None)."""
    finished: List[List[Tuple[int, Any]]] = [[] for _ in jobs]
    errors: List[Any] = [None] * len(jobs)
    running = dict(enumerate(jobs))

    def guarded(position: int, method: Any, *args: Any) -> bool:
        try:
            method(*args)
            return True
        except (ValueError, TypeError) as error:
            errors[position] = error
            failed = running.pop(position)
            failed.abort()
            failed.close()
            return False

    try:
        while running:
            for position, job in list(running.items()):
                if guarded(position, job.fill) and not job.in_flight:
                    finished[position] += job.take_finished()
                    running.pop(position).close()
            if not running:
                break
            for output in engine.step(finished_only=True):
                owner = next((position for position, job in running.items() if job.owns(output.request_id)), None)
                if owner is not None:
                    guarded(owner, running[owner].on_output, output)
            for position, job in list(running.items()):
                if guarded(position, job.end_of_step):
                    finished[position] += job.take_finished()
    finally:
        for job in running.values():
            job.abort()
            job.close()
    return list(zip(finished, errors))


class GenerateBatch:
    """`ds.map_batches(GenerateBatch, fn_constructor_kwargs={"config": ReplicaConfig(...)}, ...)`: prompt rows to
    generations. Every prompt of a batch is queued in the engine at once; a prompt the engine refuses gets its error
    in its row."""

    def __init__(self, config: ReplicaConfig) -> None:
        from seq2seq_engine.tokenization.languages import translation_languages
        self.engine = config.build_engine()
        self.adapters = config.adapter_table(self.engine)
        self.sampling = dict(config.sampling)
        model_type = getattr(self.engine.hf_config, "model_type", None)
        # checks the languages now, before any batch
        self.languages = translation_languages(self.engine.tokenizer, config.src_lang, config.tgt_lang, model_type)

    def __call__(self, batch: Mapping[str, Any]) -> Dict[str, list]:
        from seq2seq_engine.engine.streaming import StreamError, stream_in_order
        from seq2seq_engine.output_records import result_fields

        rows = batch_to_rows(batch)
        outputs: List[Optional[Dict[str, Any]]] = [None] * len(rows)
        positions, prompts, params, adapters = [], [], [], []
        for position, row in enumerate(rows):
            try:
                prompt, adapter = prompt_of_row(row), self.adapters.request_for(row.get("lora"))
            except (ValueError, TypeError) as error:
                outputs[position] = {"error": str(error)}
                continue
            positions.append(position)
            prompts.append(prompt)
            adapters.append(adapter)
            params.append(sampling_of_row(self.sampling, row))
        if positions:
            adapted = (AdaptedPrompt(prompt, adapter)
                       for prompt, adapter in zip(self.languages.prompts(prompts), adapters))
            engine = AdapterEngine(self.engine)  # each request with its row's adapter
            for index, item in stream_in_order(engine, zip(adapted, params), max_in_flight=len(positions)):
                is_error = isinstance(item, StreamError)
                outputs[positions[index]] = {"error": item.error} if is_error else output_to_row(result_fields(item))
        columns = passthrough_columns(batch, PROMPT_OUTPUT_COLUMNS)
        return rows_to_batch([{**row, **output} for row, output in zip(rows, outputs)], columns)
