"""LoRA serving throughput: requests spread over several rank-16 adapters (every linear adapted) in one continuous
batch, against the same requests on the base model and against HF PEFT serving one adapter per batch; plus the time
to load an adapter and its memory. Same weights, same requests, same number of new tokens everywhere.

    .venv/bin/python -m benchmarks.lora_throughput                         # whisper-base clips and a BART-base shape
    .venv/bin/python -m benchmarks.lora_throughput --workload whisper --rounds 3
    .venv/bin/python -m benchmarks.lora_throughput --quick                 # smoke run, small sizes
"""
from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from typing import List

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
import torch
import transformers

from benchmarks.lib.clips import load_clips
from benchmarks.lib.common import (EngineRun, EngineSpec, add_timing_args, agreement, print_markdown, print_run_header,
                                   run_rounds)
from benchmarks.lib.lora_engines import LoRAJob, run_hf, run_ours, run_peft
from benchmarks.lib.text_models import random_model
from seq2seq_engine.model_loader.resolver import resolve_model_path

TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]   # every linear of the BART and Whisper layers
WHISPER_PROMPT = [50258, 50259, 50359, 50363]   # <|startoftranscript|><|en|><|transcribe|><|notimestamps|>


def make_adapters(model_dir: str, whisper: bool, count: int, rank: int, out_dir: str) -> List[str]:
    """`count` random PEFT adapters of `rank` on every linear (B not zero), saved as PEFT saves them."""
    from peft import LoraConfig, get_peft_model
    paths = []
    for index in range(count):
        model_class = transformers.WhisperForConditionalGeneration if whisper else \
            transformers.AutoModelForSeq2SeqLM
        base = model_class.from_pretrained(model_dir)
        torch.manual_seed(100 + index)
        config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS, init_lora_weights=False)
        model = get_peft_model(base, config)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.mul_(0.05)    # a mild adapter: outputs stay like the base model's, as trained ones do
        path = os.path.join(out_dir, f"adapter{index}")
        model.save_pretrained(path)
        paths.append(path)
    return paths


def build_job(name: str, args: argparse.Namespace, tmp: str) -> LoRAJob:
    rng = random.Random(0)
    if name == "whisper":
        model_dir = resolve_model_path("whisper-base")
        clips = load_clips("all", args.requests or (8 if args.quick else 32))
        extractor = transformers.WhisperFeatureExtractor.from_pretrained(model_dir)
        features = [extractor(c.samples, sampling_rate=16000, return_tensors="pt").input_features[0] for c in clips]
        prompts, starts = [list(WHISPER_PROMPT) for _ in clips], []
    else:
        model_dir = random_model("bart", 0, 0.02, False, tmp)
        num = args.requests or (8 if args.quick else 32)
        prompts = [[rng.randrange(4, 50000) for _ in range(rng.randrange(64, 512))] for _ in range(num)]
        features, starts = None, [2]
    adapters = make_adapters(model_dir, name == "whisper", args.adapters, args.rank, tmp)
    return LoRAJob(model_dir, adapters, prompts, features, starts, 16 if args.quick else args.new_tokens,
                   threads=args.threads, repeat=args.repeat)


def adapter_costs(job: LoRAJob) -> List[str]:
    """[load seconds, host MiB, device slot MiB] of one adapter, read into a fresh engine."""
    from seq2seq_engine import LLM, LoRARequest
    llm = LLM(job.model_dir, skip_tokenizer_init=True, kv_cache_space_gb=0.2, enable_lora=True, max_loras=1,
              max_lora_rank=16)
    manager = llm.llm_engine.lora_manager
    request = LoRARequest("probe", 1, job.adapters[0])
    start = time.perf_counter()
    llm.llm_engine.add_lora(request)
    manager.activate([1])
    seconds = time.perf_counter() - start
    host = manager.host_bytes(1) / 2 ** 20
    return [f"{seconds:.3f}", f"{host:.1f}", f"{manager.slot_bytes / 2 ** 20:.1f}"]


def report(name: str, job: LoRAJob, runs: List[EngineRun], costs: List[str]) -> None:
    tokens = len(job.prompts) * job.new_tokens
    print(f"\n### {name}: {len(job.prompts)} requests over {len(job.adapters)} adapters of rank "
          f"{job.adapters and 16}, {job.new_tokens} new tokens each ({tokens} in all)")
    by_label = {run.label: run for run in runs}
    base, lora, peft, hf = (by_label.get(label) for label in ("ours-base", "ours-lora", "peft-lora", "hf-base"))
    rows = []
    for run in runs:
        cells = [run.label, f"{run.wall:.2f}", f"{tokens / run.wall:.1f}", f"{run.peak_rss_mib:.0f}"]
        rows.append(cells)
    print_markdown(["engine", "wall s", "tok/s", "peak RSS MiB"], rows)
    if lora and base:
        print(f"adapters / base model throughput: {base.wall / lora.wall:.2f}x")
    if base and hf:
        print(f"ours / HF without adapters: {hf.wall / base.wall:.2f}x (the bound of the PEFT ratio, times the "
              f"adapters' own cost)")
    if lora and peft:
        exact, prefix = agreement(lora.outputs, peft.outputs)
        print(f"ours with adapters / PEFT: {peft.wall / lora.wall:.2f}x (same tokens as PEFT: {exact:.0%} of "
              f"requests, mean common prefix {prefix:.0%})")
    print(f"one adapter: loaded in {costs[0]} s, {costs[1]} MiB in host memory, {costs[2]} MiB of device slots")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="whisper,bart")
    parser.add_argument("--engines", default="base,lora,peft,hf")
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--requests", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    add_timing_args(parser)
    args = parser.parse_args(argv)
    print_run_header(args.threads)
    engines = args.engines.split(",")
    for name in args.workload.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            job = build_job(name, args, tmp)
            specs = [spec for key, spec in (("base", EngineSpec("ours base", run_ours, (job, False))),
                                            ("lora", EngineSpec("ours lora", run_ours, (job, True))),
                                            ("peft", EngineSpec("peft lora", run_peft, (job,))),
                                            ("hf", EngineSpec("hf base", run_hf, (job,)))) if key in engines]
            failures: List[str] = []
            runs = run_rounds(specs, args.rounds, failures)
            report(name, job, runs, adapter_costs(job))
            for failure in failures:
                print(f"FAILED: {failure}")


if __name__ == "__main__":
    main()
