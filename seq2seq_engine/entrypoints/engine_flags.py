"""The engine flags every command shares: precision, device, eager execution, the KV caches and a LoRA adapter."""
from __future__ import annotations

import argparse
import os
from typing import Any, Dict, Optional

from seq2seq_engine.integrations.adapters import lora_engine_kwargs
from seq2seq_engine.lora_request import LoRARequest


def add_precision_arguments(group: Any) -> None:
    """--dtype, --quantization, --kv-cache-dtype, --device, --enforce-eager, --async-scheduling and the KV cache
    switches on an argparse parser or argument group."""
    group.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    group.add_argument("--quantization", default=None, choices=["int8"],
                       help="int8: Linear layers on int8 weights and dynamic int8 activations (CPU, float32)")
    group.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "float32", "bfloat16", "fp8", "fp8_e4m3"],
                       help="the KV cache's dtype; auto: the model's, bfloat16 with --quantization int8; fp8 "
                            "(float8 e4m3, half a bfloat16 cache's memory and reads): CUDA GPUs of compute "
                            "capability 8.9 or later")
    group.add_argument("--device", default="auto", help="auto, cpu or cuda")
    group.add_argument("--enforce-eager", action="store_true",
                       help="run every step eagerly: no CUDA graphs for decode steps (no effect on the CPU)")
    group.add_argument("--async-scheduling", action="store_true",
                       help="launch each decode step before the previous step's tokens reach the host (outputs "
                            "unchanged; it pays where a GPU runs beside the host, not on the CPU)")
    group.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                       help="find full decoder blocks again by their token prefix, not computing them twice "
                            "(automatic prefix caching; default on)")
    group.add_argument("--enable-encoder-cache", action=argparse.BooleanOptionalAction, default=True,
                       help="requests with the same encoder input (text or audio window) share one cross-attention "
                            "table, written by one encoder run (default on)")


# The EngineArgs / LLM keyword arguments of the on/off switches: the KV caches and asynchronous scheduling.
SWITCH_FLAG_NAMES = ("enable_prefix_caching", "enable_encoder_cache", "async_scheduling")


def switch_kwargs(args: argparse.Namespace) -> Dict[str, bool]:
    """The on/off switches of parsed arguments as EngineArgs / LLM keyword arguments."""
    return {name: getattr(args, name) for name in SWITCH_FLAG_NAMES}


def add_lora_arguments(group: Any) -> None:
    """--lora, --lora-name and --max-lora-rank: one LoRA adapter every request of the command runs with."""
    group.add_argument("--lora", default=None, metavar="PATH",
                       help="a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) every "
                            "request runs with")
    group.add_argument("--lora-name", default=None, metavar="NAME",
                       help="with --lora: the adapter's name in logs (default: its directory's name)")
    group.add_argument("--max-lora-rank", type=int, default=None, metavar="RANK",
                       help="with --lora: the engine's max_lora_rank (default: the adapter's rank, rounded up to 8, "
                            "16, 32, 64, 128 or 256)")


def lora_request_from_args(args: argparse.Namespace) -> Optional[LoRARequest]:
    """The adapter of --lora (id 1, its path made absolute), or None; ValueError for --lora-name or --max-lora-rank
    without --lora, or a --lora that is no directory."""
    path = getattr(args, "lora", None)
    if path is None:
        given = [flag for flag, name in (("--lora-name", "lora_name"), ("--max-lora-rank", "max_lora_rank"))
                 if getattr(args, name, None) is not None]
        if given:
            raise ValueError(f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} --lora")
        return None
    if not os.path.isdir(path):
        raise ValueError(f"--lora {path}: no such directory (a PEFT LoRA adapter directory)")
    path = os.path.abspath(path)
    return LoRARequest(args.lora_name or os.path.basename(path.rstrip(os.sep)) or path, 1, path)


def lora_kwargs(args: argparse.Namespace) -> Dict[str, Any]:
    """The engine's LoRA keyword arguments for --lora: enable_lora and max_lora_rank (none without --lora)."""
    path = getattr(args, "lora", None)
    if path is None:
        return {}
    given = {} if args.max_lora_rank is None else {"max_lora_rank": args.max_lora_rank}
    return lora_engine_kwargs([path], given)
