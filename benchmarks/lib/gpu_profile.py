"""Where one run of this engine spends the GPU's time: the kernels with the most device time under the torch
profiler, their share of the run's wall time, and the time the GPU had no kernel to run (`gpu_throughput.py
--profile`)."""
import time
from typing import Any, Callable, Dict, List

import torch

# kernel-name fragments -> the group a profile row is reported under
GROUPS = (("paged decode attention (triton)", ("paged",)), ("KV cache writes and copies (triton)", ("_write_kernel",
          "_copy_blocks")), ("SDPA attention (flash, memory-efficient)", ("flash", "fmha", "attention")),
          ("matmuls", ("gemm", "nvjet", "cutlass", "xmma", "splitk")), ("other", ("",)))


def _group(name: str) -> str:
    lowered = name.lower()
    for group, fragments in GROUPS:
        if any(fragment in lowered for fragment in fragments):
            return group
    return "other"


def profile_run(run: Callable[[], Any], top: int = 15) -> Dict[str, Any]:
    """Runs `run` once under the profiler (CUDA activity); the top kernels by device time and the totals."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        run()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    kernels: List[Dict[str, Any]] = []
    for event in prof.key_averages():
        device_us = getattr(event, "self_device_time_total", None)
        if device_us is None:
            device_us = event.self_cuda_time_total
        if device_us > 0:
            kernels.append({"name": event.key[:90], "calls": event.count, "seconds": device_us / 1e6})
    kernels.sort(key=lambda k: -k["seconds"])
    busy = sum(k["seconds"] for k in kernels)
    groups: Dict[str, float] = {}
    for kernel in kernels:
        groups[_group(kernel["name"])] = groups.get(_group(kernel["name"]), 0.0) + kernel["seconds"]
    return {"wall_s": wall, "kernel_s": busy, "idle_share": max(0.0, 1.0 - busy / wall) if wall else None,
            "groups_s": groups, "top": kernels[:top]}


def describe(title: str, profile: Dict[str, Any]) -> str:
    """The profile as a few printable lines."""
    lines = [f"profile {title}: wall {profile['wall_s']:.2f} s, kernels {profile['kernel_s']:.2f} s "
             f"(GPU idle {profile['idle_share']:.0%} of the wall time, under the profiler)"]
    by_time = sorted(profile["groups_s"].items(), key=lambda item: -item[1])
    lines += [f"  {group}: {seconds:.3f} s" for group, seconds in by_time]
    lines += [f"    {k['seconds']:.3f} s  {k['calls']:>6}x  {k['name']}" for k in profile["top"]]
    return "\n".join(lines)
