"""The EnginePort facts and capabilities LLMEngine has beside its request loop, read from its parts."""
from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence

import torch

from seq2seq_engine.config import CacheConfig, ModelConfig, SchedulerConfig
from seq2seq_engine.core.scheduler import Scheduler
from seq2seq_engine.engine.alignment_pass import AlignmentPass
from seq2seq_engine.engine_port import AlignmentRequest, AlignmentResult, EngineStats
from seq2seq_engine.generation_defaults import GenerationDefaults
from seq2seq_engine.worker.cache_engine import CacheEngine, cache_block_bytes
from seq2seq_engine.worker.model_runner import ModelRunner


class EnginePortMethods:
    """Mixed into LLMEngine (which sets the parts named below): the engine's own object answers the port, so
    whoever holds `llm.llm_engine` holds an EnginePort, and the request loop stays in llm_engine.py."""

    model_config: ModelConfig
    scheduler_config: SchedulerConfig
    cache_config: CacheConfig
    kv_cache_dtype: torch.dtype
    scheduler: Scheduler
    cache_engine: CacheEngine
    model_runner: ModelRunner
    generation_defaults: GenerationDefaults
    _alignment_pass: Optional[AlignmentPass] = None   # made at the first align call

    # ------------------------------------------------------------ model facts
    @property
    def hf_config(self) -> Any:
        return self.model_config.hf_config

    @property
    def model_path(self) -> str:
        return self.model_config.model

    @property
    def num_mel_bins(self) -> Optional[int]:
        return getattr(self.model_config.hf_config, "num_mel_bins", None)

    @property
    def max_encoder_len(self) -> int:
        return self.model_config.max_encoder_len

    @property
    def max_model_len(self) -> int:
        return self.model_config.max_model_len

    @property
    def max_num_seqs(self) -> int:
        return self.scheduler_config.max_num_seqs

    @property
    def max_beam_width(self) -> int:
        return self.scheduler_config.max_beam_width

    @property
    def block_size(self) -> int:
        return self.cache_config.block_size

    def request_kv_bytes(self, decoder_tokens: int, num_seqs: int) -> int:
        """KV cache bytes of one request at its longest: its encoder span's cross blocks once, and `num_seqs`
        sequences of `decoder_tokens` (at most max_model_len) in self blocks."""
        block_size = self.block_size
        num_layers, num_kv_heads, head_size = self.model_runner.model.kv_cache_spec()
        block_bytes = cache_block_bytes(num_layers, num_kv_heads, head_size, block_size, self.kv_cache_dtype)
        cross_blocks = math.ceil(self.max_encoder_len / block_size)
        self_blocks = num_seqs * math.ceil(min(self.max_model_len, decoder_tokens) / block_size)
        return (cross_blocks + self_blocks) * block_bytes

    def weight_bytes(self) -> int:
        model = self.model_runner.model
        tensors = list(model.parameters()) + list(model.buffers())
        return sum(t.numel() * t.element_size() for t in tensors)

    # ------------------------------------------------------------ state
    def unfinished_request_ids(self) -> List[str]:
        scheduler = self.scheduler
        return [group.request_id for groups in (scheduler.waiting, scheduler.running, scheduler.swapped)
                for group in groups]

    def stats(self) -> EngineStats:
        scheduler = self.scheduler
        block_manager = scheduler.block_manager
        prefix_cache, cross_cache = block_manager.prefix_cache, block_manager.cross_cache
        return EngineStats(
            running=len(scheduler.running), waiting=len(scheduler.waiting), swapped=len(scheduler.swapped),
            total_gpu_blocks=block_manager.num_total_gpu_blocks,
            free_gpu_blocks=block_manager.get_num_free_gpu_blocks(),
            preemptions=scheduler.num_cumulative_preemption, encoder_runs=self.model_runner.num_encoder_runs,
            prefix_queried_tokens=None if prefix_cache is None else prefix_cache.num_queried_tokens,
            prefix_hit_tokens=None if prefix_cache is None else prefix_cache.num_hit_tokens,
            encoder_cache_queries=None if cross_cache is None else cross_cache.num_queries,
            encoder_cache_hits=None if cross_cache is None else cross_cache.num_hits)

    # ------------------------------------------------------------ capabilities
    def align(self, requests: Sequence[AlignmentRequest]) -> List[AlignmentResult]:
        if self._alignment_pass is None:
            self._alignment_pass = AlignmentPass(self.model_runner.model, self.hf_config,
                                                 self.generation_defaults.values, self.max_encoder_len,
                                                 self.lora_manager)
        return self._alignment_pass.run(requests, self.scheduler.block_manager.cross_cache,
                                        self.cache_engine.device_cache)
