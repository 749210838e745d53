"""The CPU platform: the probed CPU, capped by SEQ2SEQ_ENGINE_CPU_ISA, and the one policy table that picks every kernel.

Kernels and models ask this table; none of them reads the CPU or an override to decide on its own. The table gives
preference orders: a kernel that did not build here (no compiler, SEQ2SEQ_ENGINE_NATIVE_KERNELS=0) is skipped for
the next one, which the kernel tables of models/kernel_table.py resolve for the start-up line and
`seq2seq-engine env`.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from typing import Dict, Tuple

from .cpu_probe import INTEL, CpuInfo
from .overrides import env_switch, override_value

ISA_LEVELS = ("portable", "avx2", "avx512")
ISA_ENV = "SEQ2SEQ_ENGINE_CPU_ISA"
MARCH_ENV = "SEQ2SEQ_ENGINE_NATIVE_MARCH"
PACKED_LINEAR_ENV = "SEQ2SEQ_ENGINE_PACKED_LINEAR"
INT8_BF16_ATTENTION_ENV = "SEQ2SEQ_ENGINE_INT8_BF16_ATTENTION"
# The compiler target of a capped level (x86-64 micro-architecture levels: v3 is AVX2 + FMA, v2 has no AVX).
CAPPED_MARCH = {"avx2": "x86-64-v3", "portable": "x86-64-v2"}
# What a cap sets for the libraries, where the user did not (they read these once, when torch loads them).
LIBRARY_CAPS = {
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
             "ATEN_CPU_CAPABILITY": "avx2"},
    "portable": {"ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ATEN_CPU_CAPABILITY": "default"},
}
LINEAR_ROLES = ("decode_step", "other")
FLOAT32_KERNELS = ("panels", "onednn", "torch")
# fbgemm's own ISA switch; without VNNI its int8 kernels add u8 x s8 pairs in int16 with saturation.
_FBGEMM_ENV = "FBGEMM_ENABLE_INSTRUCTIONS"
_FBGEMM_NO_VNNI = ("AVX2", "AVX512", "AVX512_256")


def isa_cap() -> str:
    """The SEQ2SEQ_ENGINE_CPU_ISA level ("auto" when unset); a value that is not a level is refused."""
    value = override_value(ISA_ENV).lower() or "auto"
    if value != "auto" and value not in ISA_LEVELS:
        raise ValueError(f"{ISA_ENV} must be auto, {', '.join(reversed(ISA_LEVELS))}, got {value!r}")
    return value


def apply_library_caps() -> bool:
    """Cap oneDNN, MKL, fbgemm and ATen at SEQ2SEQ_ENGINE_CPU_ISA's level (only variables the user did not set);
    True if that can still take effect (torch not yet imported)."""
    cap = isa_cap()
    for name, value in LIBRARY_CAPS.get(cap, {}).items():
        os.environ.setdefault(name, value)
    return "torch" not in sys.modules


def detected_isa(info: CpuInfo) -> str:
    """The highest level of ISA_LEVELS the CPU has (AVX-512 counts with F, BW and VL, as the kernels use them)."""
    if info.has("avx512f", "avx512bw", "avx512vl"):
        return "avx512"
    return "avx2" if info.has("avx2", "fma") else "portable"


@dataclasses.dataclass(frozen=True)
class CpuPlatform:
    """The CPU and the level its kernels run at (the detected level, lowered by SEQ2SEQ_ENGINE_CPU_ISA)."""
    info: CpuInfo
    isa: str
    name: str = "cpu"

    @classmethod
    def from_cpu(cls, info: CpuInfo) -> "CpuPlatform":
        detected, cap = detected_isa(info), isa_cap()
        level = detected if cap == "auto" else min(detected, cap, key=ISA_LEVELS.index)
        return cls(info, level)

    @property
    def native_bf16(self) -> bool:
        """Whether bfloat16 matmuls run natively (AVX512_BF16 or AMX) at this level."""
        return self.isa == "avx512" and (self.info.has("avx512_bf16") or self.info.has("amx_bf16"))

    @property
    def int8_dot(self) -> str:
        """The 8-bit dot product the native int8 kernel uses here: avx512_vnni, avx_vnni, avx2 (exact products
        widened to 16 bits) or none."""
        if self.isa == "avx512" and self.info.has("avx512_vnni"):
            return "avx512_vnni"
        if self.isa != "portable":   # a cap at avx2 means AVX2 + FMA alone, as the x86-64-v3 build has
            return "avx_vnni" if self.info.has("avx_vnni") and isa_cap() == "auto" else "avx2"
        return "none"

    @property
    def fbgemm_needs_reduced_range(self) -> bool:
        """Whether fbgemm's int8 linear needs 7-bit activations here: it does without AVX-512 VNNI (its pairs
        of u8 x s8 products saturate in int16), or where FBGEMM_ENABLE_INSTRUCTIONS holds it below VNNI."""
        if os.environ.get(_FBGEMM_ENV, "").strip().upper() in _FBGEMM_NO_VNNI:
            return True
        return self.int8_dot != "avx512_vnni"

    def native_march(self) -> str:
        """The -march the native kernels are compiled for: SEQ2SEQ_ENGINE_NATIVE_MARCH, else the capped level's
        target, else native."""
        return override_value(MARCH_ENV) or CAPPED_MARCH.get(isa_cap(), "native")

    def compute_dtype(self, dtype: str) -> str:
        """The dtype a model asked to run in `dtype` computes in here: bfloat16 without native bf16 matmuls
        computes in float32 (emulated bf16 measured 4.9x slower than float32 on an AVX2 CPU)."""
        return "float32" if dtype == "bfloat16" and not self.native_bf16 else dtype

    def encoder_attention_dtype(self, quantization) -> str:
        """The dtype an encoder's self-attention computes in: bfloat16 for an int8 model where bf16 attention is
        faster (the int8 linears already round the activations more than bfloat16 does), else float32: on AMD CPUs
        with native bf16 (Whisper's 1,500-frame window attends 2.3x faster on Zen) and Intel ones with AMX; an Intel
        CPU with AVX-512 BF16 but no AMX attends 1.35x slower in bf16 (decisions §36).
        SEQ2SEQ_ENGINE_INT8_BF16_ATTENTION=0 keeps float32."""
        faster = self.native_bf16 and (self.info.vendor != INTEL or self.info.has("amx_bf16"))
        native = faster and env_switch(INT8_BF16_ATTENTION_ENV)
        return "bfloat16" if quantization == "int8" and native else "float32"

    def float32_linear_order(self, role: str) -> Tuple[str, ...]:
        """FLOAT32_KERNELS in the order a float32 linear of `role` (LINEAR_ROLES) tries them: the panels first (their
        AVX-512 or AVX2 tiles), except oneDNN first for the other linears on Intel CPUs and below AVX-512, where it
        measured faster over many rows (decisions §34). SEQ2SEQ_ENGINE_PACKED_LINEAR forces one or plain F.linear."""
        if role not in LINEAR_ROLES:
            raise ValueError(f"linear role must be one of {LINEAR_ROLES}, got {role!r}")
        choice = override_value(PACKED_LINEAR_ENV).lower()
        if not env_switch(PACKED_LINEAR_ENV):
            return ("torch",)
        if choice in ("panels", "onednn"):
            return (choice,)
        if choice not in ("", "1", "true", "yes", "on", "auto"):
            raise ValueError(f"{PACKED_LINEAR_ENV} must be 0, 1, panels or onednn, got {choice!r}")
        if role == "other" and (self.info.vendor == INTEL or self.isa != "avx512"):
            return ("onednn", "panels", "torch")
        return ("panels", "onednn", "torch")

    def describe(self) -> Dict[str, str]:
        """The machine facts a report names."""
        info = self.info
        return {"cpu": f"{info.model_name or '?'} ({info.vendor or '?'}), {info.cores} cores",
                "caches": f"L2 {info.l2_bytes >> 10} KiB, L3 {info.l3_bytes >> 20} MiB",
                "isa flags": info.isa_flags,
                "kernel level": self.isa + ("" if isa_cap() == "auto" else f" (capped by {ISA_ENV})"),
                "native march": self.native_march(),
                "bfloat16": "native" if self.native_bf16 else "bf16 weights computed in float32 (no AVX512_BF16/AMX)",
                "int8 dot product": self.int8_dot}
