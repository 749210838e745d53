"""Attention backends: `torch` (any device, the CPU default) and `xformers` (CUDA prefill kernels)."""
