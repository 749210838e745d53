"""Prometheus metrics of the server (GET /metrics): queue sizes, KV-cache use and the prefix / encoder caches' hits
read from the engine after each step, token and audio counters, realtime transcription sessions, turns and audio
seconds, and time-to-first-token / inter-token / end-to-end latency histograms."""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from seq2seq_engine.engine_port import EnginePort

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclasses.dataclass
class _Timing:
    arrival: float
    last_token: Optional[float] = None
    num_tokens: int = 0


class MetricFamilies:
    """The server's metric families in one registry (one per server, no process-wide state), each labelled by
    model_name; GET /metrics renders them for every served model at once."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()

        def make(kind, name, documentation, **kwargs):
            return kind(f"seq2seq_engine:{name}", documentation, ["model_name"], registry=self.registry, **kwargs)

        self.running = make(Gauge, "num_requests_running", "Requests in the running queue")
        self.waiting = make(Gauge, "num_requests_waiting", "Requests waiting to be admitted")
        self.swapped = make(Gauge, "num_requests_swapped", "Requests swapped out to the CPU pool")
        self.kv_usage = make(Gauge, "kv_cache_usage_perc", "Fraction of device KV blocks held (self and cross)")
        self.free_blocks = make(Gauge, "kv_cache_free_blocks", "Free device KV blocks")
        self.total_blocks = make(Gauge, "kv_cache_total_blocks", "Device KV blocks in the pool")
        self.preemptions = make(Counter, "num_preemptions", "Requests preempted by the scheduler")
        self.prefix_queries = make(Counter, "prefix_cache_queries", "Prompt tokens looked up in the prefix cache")
        self.prefix_hits = make(Counter, "prefix_cache_hits", "Prompt tokens found in the prefix cache")
        self.encoder_queries = make(Counter, "encoder_cache_queries", "Requests that looked up their encoder output")
        self.encoder_hits = make(Counter, "encoder_cache_hits", "Requests that found their encoder output cached")
        self.encoder_runs = make(Counter, "encoder_runs", "Encoder inputs run (a cache hit runs none)")
        self.prompt_tokens = make(Counter, "prompt_tokens", "Prompt tokens of finished requests")
        self.generation_tokens = make(Counter, "generation_tokens", "Tokens generated")
        self.audio_seconds = make(Counter, "audio_seconds", "Seconds of audio transcribed")
        self.requests = make(Counter, "requests_finished", "Requests finished (aborted ones included)")
        self.ttft = make(Histogram, "time_to_first_token_seconds", "Time to first token", buckets=_LATENCY_BUCKETS)
        self.itl = make(Histogram, "inter_token_latency_seconds", "Time between tokens of a request",
                        buckets=_TOKEN_BUCKETS)
        self.e2e = make(Histogram, "e2e_request_latency_seconds", "Arrival to last token", buckets=_LATENCY_BUCKETS)
        self.realtime_open = make(Gauge, "realtime_sessions", "Realtime transcription sessions open now")
        self.realtime_sessions = make(Counter, "realtime_sessions_opened", "Realtime transcription sessions opened")
        self.realtime_turns = make(Counter, "realtime_turns", "Turns completed by realtime transcription sessions")
        self.realtime_audio_seconds = make(Counter, "realtime_audio_seconds",
                                           "Seconds of audio received by realtime transcription sessions")

    def render(self) -> bytes:
        return generate_latest(self.registry)


_FAMILY_NAMES = ("running", "waiting", "swapped", "kv_usage", "free_blocks", "total_blocks", "preemptions",
                 "prefix_queries", "prefix_hits", "encoder_queries", "encoder_hits", "encoder_runs", "prompt_tokens",
                 "generation_tokens", "audio_seconds", "requests", "ttft", "itl", "e2e",
                 "realtime_open", "realtime_sessions", "realtime_turns", "realtime_audio_seconds")


class ServerMetrics:
    """One served model's series of the families (its own families when none are given); the engine thread
    updates them, /metrics renders the families."""

    def __init__(self, model_name: str, families: Optional[MetricFamilies] = None) -> None:
        self.families = families if families is not None else MetricFamilies()
        for name in _FAMILY_NAMES:
            setattr(self, name, getattr(self.families, name).labels(model_name))
        self._timings: Dict[str, _Timing] = {}
        self._engine_counts_seen: Dict[str, int] = {}   # the engine's cumulative counts at the last read

    def render(self) -> bytes:
        return self.families.render()

    # ---------------------------------------------------------------- called on the engine thread
    def request_added(self, request_id: str) -> None:
        self._timings[request_id] = _Timing(time.monotonic())

    def request_output(self, output: Any) -> None:
        timing = self._timings.get(output.request_id)
        if timing is None:
            return
        now = time.monotonic()
        num_tokens = sum(len(completion.token_ids) for completion in output.outputs)
        if num_tokens > timing.num_tokens:
            self.generation_tokens.inc(num_tokens - timing.num_tokens)
            if timing.last_token is None:
                self.ttft.observe(now - timing.arrival)
            else:
                self.itl.observe(now - timing.last_token)
            timing.last_token, timing.num_tokens = now, num_tokens
        if output.finished:
            self.prompt_tokens.inc(len(output.prompt_token_ids) + len(output.encoder_prompt_token_ids or []))
            self.e2e.observe(now - timing.arrival)
            self.requests.inc()
            del self._timings[output.request_id]

    def request_aborted(self, request_id: str) -> None:
        if self._timings.pop(request_id, None) is not None:
            self.requests.inc()

    def audio_done(self, seconds: float) -> None:
        self.audio_seconds.inc(max(0.0, seconds))

    # ---------------------------------------------------------------- called on the event loop (realtime sockets)
    def realtime_opened(self) -> None:
        self.realtime_open.inc()
        self.realtime_sessions.inc()

    def realtime_closed(self) -> None:
        self.realtime_open.dec()

    def realtime_audio(self, seconds: float) -> None:
        self.realtime_audio_seconds.inc(max(0.0, seconds))

    def realtime_turn(self, audio_seconds: float) -> None:
        """A completed turn: counted, and its audio counted as transcribed."""
        self.realtime_turns.inc()
        self.audio_seconds.inc(max(0.0, audio_seconds))

    def engine_state(self, engine: EnginePort) -> None:
        stats = engine.stats()
        self.running.set(stats.running)
        self.waiting.set(stats.waiting)
        self.swapped.set(stats.swapped)
        total, free = stats.total_gpu_blocks, stats.free_gpu_blocks
        self.total_blocks.set(total)
        self.free_blocks.set(free)
        self.kv_usage.set(1.0 - free / total if total else 0.0)
        self._count_up("preemptions", stats.preemptions)
        self._count_up("encoder_runs", stats.encoder_runs)
        if stats.prefix_queried_tokens is not None:   # a cache switched off (None) leaves its counters at 0
            self._count_up("prefix_queries", stats.prefix_queried_tokens)
            self._count_up("prefix_hits", stats.prefix_hit_tokens)
        if stats.encoder_cache_queries is not None:
            self._count_up("encoder_queries", stats.encoder_cache_queries)
            self._count_up("encoder_hits", stats.encoder_cache_hits)

    def _count_up(self, name: str, cumulative: int) -> None:
        """Advance counter `name` to the engine's cumulative count by what it grew since the last read."""
        seen = self._engine_counts_seen.get(name, 0)
        if cumulative > seen:
            getattr(self, name).inc(cumulative - seen)
            self._engine_counts_seen[name] = cumulative
