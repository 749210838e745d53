"""The engine flags every command shares: the weights' precision, the device, eager execution and the KV caches."""
from __future__ import annotations

import argparse
from typing import Any, Dict


def add_precision_arguments(group: Any) -> None:
    """--dtype, --quantization, --kv-cache-dtype, --device, --enforce-eager and the KV cache switches on an argparse
    parser or argument group."""
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
    group.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                       help="find full decoder blocks again by their token prefix, not computing them twice "
                            "(automatic prefix caching; default on)")
    group.add_argument("--enable-encoder-cache", action=argparse.BooleanOptionalAction, default=True,
                       help="requests with the same encoder input (text or audio window) share one cross-attention "
                            "table, written by one encoder run (default on)")


# The EngineArgs / LLM keyword arguments of the KV cache switches.
CACHE_FLAG_NAMES = ("enable_prefix_caching", "enable_encoder_cache")


def cache_kwargs(args: argparse.Namespace) -> Dict[str, bool]:
    """The KV cache switches of parsed arguments as EngineArgs / LLM keyword arguments."""
    return {name: getattr(args, name) for name in CACHE_FLAG_NAMES}
