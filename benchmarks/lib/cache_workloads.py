"""`cache_reuse.py`'s child-process runners for Whisper (plain, word timestamps, language detection) and the SmolLM2
chat batch, each on a fresh engine with its cache on or off; their inputs (clips by language, the chat prompts)."""
from __future__ import annotations

import dataclasses
import resource
import statistics
import time
from typing import Callable, Dict, List, Tuple

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
import numpy as np
import torch
import transformers

from benchmarks.lib.cache_texts import CHAT_QUESTIONS, SYSTEM_PROMPT, WARMUP_QUESTIONS
from benchmarks.lib.common import EngineRun, timed_run
from seq2seq_engine import LLM, SamplingParams
from seq2seq_engine.audio import SAMPLE_RATE

WHISPER_MODES = ("plain", "words", "detect")   # language given; + word timestamps; language detected


@dataclasses.dataclass
class CacheRun(EngineRun):
    """One timed run of one configuration, with its counters (encoder runs, prefix hits, TTFTs, ...)."""

    stats: Dict[str, object] = dataclasses.field(default_factory=dict)


def measured(engine: str, dtype: str, run_once: Callable[[], list]) -> CacheRun:
    """One timed run (a second one would find the first's content cached) as a CacheRun; stats["cpu_s"]: the
    process's CPU time in it (all threads), which other processes' load inflates less than the wall time."""
    start = resource.getrusage(resource.RUSAGE_SELF)
    base = timed_run(engine, dtype, 1, run_once)
    end = resource.getrusage(resource.RUSAGE_SELF)
    run = CacheRun(**{field.name: getattr(base, field.name) for field in dataclasses.fields(EngineRun)})
    run.stats["cpu_s"] = (end.ru_utime - start.ru_utime) + (end.ru_stime - start.ru_stime)
    return run


def cache_label(cache_on: bool) -> str:
    return "on" if cache_on else "off"


# ---------------------------------------------------------------------------------------------- Whisper
@dataclasses.dataclass
class WhisperCacheJob:
    hf_dir: str
    groups: List[Tuple[str, List[np.ndarray]]]   # (language code, its clips): one transcribe call each
    threads: int = 2
    warmup: bool = True


def clip_groups(clips) -> List[Tuple[str, List[np.ndarray]]]:
    """The clips (lib/clips.py) grouped by their folder's language, in order."""
    groups: Dict[str, List[np.ndarray]] = {}
    for clip in clips:
        groups.setdefault(clip.language, []).append(clip.samples)
    return list(groups.items())


def whisper_label(mode: str, cache_on: bool) -> str:
    return f"whisper {mode} cache {cache_label(cache_on)}"


@dataclasses.dataclass
class RoundRun(CacheRun):
    """One process's round of several configurations: wall = their total, configs = each one's run."""

    configs: Dict[str, CacheRun] = dataclasses.field(default_factory=dict)


def transcribe_groups(llm, job: WhisperCacheJob, mode: str, scale: float, counts: Dict[str, list]) -> List[str]:
    """Every language group (its clips times `scale`) through `llm.transcribe`, greedy (one decoding per window),
    the language given (plain, words) or detected (detect); the detected languages and the words go to `counts`."""
    texts = []
    for language, clips in job.groups:
        results = llm.transcribe([(clip * scale, SAMPLE_RATE) for clip in clips], temperature=0.0, beam_width=1,
                                 use_tqdm=False, language=None if mode == "detect" else language,
                                 word_timestamps=mode == "words")
        errors = [r.error for r in results if r.error]
        if errors:
            raise RuntimeError(f"{len(errors)} transcription errors, first: {errors[0]}")
        counts["languages"] += [(r.language, language) for r in results]
        counts["words"] += [len(s.words or []) for r in results for s in r.segments]
        texts += [r.text.strip() for r in results]
    return texts


def whisper_config_run(llm, job: WhisperCacheJob, mode: str, cache_on: bool, scale: float) -> CacheRun:
    counts: Dict[str, list] = {"languages": [], "words": []}
    runner = llm.llm_engine.model_runner
    encoder_runs = runner.num_encoder_runs
    run = measured(mode, cache_label(cache_on), lambda: transcribe_groups(llm, job, mode, scale, counts))
    run.stats.update(encoder_runs=runner.num_encoder_runs - encoder_runs, words=sum(counts["words"]),
                     languages_right=sum(found == given for found, given in counts["languages"]),
                     clips=len(counts["languages"]))
    return run


def run_whisper_round(job: WhisperCacheJob, round_index: int) -> RoundRun:
    """One round in this process: an engine with the encoder cache on and one with it off, each warmed up in every
    mode on a quieter copy of the first language's clips, then every mode on each engine in turn (plain on, plain
    off, words on, ...), the modes' order rotated by `round_index` so that none is always the first. Each mode's
    audio is the clips times its own factor (0.998, 0.996, 0.994: the same speech, other features), so no run finds
    an earlier run's windows cached; on and off of one mode read the same audio."""
    torch.set_num_threads(job.threads)
    engines = {on: LLM(job.hf_dir, enable_encoder_cache=on) for on in (True, False)}
    if job.warmup:
        warmup = dataclasses.replace(job, groups=job.groups[:1])
        for llm in engines.values():
            for mode in WHISPER_MODES:
                transcribe_groups(llm, warmup, mode, 0.5, {"languages": [], "words": []})
    configs = {}
    shift = round_index % len(WHISPER_MODES)
    for mode in WHISPER_MODES[shift:] + WHISPER_MODES[:shift]:
        scale = 1.0 - 0.002 * (WHISPER_MODES.index(mode) + 1)
        for on, llm in engines.items():
            configs[whisper_label(mode, on)] = whisper_config_run(llm, job, mode, on, scale)
    total = sum(run.wall for run in configs.values())
    return RoundRun("whisper", "round", total, [], walls=[total], configs=configs,
                    load_rss_mib=min(run.load_rss_mib for run in configs.values()),
                    run_peak_rss_mib=max(run.run_peak_rss_mib for run in configs.values()))


# ---------------------------------------------------------------------------------------------- chat
@dataclasses.dataclass
class ChatJob:
    model_dir: str
    prompts: List[List[int]]
    warmup_prompts: List[List[int]]
    new_tokens: int = 64
    threads: int = 2
    shared_prefix_tokens: int = 0


def chat_prompt_ids(tokenizer, system: str, question: str) -> List[int]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=False))


def chat_job(model_dir: str, num_requests: int, new_tokens: int, threads: int) -> ChatJob:
    """`num_requests` different questions after the one system prompt, through the model's chat template."""
    if num_requests > len(CHAT_QUESTIONS):
        raise ValueError(f"at most {len(CHAT_QUESTIONS)} chat requests, got {num_requests}")
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    prompts = [chat_prompt_ids(tokenizer, SYSTEM_PROMPT, q) for q in CHAT_QUESTIONS[:num_requests]]
    warmup = [chat_prompt_ids(tokenizer, "You are a helpful assistant.", q) for q in WARMUP_QUESTIONS]
    shared = min(next((i for i, ids in enumerate(zip(*prompts)) if len(set(ids)) > 1), len(p)) for p in prompts)
    return ChatJob(model_dir, prompts, warmup, new_tokens, threads, shared)


def step_all(engine, prompts: List[List[int]], params: SamplingParams, first_token_s: Dict[str, float]
             ) -> List[List[int]]:
    """Every prompt queued at once, then the engine stepped until all finish; the seconds from the start to the
    step that returned each request's first token go into `first_token_s`."""
    start = time.perf_counter()
    request_ids = [f"chat-{i}" for i in range(len(prompts))]
    for request_id, prompt in zip(request_ids, prompts):
        engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
    finished = {}
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter() - start
        for output in outputs:
            if output.request_id not in first_token_s and output.outputs and output.outputs[0].token_ids:
                first_token_s[output.request_id] = now
            if output.finished:
                finished[output.request_id] = list(output.outputs[0].token_ids)
    return [finished[request_id] for request_id in request_ids]


def run_chat(job: ChatJob, cache_on: bool) -> CacheRun:
    """The chat batch through one LLMEngine stepped here, automatic prefix caching on or off."""
    torch.set_num_threads(job.threads)
    llm = LLM(job.model_dir, enable_prefix_caching=cache_on)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=job.new_tokens, min_tokens=job.new_tokens)
    llm.generate([{"prompt_token_ids": p} for p in job.warmup_prompts],
                 SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
    prefix_cache = engine.scheduler.block_manager.prefix_cache
    hits = prefix_cache.num_hit_tokens if prefix_cache else 0
    first_token_s: Dict[str, float] = {}
    run = measured("chat", cache_label(cache_on), lambda: step_all(engine, job.prompts, params, first_token_s))
    ttfts = sorted(first_token_s.values())
    run.stats.update(ttft_p50_s=statistics.median(ttfts), ttft_p90_s=ttfts[int(0.9 * (len(ttfts) - 1))],
                     generated_tokens=sum(len(o) for o in run.outputs),
                     prefix_hit_tokens=(prefix_cache.num_hit_tokens - hits) if prefix_cache else 0,
                     prompt_tokens=sum(len(p) for p in job.prompts))
    return run
