"""The platform's kernel policy resolved against what built here: the table `seq2seq-engine env` prints and the line
the engine logs at start."""
from __future__ import annotations

from typing import List, Tuple

from seq2seq_engine.kernels.native import load_library
from seq2seq_engine.kernels.native_attention import paged_attention_isa
from seq2seq_engine.kernels.native_int8 import int8_linear_available, int8_linear_isa
from seq2seq_engine.kernels.native_linear import panel_linear_isa
from seq2seq_engine.models.int8 import activations_need_reduced_range, int8_unsupported_reason
from seq2seq_engine.models.packed_linear import float32_packing
from seq2seq_engine.platforms import CudaPlatform, Platform

# What each float32 packing is, for the table.
_FLOAT32_NAMES = {"panels": "native panel kernel", "onednn": "oneDNN prepacked", None: "torch F.linear"}


def _float32_linear(decode_step: bool) -> str:
    packing = float32_packing(decode_step=decode_step)
    name = _FLOAT32_NAMES[packing]
    return f"{name} ({panel_linear_isa()})" if packing == "panels" else name


def _int8_linear() -> str:
    reason = int8_unsupported_reason("cpu")
    if int8_linear_available():
        return f"native int8 kernel ({int8_linear_isa()}, 8-bit activations per row)"
    if reason is not None:
        return "unavailable: " + reason
    bits = 7 if activations_need_reduced_range() else 8
    return f"fbgemm ({bits}-bit activations per row)"


def _native_or_torch(library: str, native: str, torch_path: str) -> str:
    return native if load_library(library) is not None else torch_path


def cpu_kernel_table(platform: Platform) -> List[Tuple[str, str]]:
    """(what, kernel) rows: which kernel each layer role x dtype and each engine operation runs on this CPU."""
    if platform.native_bf16:
        bf16 = "torch bfloat16 matmuls (native bf16)"
    elif float32_packing(decode_step=True, bf16_weights=True) == "panels":
        bf16 = f"bfloat16 weights on the native panel kernel ({panel_linear_isa()}), computed in float32"
    else:
        bf16 = "computed in float32 on bfloat16-rounded weights (no native bf16 here)"
    attention = paged_attention_isa()
    return [
        ("float32 linear, decode step", _float32_linear(decode_step=True)),
        ("float32 linear, other", _float32_linear(decode_step=False)),
        ("bfloat16 linear", bf16),
        ("int8 linear", _int8_linear()),
        ("prefill attention", "torch SDPA per block of the block-diagonal mask"),
        ("encoder attention, int8 models", "bfloat16 (native bf16)"
         if platform.encoder_attention_dtype("int8") == "bfloat16" else "float32"),
        ("paged decode attention", f"native ({attention})" if attention != "none" else "torch gather"),
        ("KV cache writes", _native_or_torch("cache_write_cpu", "native row copy", "torch index_copy_")),
        ("norms, rotary, gated activations", _native_or_torch("fused_ops_cpu", "native fused", "torch")),
        ("greedy sampling", _native_or_torch("greedy_cpu", "native argmax + logsumexp", "torch")),
        ("LoRA shrink/expand (float32)", _native_or_torch("lora_cpu", "native tiles, rows of an adapter together",
                                                          "torch, one matmul per adapter")),
    ]


def kernel_table(platform: Platform) -> List[Tuple[str, str]]:
    """The platform's rows: the CPU table, or the CUDA backends."""
    if isinstance(platform, CudaPlatform):
        return platform.kernel_rows()
    return cpu_kernel_table(platform)


def startup_line(platform: Platform) -> str:
    """One line naming the platform and its choices, for the engine's start-up log."""
    facts = platform.describe()
    head = f"platform {platform.name}: " + ", ".join(f"{key} {value}" for key, value in facts.items())
    return head + "; kernels: " + "; ".join(f"{what}: {kernel}" for what, kernel in kernel_table(platform))
