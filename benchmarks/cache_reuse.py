"""What the KV caches that keep content buy: each workload with the cache on and off, in one command (interleaved
rounds, a fresh process per run), plus HF `generate` where it applies.

    .venv/bin/python -m benchmarks.cache_reuse --rounds 3                    # whisper, chat and translate
    .venv/bin/python -m benchmarks.cache_reuse --workloads translate --shape small
    .venv/bin/python -m benchmarks.cache_reuse --quick                       # smoke run (~2 min)

whisper: whisper-base on the pytest-audioeval clips, one `llm.transcribe` call per language: plain (language
given), word timestamps, language detected; encoder cache on and off. chat: SmolLM2-135M-Instruct, requests sharing
one ~670-token system prompt, all queued at once; automatic prefix caching on and off; throughput and time to first
token. translate: one document into several languages with a random M2M100 (NLLB-600M's layers); encoder cache on
and off, and HF `generate` on the same weights.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Dict, List, Optional

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
from benchmarks.lib import cache_translation as translation
from benchmarks.lib.cache_workloads import (WHISPER_MODES, CacheRun, WhisperCacheJob, cache_label, chat_job,
                                            clip_groups, run_chat, run_whisper_round)
from benchmarks.lib.clips import load_clips
from benchmarks.lib.common import agreement, environment_line, print_markdown, print_run_header, try_isolated
from seq2seq_engine.audio import SAMPLE_RATE
from seq2seq_engine.model_loader.resolver import resolve_model_path

WORKLOADS = ("whisper", "chat", "translate")
Runs = Dict[str, List[CacheRun]]   # label -> its run of every round


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma list of " + ", ".join(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=3, help="every configuration this many times, interleaved")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--languages", default="all", help="whisper: comma list of clip languages, or all")
    parser.add_argument("--clips-per-language", type=int, default=0, help="whisper: the first N clips of each "
                        "language (0: all)")
    parser.add_argument("--chat-requests", type=int, default=64)
    parser.add_argument("--chat-new-tokens", type=int, default=64)
    parser.add_argument("--shape", choices=sorted(translation.SHAPES), default="full", help="translate: model shape")
    parser.add_argument("--doc-tokens", type=int, default=800)
    parser.add_argument("--target-languages", type=int, default=8)
    parser.add_argument("--translate-new-tokens", type=int, default=64)
    parser.add_argument("--no-hf", action="store_true", help="translate: skip HF generate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write every run's times and counters to this JSON file")
    parser.add_argument("--quick", action="store_true", help="smoke run: one English clip, 4 chat requests of 4 "
                        "tokens, a tiny translation model, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.languages, args.clips_per_language = 1, "en", 1
        args.chat_requests, args.chat_new_tokens = 4, 4
        args.shape, args.doc_tokens, args.target_languages, args.translate_new_tokens = "tiny", 96, 4, 8
    unknown = set(args.workloads.split(",")) - set(WORKLOADS)
    if unknown or args.rounds < 1:
        parser.error(f"unknown workloads {sorted(unknown)}" if unknown else "--rounds must be >= 1")
    return args


def interleaved(specs: list, rounds: int, failures: List[str]) -> Runs:
    """Every (label, target, args) once per round, the rounds one after the other; a failed one is not rerun."""
    runs: Runs = {label: [] for label, _, _ in specs}
    failed = set()
    for round_index in range(rounds):
        for label, target, target_args in specs:
            if label in failed:
                continue
            run = try_isolated(failures, f"{label} (round {round_index + 1}/{rounds})", target, *target_args)
            if run is None:
                failed.add(label)
            else:
                runs[label].append(run)
    return {label: label_runs for label, label_runs in runs.items() if label_runs}


def first_per_language(clips: list, limit: int) -> list:
    """The first `limit` clips of each language, in order."""
    taken: Dict[str, int] = {}
    kept = []
    for clip in clips:
        if taken.get(clip.language, 0) < limit:
            taken[clip.language] = taken.get(clip.language, 0) + 1
            kept.append(clip)
    return kept


def best(runs: List[CacheRun]) -> CacheRun:
    return min(runs, key=lambda run: run.wall)


def every_wall(runs: List[CacheRun]) -> str:
    return ", ".join(f"{run.wall:.2f}" for run in runs)


def ratio_cell(numerator: Optional[List[CacheRun]], denominator: Optional[List[CacheRun]]) -> str:
    """best wall / best wall, and the median of the per-round ratios (runs of one round ran back to back)."""
    if not numerator or not denominator:
        return ""
    rounds = sorted(a.wall / b.wall for a, b in zip(numerator, denominator))
    return f"{best(numerator).wall / best(denominator).wall:.3f} (rounds median {rounds[len(rounds) // 2]:.3f})"


def cpu_ratio_cell(numerator: Optional[List[CacheRun]], denominator: Optional[List[CacheRun]]) -> str:
    """least CPU time / least CPU time over the rounds, and the median of the per-round ratios."""
    if not numerator or not denominator:
        return ""
    rounds = sorted(a.stats["cpu_s"] / b.stats["cpu_s"] for a, b in zip(numerator, denominator))
    least = min(r.stats["cpu_s"] for r in numerator) / min(r.stats["cpu_s"] for r in denominator)
    return f"{least:.3f} (rounds median {rounds[len(rounds) // 2]:.3f})"


def least_cpu(runs: List[CacheRun]) -> str:
    return f"{min(run.stats['cpu_s'] for run in runs):.1f}"


def same_cell(runs: Optional[List[CacheRun]], reference: Optional[List[CacheRun]]) -> str:
    if not runs or not reference:
        return ""
    same, prefix = agreement(best(reference).outputs, best(runs).outputs)
    return f"{same:.0%} ({prefix:.1%})"


# ---------------------------------------------------------------------------------------------- workloads
def whisper_workload(args: argparse.Namespace, failures: List[str], summary: list) -> Runs:
    clips = load_clips("all", 0)
    if args.languages != "all":
        clips = [clip for clip in clips if clip.language in args.languages.split(",")]
    if args.clips_per_language:
        clips = first_per_language(clips, args.clips_per_language)
    job = WhisperCacheJob(resolve_model_path("whisper-base"), clip_groups(clips), args.threads)
    audio_s = sum(len(clip.samples) for clip in clips) / SAMPLE_RATE
    print(f"\n## whisper: whisper-base, {len(clips)} clips ({audio_s:.1f} s) in {len(job.groups)} languages, one "
          f"transcribe call per language, greedy (temperature 0)", flush=True)
    runs: Runs = {}
    for index in range(args.rounds):
        round_run = try_isolated(failures, f"whisper (round {index + 1}/{args.rounds})", run_whisper_round, job, index)
        for label, run in (round_run.configs if round_run else {}).items():
            runs.setdefault(label, []).append(run)
    rows = []
    for mode in WHISPER_MODES:
        for on in (True, False):
            mine = runs.get(f"whisper {mode} cache {cache_label(on)}")
            if not mine:
                continue
            plain = runs.get(f"whisper plain cache {cache_label(on)}")
            off = runs.get(f"whisper {mode} cache off")
            stats = best(mine).stats
            rows.append([mode, cache_label(on), f"{best(mine).wall:.2f}", every_wall(mine), least_cpu(mine),
                         f"{audio_s / best(mine).wall:.2f}", str(stats["encoder_runs"]), str(stats["words"]),
                         f"{stats['languages_right']}/{stats['clips']}",
                         ratio_cell(mine, plain) if mode != "plain" else "", same_cell(mine, off)])
    print_markdown(["mode", "encoder cache", "wall s", "every round s", "CPU s", "audio s / wall s", "encoder runs",
                    "words", "language right", "wall / plain", "same text as cache off (common prefix)"], rows)
    for mode, target in (("words", 1.10), ("detect", 1.05)):
        for on in (True, False):
            cache = cache_label(on)
            pair = (runs.get(f"whisper {mode} cache {cache}"), runs.get(f"whisper plain cache {cache}"))
            summary.append(["whisper", f"{mode} / plain, cache {cache_label(on)}", ratio_cell(*pair),
                            cpu_ratio_cell(*pair), f"<= {target:.2f}" if on else ""])
    return runs


def chat_workload(args: argparse.Namespace, failures: List[str], summary: list) -> Runs:
    job = chat_job(resolve_model_path("smollm2-135m"), args.chat_requests, args.chat_new_tokens, args.threads)
    lengths = [len(prompt) for prompt in job.prompts]
    print(f"\n## chat: SmolLM2-135M-Instruct, {len(job.prompts)} requests of {min(lengths)}-{max(lengths)} prompt "
          f"tokens ({job.shared_prefix_tokens} shared), {job.new_tokens} new tokens each (greedy, forced), all "
          f"queued at once", flush=True)
    specs = [(f"chat prefix cache {cache_label(on)}", run_chat, (job, on)) for on in (True, False)]
    runs = interleaved(specs, args.rounds, failures)
    rows = []
    for on in (True, False):
        mine = runs.get(f"chat prefix cache {cache_label(on)}")
        if not mine:
            continue
        fastest = best(mine)
        rows.append([cache_label(on), f"{fastest.wall:.2f}", every_wall(mine), least_cpu(mine),
                     f"{fastest.stats['generated_tokens'] / fastest.wall:.1f}",
                     f"{len(job.prompts) / fastest.wall:.2f}", f"{min(r.stats['ttft_p50_s'] for r in mine):.2f}",
                     ", ".join(f"{r.stats['ttft_p50_s']:.2f}" for r in mine), f"{fastest.stats['ttft_p90_s']:.2f}",
                     f"{fastest.stats['prefix_hit_tokens']}/{fastest.stats['prompt_tokens']}",
                     same_cell(mine, runs.get("chat prefix cache off"))])
    print_markdown(["prefix cache", "wall s", "every round s", "CPU s", "generated tokens/s", "requests/s",
                    "TTFT p50 s (best)", "every round TTFT p50 s", "TTFT p90 s", "prefix hit / prompt tokens",
                    "same tokens as cache off (common prefix)"], rows)
    on, off = runs.get("chat prefix cache on"), runs.get("chat prefix cache off")
    summary.append(["chat", "throughput on / off (off / on)", ratio_cell(off, on), cpu_ratio_cell(off, on), ">= 2"])
    if on and off:
        ttft = min(r.stats["ttft_p50_s"] for r in off) / min(r.stats["ttft_p50_s"] for r in on)
        summary.append(["chat", "TTFT p50 off / on", f"{ttft:.3f}", "", ">= 2"])
    return runs


def translate_workload(args: argparse.Namespace, failures: List[str], summary: list, workdir: str) -> Runs:
    model_dir = os.path.join(workdir, "m2m100")
    vocab_size = translation.save_model(args.shape, args.seed, model_dir)
    job = translation.translate_job(model_dir, vocab_size, args.doc_tokens, args.target_languages,
                                    args.translate_new_tokens, args.seed, args.threads)
    print(f"\n## translate: random M2M100 ({args.shape}: {translation.SHAPES[args.shape]}), one document of "
          f"{len(job.document)} tokens into {len(job.language_tokens)} languages, {job.new_tokens} new tokens each "
          f"(greedy, forced)", flush=True)
    specs = [(f"translate ours cache {cache_label(on)}", translation.run_ours, (job, on)) for on in (True, False)]
    specs += [] if args.no_hf else [("translate hf", translation.run_hf, (job,))]
    runs = interleaved(specs, args.rounds, failures)
    off, hf = runs.get("translate ours cache off"), runs.get("translate hf")
    rows = []
    for label, mine in runs.items():
        fastest = best(mine)
        rows.append([fastest.engine, fastest.dtype, f"{fastest.wall:.2f}", every_wall(mine), least_cpu(mine),
                     f"{sum(len(o) for o in fastest.outputs) / fastest.wall:.1f}", str(fastest.stats["encoder_runs"]),
                     ratio_cell(off, mine) if fastest.engine == "ours" else "",
                     ratio_cell(hf, mine) if fastest.engine == "ours" else "", same_cell(mine, hf)])
    print_markdown(["engine", "encoder cache", "wall s", "every round s", "CPU s", "generated tokens/s",
                    "encoder inputs run", "vs cache off", "vs hf", "same tokens as hf (common prefix)"], rows)
    on = runs.get("translate ours cache on")
    summary.append(["translate", f"{args.shape}: cache off / on", ratio_cell(off, on), cpu_ratio_cell(off, on),
                    ">= 3"])
    summary.append(["translate", f"{args.shape}: HF / cache on", ratio_cell(hf, on), cpu_ratio_cell(hf, on), ""])
    return runs


def reference_label(workload: str, label: str) -> str:
    """The runs whose outputs a configuration's are compared with: HF's for translate, else the cache off's."""
    return "translate hf" if workload == "translate" else label.replace("cache on", "cache off")


def write_json(path: str, args: argparse.Namespace, all_runs: Dict[str, Runs], summary: list) -> None:
    report = dict(environment=environment_line(args.threads), argv=sys.argv, args=vars(args), summary=summary,
                  runs={}, agreement={})
    for workload, runs in all_runs.items():
        report["runs"][workload] = {label: [dict(wall_s=r.wall, peak_rss_mib=r.peak_rss_mib, stats=r.stats)
                                            for r in label_runs] for label, label_runs in runs.items()}
        for label, label_runs in runs.items():
            reference = runs.get(reference_label(workload, label))
            if reference:
                same, prefix = agreement(best(reference).outputs, best(label_runs).outputs)
                report["agreement"][label] = dict(reference=reference_label(workload, label), same=same,
                                                  common_prefix=prefix)
    with open(path, "w") as out:
        json.dump(report, out, indent=1)


def main(argv=None) -> int:
    args = parse_args(argv)
    print_run_header(args.threads)
    failures: List[str] = []
    summary: list = []
    all_runs: Dict[str, Runs] = {}
    workloads = args.workloads.split(",")
    with tempfile.TemporaryDirectory() as workdir:
        if "whisper" in workloads:
            all_runs["whisper"] = whisper_workload(args, failures, summary)
        if "chat" in workloads:
            all_runs["chat"] = chat_workload(args, failures, summary)
        if "translate" in workloads:
            all_runs["translate"] = translate_workload(args, failures, summary, workdir)
    print("\n## summary (best / best wall and least / least CPU time, each with the median of the rounds' ratios)")
    print_markdown(["workload", "measure", "wall ratio", "CPU time ratio", "target"], summary)
    for failure in failures:
        print(f"FAILED: {failure}")
    if args.out:
        write_json(args.out, args, all_runs, summary)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
