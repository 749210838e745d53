"""EngineArgs: the user-facing knobs (LLM(...) keyword arguments) turned into a validated EngineConfig."""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional

from seq2seq_engine.config import CacheConfig, DeviceConfig, EngineConfig, SchedulerConfig, model_config_from_hf
from seq2seq_engine.lora_request import LoRAConfig
from seq2seq_engine.models.int8 import int8_unsupported_reason
from seq2seq_engine.platforms import current_platform
from seq2seq_engine.platforms.cpu_memory import cpu_max_batched_tokens
from seq2seq_engine.platforms.cuda import CUDA_MAX_BATCHED_TOKENS

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class EngineArgs:
    model: str
    dtype: str = "float32"
    quantization: Optional[str] = None   # "int8": int8 weights and dynamic int8 activations in the Linear layers
    seed: int = 0
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: Optional[int] = None
    max_model_len: Optional[int] = None
    kv_cache_space_gb: float = 4.0
    swap_space_gb: float = 1.0
    kv_cache_dtype: str = "auto"   # "auto": the model's dtype (bfloat16 for int8 models), or a dtype name
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: Optional[int] = None
    skip_tokenizer_init: bool = False
    device: str = "auto"
    policy: str = "fcfs"
    preemption_mode: str = "recompute"
    enable_chunked_prefill: bool = False
    max_logprobs: int = 20
    max_beam_width: Optional[int] = None
    enforce_eager: bool = False   # True: no CUDA graphs, every step runs eagerly
    enable_prefix_caching: bool = True   # full decoder blocks found again by content (vLLM's name and default)
    enable_encoder_cache: bool = True    # requests with the same encoder input share one cross table
    # LoRA adapters (vLLM's names): requests name one with lora_request=; max_loras mix in one step (device slots),
    # each of rank <= max_lora_rank; max_cpu_loras stay read in host memory (None: max_loras)
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: Optional[int] = None
    # vLLM's name: launch each decode step before the previous one's tokens reach the host (off: it only pays where
    # a device runs beside the host; docs/decisions.md)
    async_scheduling: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")

    def create_engine_config(self, hf_config: Any) -> EngineConfig:
        """Block counts are left unset here: they depend on the model's KV geometry (see engine builder)."""
        model_config = model_config_from_hf(self.model, hf_config, self.dtype, self.seed, self.skip_tokenizer_init,
                                            self.max_model_len, self.max_logprobs, self.quantization,
                                            self.enforce_eager)
        max_model_len, max_encoder_len = model_config.max_model_len, model_config.max_encoder_len
        device_config = DeviceConfig(self.device)
        if model_config.quantization == "int8":
            reason = int8_unsupported_reason(device_config.resolved)
            if reason:
                raise ValueError(reason)
        # By default one step can hold the longest possible prefill (encoder + decoder prompt); on the CPU the
        # budget also keeps a step's activations small enough for malloc to reuse
        # (seq2seq_engine/platforms/cpu_memory.py); on a GPU it is larger, so that a batch's encoders run in a few
        # wide steps instead of many eager ones (decisions §5).
        lora_config = (LoRAConfig(self.max_loras, self.max_lora_rank, self.max_cpu_loras) if self.enable_lora
                       else None)
        longest_prefill = max_model_len + max_encoder_len
        max_batched = self.max_num_batched_tokens or (
            cpu_max_batched_tokens(hf_config, longest_prefill) if device_config.resolved == "cpu"
            else max(CUDA_MAX_BATCHED_TOKENS, longest_prefill))
        scheduler_config = SchedulerConfig(
            max_num_batched_tokens=max_batched, max_num_seqs=self.max_num_seqs, max_model_len=max_model_len,
            max_encoder_len=max_encoder_len, policy=self.policy, preemption_mode=self.preemption_mode,
            enable_chunked_prefill=self.enable_chunked_prefill, max_beam_width=self.max_beam_width,
            max_loras=lora_config.max_loras if lora_config else 0, async_scheduling=self.async_scheduling)
        cache_config = CacheConfig(block_size=self.block_size, kv_cache_space_gb=self.kv_cache_space_gb,
                                   swap_space_gb=self.swap_space_gb, num_gpu_blocks=self.num_gpu_blocks_override,
                                   cache_dtype=self.kv_cache_dtype, enable_prefix_caching=self.enable_prefix_caching,
                                   enable_encoder_cache=self.enable_encoder_cache)
        return EngineConfig(model_config, cache_config, scheduler_config, device_config, lora_config)


def with_compute_dtype(args: EngineArgs) -> EngineArgs:
    """`args` with the dtype the platform computes the requested one in (bfloat16 runs in float32 on a CPU without
    native bf16 matmuls, where emulated bf16 measured several times slower), saying so when it differs; an "auto"
    KV cache keeps the requested dtype (its memory is what bfloat16 was asked for)."""
    if DeviceConfig(args.device).resolved != "cpu":
        return args
    dtype = current_platform("cpu").compute_dtype(args.dtype)
    if dtype == args.dtype:
        return args
    logger.info("dtype %s has no native support on this CPU (no AVX512_BF16 or AMX): the model computes in %s, "
                "its linear layers keep %s weights where they run on the panel kernel and the KV cache stays %s",
                args.dtype, dtype, args.dtype, args.dtype)
    kv_cache_dtype = args.dtype if args.kv_cache_dtype == "auto" else args.kv_cache_dtype
    return dataclasses.replace(args, dtype=dtype, kv_cache_dtype=kv_cache_dtype)
