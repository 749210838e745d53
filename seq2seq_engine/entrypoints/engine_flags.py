"""The engine flags every command shares: the weights' precision, the device and eager execution."""
from __future__ import annotations

from typing import Any


def add_precision_arguments(group: Any) -> None:
    """--dtype, --quantization, --kv-cache-dtype, --device and --enforce-eager on an argparse parser or argument
    group."""
    group.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    group.add_argument("--quantization", default=None, choices=["int8"],
                       help="int8: Linear layers on int8 weights and dynamic int8 activations (CPU, float32)")
    group.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                       help="the KV cache's dtype; auto: the model's, bfloat16 with --quantization int8")
    group.add_argument("--device", default="auto", help="auto, cpu or cuda")
    group.add_argument("--enforce-eager", action="store_true",
                       help="run every step eagerly: no CUDA graphs for decode steps (no effect on the CPU)")
