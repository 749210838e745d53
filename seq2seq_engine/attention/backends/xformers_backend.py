"""The xformers attention backend (CUDA): prefill through xformers' memory-efficient kernels with the
block-diagonal biases; decode through the same paged kernels as the torch backend."""
from __future__ import annotations

import torch

from seq2seq_engine.attention.backends.torch_backend import TorchAttentionBackend


class XFormersAttentionBackend(TorchAttentionBackend):
    name = "xformers"

    def prefill_attention(self, query, key, value, bias, scale, position_bias=None):
        if position_bias is not None:  # a per-block float mask: the torch path builds it
            return super().prefill_attention(query, key, value, bias, scale, position_bias)
        from xformers.ops import fmha

        num_heads, num_kv_heads = query.shape[1], key.shape[1]
        if num_heads != num_kv_heads:
            group = num_heads // num_kv_heads
            key = key.repeat_interleave(group, dim=1)
            value = value.repeat_interleave(group, dim=1)
        if hasattr(bias, "to"):
            bias = bias.to(query.device)
        out = fmha.memory_efficient_attention_forward(
            query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0), attn_bias=bias, scale=scale)
        return out.squeeze(0)


def select_backend(device: torch.device) -> TorchAttentionBackend:
    """xformers on CUDA, torch elsewhere (every xformers kernel is CUDA-only)."""
    if torch.device(device).type == "cuda":
        return XFormersAttentionBackend()
    return TorchAttentionBackend()
