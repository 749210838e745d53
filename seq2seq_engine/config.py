"""Engine configuration: frozen, validated dataclasses for model, cache, scheduler and device."""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from seq2seq_engine.lora_request import LoRAConfig

# The dtypes the engine runs in, by name (their torch.dtype comes from torch_dtype()).
DTYPE_NAMES = ("float32", "bfloat16", "float16")
# KV-cache dtypes beyond those: vLLM's names of float8 e4m3 (saturating, scale 1), read by the CUDA kernels only.
FP8_CACHE_NAMES = ("fp8", "fp8_e4m3")
# The compute capability whose GPUs run float8 loads in the Triton kernels (Ada, Hopper: sm_89, sm_90) and later.
FP8_CACHE_CAPABILITY = (8, 9)
KV_CACHE_DTYPE_NAMES = DTYPE_NAMES + FP8_CACHE_NAMES
_QUANTIZATION_METHODS = (None, "int8")  # int8: Linear layers on int8 weights and activations (models/int8.py)
_POLICIES = ("fcfs", "priority")
_PREEMPTION_MODES = ("recompute", "swap")
_DEFAULT_MAX_BEAM_WIDTH = 16
# HF model types whose generation starts from decoder_start_token_id alone (BART and mBART add bos after it: HF
# forces it with forced_bos_token_id); M2M100/NLLB put the target language there instead.
_START_ONLY_DECODER_PROMPT = frozenset({"marian", "m2m_100", "pegasus"})


def torch_dtype(name: str) -> Any:
    """The torch.dtype of one of DTYPE_NAMES; torch is imported here so that importing the package does not."""
    if name not in DTYPE_NAMES:
        raise ValueError(f"dtype must be one of {DTYPE_NAMES}, got {name!r}")
    import torch
    return getattr(torch, name)


def cache_torch_dtype(name: str) -> Any:
    """The torch.dtype of one of KV_CACHE_DTYPE_NAMES."""
    if name in FP8_CACHE_NAMES:
        import torch
        return torch.float8_e4m3fn
    if name not in DTYPE_NAMES:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPE_NAMES}, got {name!r}")
    return torch_dtype(name)


def _require_positive(name: str, value: Optional[int]) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """What the engine needs to know about a model, independent of its weights.

    `is_encoder_decoder` is the main axis: a decoder-only model has no encoder and no
    cross-attention, and its requests carry no encoder sequence.
    """

    model: str
    vocab_size: int
    max_target_positions: int
    is_encoder_decoder: bool
    max_source_positions: Optional[int] = None
    decoder_start_token_id: Optional[int] = None
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[int] = None
    pad_token_id: Optional[int] = None
    # the default decoder prompt is [decoder_start, bos] (BART) or, when False, [decoder_start] (Marian, M2M100)
    default_decoder_prompt_has_bos: bool = True
    dtype: str = "float32"
    quantization: Optional[str] = None
    seed: int = 0
    skip_tokenizer_init: bool = False
    # Largest `logprobs` / `prompt_logprobs` a request may ask for (vLLM's default; each entry is a Python dict).
    max_logprobs: int = 20
    # Whether the encoder takes audio (Whisper) rather than tokens; None: not known, prompts are not checked for it.
    takes_audio: Optional[bool] = None
    # Run every step eagerly: no CUDA graphs for decode steps (vLLM's name; nothing changes on the CPU).
    enforce_eager: bool = False
    hf_config: Any = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        _require_positive("vocab_size", self.vocab_size)
        _require_positive("max_target_positions", self.max_target_positions)
        if not isinstance(self.max_logprobs, int) or self.max_logprobs < 0:
            raise ValueError(f"max_logprobs must be a non-negative integer, got {self.max_logprobs!r}")
        if not isinstance(self.enforce_eager, bool):
            raise TypeError(f"enforce_eager must be True or False, got {self.enforce_eager!r}")
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {DTYPE_NAMES}, got {self.dtype!r}")
        if self.quantization not in _QUANTIZATION_METHODS:
            raise ValueError(f"quantization must be None or 'int8', got {self.quantization!r}")
        if self.quantization == "int8" and self.dtype != "float32":
            raise ValueError(f"quantization='int8' computes around its int8 matmuls in float32: dtype must be "
                             f"'float32', got {self.dtype!r}")
        if self.is_encoder_decoder:
            if self.max_source_positions is None:
                raise ValueError("max_source_positions is required for an encoder/decoder model")
            _require_positive("max_source_positions", self.max_source_positions)
            if self.decoder_start_token_id is None:
                raise ValueError("decoder_start_token_id is required for an encoder/decoder model")
        elif self.max_source_positions is not None:
            raise ValueError("max_source_positions is only meaningful for an encoder/decoder model")

    @property
    def max_model_len(self) -> int:
        """Longest decoder sequence (prompt + generated tokens) the model accepts."""
        return self.max_target_positions

    @property
    def max_encoder_len(self) -> int:
        """Longest encoder sequence; 0 for a decoder-only model."""
        return self.max_source_positions or 0


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache geometry. Block counts may be given directly (tests) or derived from memory sizes."""

    block_size: int = 16
    kv_cache_space_gb: float = 4.0
    swap_space_gb: float = 1.0
    num_gpu_blocks: Optional[int] = None
    num_cpu_blocks: Optional[int] = None
    watermark: float = 0.01
    # "auto": the model's dtype, except bfloat16 for int8-quantized models (decisions §28); or one of
    # KV_CACHE_DTYPE_NAMES (fp8 on CUDA only: decisions §88).
    cache_dtype: str = "auto"
    # Free blocks keep what they held until the pool needs them: full decoder blocks found again by their token
    # prefix (vLLM's automatic prefix caching), cross tables found again by their encoder input.
    enable_prefix_caching: bool = True
    enable_encoder_cache: bool = True
    # At most this many free blocks keep cached content (None: any number); the engine sets it for a CPU pool
    # (decisions §29).
    max_cached_blocks: Optional[int] = None

    def __post_init__(self) -> None:
        _require_positive("block_size", self.block_size)
        if self.cache_dtype not in ("auto",) + KV_CACHE_DTYPE_NAMES:
            raise ValueError(f"kv_cache_dtype must be 'auto' or one of {KV_CACHE_DTYPE_NAMES}, got "
                             f"{self.cache_dtype!r}")
        if self.kv_cache_space_gb <= 0:
            raise ValueError(f"kv_cache_space_gb must be > 0, got {self.kv_cache_space_gb!r}")
        if self.swap_space_gb < 0:
            raise ValueError(f"swap_space_gb must be >= 0, got {self.swap_space_gb!r}")
        _require_positive("num_gpu_blocks", self.num_gpu_blocks)
        if self.max_cached_blocks is not None and (not isinstance(self.max_cached_blocks, int)
                                                   or self.max_cached_blocks < 0):
            raise ValueError(f"max_cached_blocks must be None or an integer >= 0, got {self.max_cached_blocks!r}")
        if self.num_cpu_blocks is not None and (not isinstance(self.num_cpu_blocks, int) or self.num_cpu_blocks < 0):
            raise ValueError(f"num_cpu_blocks must be a non-negative integer, got {self.num_cpu_blocks!r}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark!r}")


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    """Continuous-batching limits and policies."""

    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_model_len: int = 2048
    max_encoder_len: int = 0
    policy: str = "fcfs"
    preemption_mode: str = "recompute"
    enable_chunked_prefill: bool = False
    # Widest beam search a request may ask for; None: min(16, max_num_seqs). All beams of a request run in
    # the same step, so it cannot exceed max_num_seqs.
    max_beam_width: Optional[int] = None
    # Distinct LoRA adapters the running requests may hold (the device slots); 0: LoRA off, no limit.
    max_loras: int = 0
    # vLLM's name: a decode step is scheduled and launched before the previous step's tokens reach the host
    # (engine/async_scheduling.py); outputs are the same as without it.
    async_scheduling: bool = False

    def __post_init__(self) -> None:
        _require_positive("max_num_batched_tokens", self.max_num_batched_tokens)
        _require_positive("max_num_seqs", self.max_num_seqs)
        _require_positive("max_beam_width", self.max_beam_width)
        if self.max_beam_width is None:
            object.__setattr__(self, "max_beam_width", min(_DEFAULT_MAX_BEAM_WIDTH, self.max_num_seqs))
        if self.max_beam_width > self.max_num_seqs:
            raise ValueError(f"max_beam_width ({self.max_beam_width}) must be <= max_num_seqs ({self.max_num_seqs}): "
                             f"all beams of a request run in the same step")
        _require_positive("max_model_len", self.max_model_len)
        if self.policy not in _POLICIES:
            raise ValueError(f"policy must be one of {_POLICIES}, got {self.policy!r}")
        if self.preemption_mode not in _PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {_PREEMPTION_MODES}, got {self.preemption_mode!r}")
        longest_prompt = max(self.max_model_len, self.max_encoder_len)
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < longest_prompt:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than the longest prompt the model "
                f"accepts ({longest_prompt}); raise it or set enable_chunked_prefill=True")


@dataclasses.dataclass(frozen=True)
class DeviceConfig:
    """Where the model runs: 'cpu' or 'cuda'; 'auto' picks cuda when available."""

    device: str = "auto"

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")

    @property
    def resolved(self) -> str:
        if self.device != "auto":
            return self.device
        import torch
        return "cuda" if torch.cuda.is_available() else "cpu"


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Everything the engine is built from."""

    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    device_config: DeviceConfig = dataclasses.field(default_factory=DeviceConfig)
    lora_config: Optional[LoRAConfig] = None      # None: no LoRA adapters

    @property
    def kv_cache_dtype(self) -> str:
        """The KV cache's dtype name: the cache config's, or for "auto" the model's (bfloat16 under int8
        quantization, whose float32 activations lose nothing that matters in bfloat16 K/V: decisions §28)."""
        if self.cache_config.cache_dtype != "auto":
            return self.cache_config.cache_dtype
        return "bfloat16" if self.model_config.quantization == "int8" else self.model_config.dtype

    def __post_init__(self) -> None:
        on_cpu = self.device_config.resolved == "cpu"
        if on_cpu and self.kv_cache_dtype in FP8_CACHE_NAMES:
            major, minor = FP8_CACHE_CAPABILITY
            raise ValueError(f"kv_cache_dtype {self.kv_cache_dtype!r} needs a CUDA GPU of compute capability "
                             f"{major}.{minor} or later; the CPU kernels read {', '.join(DTYPE_NAMES)} caches")
        if not on_cpu and self.kv_cache_dtype not in (self.model_config.dtype,) + FP8_CACHE_NAMES:
            raise ValueError(f"kv_cache_dtype {self.kv_cache_dtype!r} differs from the model's dtype "
                             f"{self.model_config.dtype!r}: on a GPU the cache is the model's dtype or fp8")


# Length limit (both sides) of models with relative positions and no position table (T5): their pretraining length.
RELATIVE_POSITION_MAX_LEN = 512


def _first_token_id(value) -> Optional[int]:
    """Configs may give a token id as an int or a list (several EOS ids); the engine keeps the first."""
    if isinstance(value, (list, tuple)):
        return value[0] if value else None
    return value


def model_config_from_hf(model: str, hf_config: Any, dtype: str = "float32", seed: int = 0,
                         skip_tokenizer_init: bool = False, max_model_len: Optional[int] = None,
                         max_logprobs: int = 20, quantization: Optional[str] = None,
                         enforce_eager: bool = False) -> ModelConfig:
    """ModelConfig from a transformers config (BART: max_position_embeddings bounds both sides;
    Whisper: max_source_positions / max_target_positions; T5: relative positions, RELATIVE_POSITION_MAX_LEN)."""
    is_encoder_decoder = bool(getattr(hf_config, "is_encoder_decoder", False))
    max_positions = getattr(hf_config, "max_position_embeddings", None)
    if max_positions is None and hasattr(hf_config, "relative_attention_num_buckets"):
        max_positions = getattr(hf_config, "n_positions", None) or RELATIVE_POSITION_MAX_LEN
    max_target = getattr(hf_config, "max_target_positions", None) or max_positions
    if max_target is None:
        raise ValueError(f"cannot tell the maximum sequence length of {type(hf_config).__name__}")
    if max_model_len is not None:
        if max_model_len > max_target:
            raise ValueError(f"max_model_len={max_model_len} exceeds the model's {max_target} positions")
        max_target = max_model_len
    max_source = (getattr(hf_config, "max_source_positions", None) or max_positions) if is_encoder_decoder else None
    return ModelConfig(
        model=model, vocab_size=hf_config.vocab_size, max_target_positions=max_target,
        is_encoder_decoder=is_encoder_decoder, max_source_positions=max_source,
        decoder_start_token_id=getattr(hf_config, "decoder_start_token_id", None) if is_encoder_decoder else None,
        bos_token_id=_first_token_id(getattr(hf_config, "bos_token_id", None)),
        eos_token_id=_first_token_id(getattr(hf_config, "eos_token_id", None)),
        pad_token_id=_first_token_id(getattr(hf_config, "pad_token_id", None)),
        default_decoder_prompt_has_bos=getattr(hf_config, "model_type", None) not in _START_ONLY_DECODER_PROMPT,
        dtype=dtype, quantization=quantization, seed=seed, skip_tokenizer_init=skip_tokenizer_init,
        max_logprobs=max_logprobs, takes_audio=is_encoder_decoder and hasattr(hf_config, "num_mel_bins"),
        enforce_eager=enforce_eager, hf_config=hf_config)
