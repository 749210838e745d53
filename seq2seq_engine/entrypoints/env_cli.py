"""`seq2seq-engine env`: the machine, the library versions, the kernel table and the families, for a bug report."""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform as host
import sys
from typing import List, Tuple

from seq2seq_engine.platforms.overrides import OVERRIDES, override_value

PACKAGES = ("seq2seq-engine", "torch", "transformers", "tokenizers", "xformers", "ctranslate2", "numpy",
            "safetensors", "sentencepiece", "av", "silero-vad", "ray", "fastapi", "uvicorn")
LIBRARY_ENV = ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "FBGEMM_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY",
               "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def add_parser(commands) -> None:
    parser = commands.add_parser("env", help="print the machine, library versions and the kernel each layer runs")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="the platform to describe")


def _versions() -> List[Tuple[str, str]]:
    rows = [("python", sys.version.split()[0]), ("os", host.platform())]
    for name in PACKAGES:
        try:
            rows.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            rows.append((name, "not installed"))
    return rows


def _environment() -> List[Tuple[str, str]]:
    rows = [(o.name, override_value(o.name)) for o in OVERRIDES if override_value(o.name)]
    rows += [(name, os.environ[name]) for name in LIBRARY_ENV if name in os.environ]
    return rows or [("(none set)", "")]


def _families() -> List[Tuple[str, str]]:
    """Each architecture the engine loads, and whether it serves LoRA adapters (`enable_lora`)."""
    from seq2seq_engine.models.registry import load_model_class, supported_architectures
    return [(name, "LoRA adapters" if getattr(load_model_class(name), "supports_lora", False) else "no LoRA")
            for name in supported_architectures()]


def _section(title: str, rows: List[Tuple[str, str]]) -> str:
    width = max(len(key) for key, _ in rows)
    return "\n".join([f"## {title}", *(f"{key:<{width}}  {value}" for key, value in rows), ""])


def report(device: str = "cpu") -> str:
    """The whole report as text."""
    import torch

    from seq2seq_engine.models.kernel_table import kernel_table
    from seq2seq_engine.platforms import current_platform
    platform = current_platform(device)
    machine = [*platform.describe().items(), ("torch threads", str(torch.get_num_threads())),
               ("torch cpu capability", torch.backends.cpu.get_cpu_capability())]
    return "\n".join([_section(f"platform: {platform.name}", machine), _section("versions", _versions()),
                      _section("environment", _environment()), _section("kernels", kernel_table(platform)),
                      _section("model families", _families())])


def run(args: argparse.Namespace) -> int:
    print(report(args.device))
    return 0
