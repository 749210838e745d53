"""GPU throughput against HF transformers `generate` (and, for Whisper, faster-whisper's CTranslate2 `generate` with
`--engines ours,hf,ct2`) on the same GPU and the same random weights, interleaved rounds (ours, HF, ours, HF): Whisper
large-v3 shaped 30 s windows with 120 forced tokens (RTFx) and BART-large shaped documents with 64 forced tokens
(tokens/s). Each workload runs in its own child process; JSON plus a markdown table.

    python3 -m benchmarks.gpu_throughput --out gpu_throughput.json          # on a CUDA GPU, bfloat16
    python3 -m benchmarks.gpu_throughput --tiny --device cpu                 # smoke run of the script itself
"""
from __future__ import annotations

import argparse
import datetime
import gc
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
import torch
import transformers

from benchmarks.lib import ct2_whisper
from benchmarks.lib.gpu_profile import describe, profile_run
from benchmarks.lib.gpu_report import markdown
from benchmarks.lib.gpu_workloads import (WHISPER_EOT, WHISPER_PROMPT, WINDOW_SECONDS, agreement, bart_documents,
                                          bart_hf, bart_ours, bart_setup, synchronize, whisper_features, whisper_hf,
                                          whisper_memory_gib, whisper_ours, whisper_setup)
from benchmarks.lib.launch import ROOT, script_command
from seq2seq_engine.cache_dir import cache_root

WORKLOADS = ("whisper", "bart")
ENGINES = ("ours", "hf", "ct2")
# (full, tiny) defaults of the size arguments
SIZES = {"whisper_batches": ("64,128", "2,3"), "whisper_new_tokens": (120, 6), "bart_docs": (256, 6),
         "bart_min_len": (64, 8), "bart_max_len": (512, 40), "bart_new_tokens": (64, 6), "hf_batch": (64, 4)}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--tiny", action="store_true", help="2-layer models and a few requests (smoke run)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--engines", default="ours,hf",
                        help="engines to run, among ours, hf and ct2 (CTranslate2 Whisper, the faster-whisper peer: "
                             "Whisper only); ours always runs")
    parser.add_argument("--whisper-batches", default=None, help="windows per batch, comma-separated (64,128)")
    parser.add_argument("--whisper-new-tokens", type=int, default=None)
    parser.add_argument("--bart-docs", type=int, default=None)
    parser.add_argument("--bart-min-len", type=int, default=None)
    parser.add_argument("--bart-max-len", type=int, default=None)
    parser.add_argument("--bart-new-tokens", type=int, default=None)
    parser.add_argument("--hf-batch", type=int, default=None, help="documents per HF generate call (64)")
    parser.add_argument("--enforce-eager", action="store_true", help="our engine without CUDA graphs")
    parser.add_argument("--async-scheduling", action="store_true",
                        help="our engine launching each decode step before the previous one's tokens reach the host")
    parser.add_argument("--kv-cache-dtype", default="auto", help="our KV cache's dtype: auto (the model's) or fp8")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--profile", action="store_true",
                        help="after the rounds, one more run of each engine under the torch profiler (CUDA only): "
                             "the kernels with the most device time and the GPU's idle share")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="JSON file of the results")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    args.shape = "tiny" if args.tiny else "full"
    for name, defaults in SIZES.items():
        if getattr(args, name) is None:
            setattr(args, name, defaults[1] if args.tiny else defaults[0])
    args.batches = [int(b) for b in str(args.whisper_batches).split(",")]
    args.max_batch = max(args.batches)
    unknown = set(args.workloads.split(",")) - set(WORKLOADS)
    args.engine_list = ["ours"] + [e for e in ENGINES[1:] if e in args.engines.split(",")]
    if unknown or args.rounds < 1 or min(args.batches) < 1 or set(args.engines.split(",")) - set(ENGINES):
        parser.error(f"workloads must be among {WORKLOADS} (got {sorted(unknown)}), engines among {ENGINES}, "
                     "rounds and batches >= 1")
    return args


def timed(device: str, run: Callable[[], List[List[int]]]) -> Dict[str, Any]:
    """Wall seconds of one call (the device synchronized on both sides), or the error it raised."""
    synchronize(device)
    start = time.perf_counter()
    try:
        tokens = run()
        synchronize(device)
    except torch.cuda.OutOfMemoryError as error:
        gc.collect()
        torch.cuda.empty_cache()
        return {"seconds": None, "tokens": None, "error": f"out of memory: {error}"[:300]}
    return {"seconds": time.perf_counter() - start, "tokens": tokens, "error": None}


def interleaved(args, engines: Dict[str, Any], calls: Dict[str, Dict[str, Callable[[Any], List[List[int]]]]],
                seconds: Dict[str, float]) -> Dict[str, Any]:
    """Warm-up once per engine, then `args.rounds` rounds of each engine in turn; the best round counts."""
    start = time.perf_counter()
    for name, call in calls.items():
        warm = timed(args.device, lambda: call["warmup"](engines[name]))
        if warm["error"]:
            print(f"{name} warm-up failed: {warm['error']}", flush=True)
    seconds["warmup"] = seconds.get("warmup", 0.0) + time.perf_counter() - start
    result: Dict[str, Any] = {name: {"rounds": [], "errors": []} for name in calls}
    last: Dict[str, Any] = {}
    for _ in range(args.rounds):
        for name, call in calls.items():
            run = timed(args.device, lambda: call["timed"](engines[name]))
            result[name]["rounds"].append(run["seconds"])
            if run["error"]:
                result[name]["errors"].append(run["error"])
            last[name] = run["tokens"]
            if torch.device(args.device).type == "cuda":
                torch.cuda.empty_cache()  # the peers' freed activations must not crowd our pool's neighbours
    for name in calls:
        times = [t for t in result[name]["rounds"] if t is not None]
        result[name]["best_s"] = min(times) if times else None
    best_ours = result["ours"]["best_s"]
    for peer in [name for name in calls if name != "ours"]:
        best_peer = result[peer]["best_s"]
        result[peer]["speed_ratio"] = best_peer / best_ours if best_ours and best_peer else None
        result[peer]["agreement"] = agreement(last.get("ours"), last.get(peer))
    if "hf" in calls:   # the keys every earlier result file has
        result["speed_ratio"], result["agreement"] = result["hf"]["speed_ratio"], result["hf"]["agreement"]
    return result


def whisper_child(args, model_dir: str) -> Dict[str, Any]:
    setup = whisper_setup(args, model_dir)
    features = whisper_features(args, args.max_batch)
    n = args.whisper_new_tokens
    memory = whisper_memory_gib(args, setup)
    print(f"whisper: estimated device memory (GiB) {memory}", flush=True)
    out: Dict[str, Any] = {"setup_s": setup.seconds, "new_tokens": n, "window_s": WINDOW_SECONDS,
                           "memory_estimate_gib": memory, "batches": {}}
    engines = {"ours": setup.ours, "hf": setup.hf}
    if "ct2" in args.engine_list:
        engines["ct2"], out["ct2"] = ct2_whisper.load(model_dir, args.device, args.dtype)
        print(f"whisper: the CTranslate2 (faster-whisper) peer: {out['ct2']}", flush=True)
    for batch in args.batches:
        part = features[:batch]
        # warm-up on the timed batch (2 tokens): the CUDA graphs of the decode batch sizes it meets are captured then
        runs = {"ours": lambda llm, k: whisper_ours(llm, part, k), "hf": lambda m, k: whisper_hf(m, part, k),
                "ct2": lambda m, k: ct2_whisper.generate(m, part, WHISPER_PROMPT, WHISPER_EOT, k)}
        calls = {name: {"warmup": lambda e, run=runs[name]: run(e, 2), "timed": lambda e, run=runs[name]: run(e, n)}
                 for name in args.engine_list if engines.get(name) is not None}
        result = interleaved(args, engines, calls, setup.seconds)
        for name in calls:
            best = result[name]["best_s"]
            result[name]["rtfx"] = batch * WINDOW_SECONDS / best if best else None
        out["batches"][str(batch)] = result
        if args.profile and batch == args.max_batch:
            out["profile"] = profiled(args, f"whisper {batch} windows", {
                "ours": lambda: whisper_ours(setup.ours, part, n), "hf": lambda: whisper_hf(setup.hf, part, n)})
    return out


def profiled(args, title: str, runs: Dict[str, Callable[[], Any]]) -> Dict[str, Any]:
    """One profiled run of each engine (on CUDA), printed and returned."""
    if torch.device(args.device).type != "cuda":
        return {}
    profiles = {}
    for name, run in runs.items():
        profiles[name] = profile_run(run)
        print(describe(f"{name}, {title}", profiles[name]), flush=True)
        torch.cuda.empty_cache()
    return profiles


def bart_child(args, model_dir: str) -> Dict[str, Any]:
    documents = bart_documents(args)
    setup = bart_setup(args, model_dir, documents)
    n = args.bart_new_tokens
    # our warm-up takes every document (2 tokens), so it meets the decode batch sizes of the timed run
    calls = {"ours": {"warmup": lambda llm: bart_ours(llm, documents, 2),
                      "timed": lambda llm: bart_ours(llm, documents, n)},
             "hf": {"warmup": lambda m: bart_hf(m, documents[:args.hf_batch], 2, args.hf_batch),
                    "timed": lambda m: bart_hf(m, documents, n, args.hf_batch)}}
    calls = {name: call for name, call in calls.items() if name in args.engine_list}
    result = interleaved(args, {"ours": setup.ours, "hf": setup.hf}, calls, setup.seconds)
    for name in calls:
        best = result[name]["best_s"]
        result[name]["tokens_per_s"] = len(documents) * n / best if best else None
    profile = profiled(args, f"bart {len(documents)} documents", {"ours": lambda: bart_ours(setup.ours, documents, n)}
                       ) if args.profile else {}
    return {"setup_s": setup.seconds, "documents": len(documents), "new_tokens": n, "hf_batch": args.hf_batch,
            "prompt_tokens": sum(len(d) for d in documents), "result": result, "profile": profile}


def run_child(args) -> None:
    """One workload; its saved model is removed afterwards, with the prepared-weights file a CPU load writes for it
    (named after the model folder, `gpu_throughput_<workload>`)."""
    transformers.logging.set_verbosity_error()  # generate's per-call notes on max_length would flood the log
    transformers.utils.logging.disable_progress_bar()
    workdir = tempfile.mkdtemp(prefix=f"gpu_throughput_{args.child}_")
    child = whisper_child if args.child == "whisper" else bart_child
    try:
        result = child(args, os.path.join(workdir, f"gpu_throughput_{args.child}"))
        with open(args.child_out, "w") as f:
            json.dump(result, f)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        for path in glob.glob(os.path.join(cache_root(), "prepared", f"gpu_throughput_{args.child}-*.safetensors")):
            os.unlink(path)


def environment(args) -> Dict[str, Any]:
    cuda = torch.device(args.device).type == "cuda"
    return {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
            "cuda": torch.version.cuda, "transformers": transformers.__version__, "dtype": args.dtype,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "args": {k: v for k, v in vars(args).items() if k not in ("child", "child_out")}}


def spawn(workload: str, argv: List[str]) -> Dict[str, Any]:
    """One workload in a fresh process (its GPU memory is returned when it exits); its output streams through."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        path = handle.name
    start = time.perf_counter()
    code = subprocess.call(script_command("gpu_throughput", *argv, "--child", workload, "--child-out", path), cwd=ROOT)
    elapsed = time.perf_counter() - start
    try:
        with open(path) as f:
            result = json.load(f) if code == 0 else {"error": f"the {workload} run exited with status {code}"}
    except (OSError, ValueError) as error:
        result = {"error": f"the {workload} run left no result: {error}"}
    finally:
        os.unlink(path)
    result["process_s"] = elapsed
    return result


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.child:
        run_child(args)
        return 0
    results = {**environment(args), "workloads": {}}
    print(f"# {results['device']}, torch {results['torch']}, transformers {results['transformers']}, "
          f"{args.dtype} (KV cache {args.kv_cache_dtype}), {args.rounds} rounds, {results['date']}", flush=True)
    for workload in args.workloads.split(","):
        results["workloads"][workload] = spawn(workload, argv)
        if args.out:
            with open(args.out, "w") as f:  # after each workload: a later timeout keeps what finished
                json.dump(results, f, indent=1)
    print(markdown(results))
    return 0 if all("error" not in r for r in results["workloads"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
