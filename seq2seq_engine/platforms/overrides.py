"""Every SEQ2SEQ_ENGINE_* environment override, read here and nowhere else; docs/platforms.md lists the same table."""
from __future__ import annotations

import dataclasses
import os
from typing import Tuple

PREFIX = "SEQ2SEQ_ENGINE_"
OFF_VALUES = ("0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class Override:
    """One environment variable the engine reads: its values, its default and what it changes."""
    name: str
    values: str
    default: str
    effect: str


OVERRIDES: Tuple[Override, ...] = (
    Override("SEQ2SEQ_ENGINE_CPU_ISA", "auto, avx512, avx2, portable", "auto",
             "caps the instruction sets the kernel policy and the native kernels use (avx2: AVX2 + FMA, as on most "
             "desktop CPUs; portable: no AVX); set before the engine is imported, it also caps oneDNN, MKL, fbgemm "
             "and ATen where the user did not"),
    Override("SEQ2SEQ_ENGINE_NATIVE_KERNELS", "1, 0", "1",
             "0: no native C kernel is built or run; every kernel takes its torch path"),
    Override("SEQ2SEQ_ENGINE_NATIVE_MARCH", "a gcc -march value", "from SEQ2SEQ_ENGINE_CPU_ISA (native)",
             "the -march the native kernels are compiled for (x86-64-v3 builds the AVX2 paths on any x86-64 CPU)"),
    Override("SEQ2SEQ_ENGINE_PACKED_LINEAR", "1, panels, onednn, 0", "1",
             "float32 linear layers: the policy table's choice, the panel kernel or oneDNN for every layer, or "
             "plain F.linear"),
    Override("SEQ2SEQ_ENGINE_INT8_BF16_ATTENTION", "1, 0", "1",
             "0: an int8 model's encoder self-attention computes in float32 even where bfloat16 is native"),
    Override("SEQ2SEQ_ENGINE_CACHE", "a directory", "~/.cache/seq2seq_engine",
             "where converted models, prepared weights and built native kernels are kept"),
    Override("SEQ2SEQ_ENGINE_LOGGING_LEVEL", "a logging level name", "INFO", "the engine's log level"),
    Override("SEQ2SEQ_ENGINE_MALLOC_TUNING", "1, 0", "1",
             "0: leave glibc malloc's trim and mmap thresholds as they are"),
    Override("SEQ2SEQ_ENGINE_STARTUP_GC", "1, 0", "1",
             "0: no garbage collection and freeze after the engine is built"),
    Override("SEQ2SEQ_ENGINE_ALLOW_RUNTIME_LORA_UPDATING", "true, false", "false",
             "true: `seq2seq-engine serve` adds /v1/load_lora_adapter and /v1/unload_lora_adapter, as "
             "--allow-runtime-lora-updating (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING works too)"),
)
_BY_NAME = {override.name: override for override in OVERRIDES}


def override_value(name: str) -> str:
    """The user's value of a registered override, stripped ("" when unset); an unregistered name is a bug."""
    if name not in _BY_NAME:
        raise KeyError(f"{name} is not a registered override (seq2seq_engine/platforms/overrides.py)")
    return os.environ.get(name, "").strip()


def env_switch(name: str) -> bool:
    """An on/off override that is on unless set to 0, false, no or off (any case)."""
    return override_value(name).lower() not in OFF_VALUES


def overrides_markdown() -> str:
    """The overrides as a Markdown table (docs/platforms.md holds it verbatim)."""
    lines = ["| variable | values | default | effect |", "|---|---|---|---|"]
    lines += [f"| `{o.name}` | {o.values} | {o.default} | {o.effect} |" for o in OVERRIDES]
    return "\n".join(lines)
