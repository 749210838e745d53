"""The xformers attention backend (CUDA): prefill through xformers' memory-efficient kernels with the
block-diagonal masks converted to xformers' bias classes; decode through the same paged kernels as the torch backend."""
from __future__ import annotations

import logging
from typing import Any, Optional, Tuple

import torch

from seq2seq_engine.attention.backends.torch_backend import TorchAttentionBackend
from seq2seq_engine.attention.bias import AttentionBias

# The last conversion: every layer of a step gets the same mask object, so each step converts once.
_last_conversion: Optional[Tuple[AttentionBias, torch.device, Any]] = None


def _xformers_attn_bias():
    """xformers.ops.fmha.attn_bias, imported only here: it pulls in torch._dynamo (about a second)."""
    # On CPU-only torch, importing xformers logs a long warning about missing CUDA kernels; it is harmless here.
    logger = logging.getLogger("xformers")
    previous = logger.level
    logger.setLevel(logging.ERROR)
    try:
        from xformers.ops.fmha import attn_bias
    finally:
        logger.setLevel(previous)
    return attn_bias


def _lengths(starts) -> list:
    return [end - start for start, end in zip(starts[:-1], starts[1:])]


def to_xformers_bias(bias: AttentionBias, device: torch.device):
    """xformers' bias of the same kind (BlockDiagonalMask, BlockDiagonalCausalMask or
    BlockDiagonalCausalFromBottomRightMask) over the same blocks, its tensors on `device`."""
    global _last_conversion
    last = _last_conversion
    if last is not None and last[0] is bias and last[1] == device:
        return last[2]
    attn_bias = _xformers_attn_bias()
    if bias.bottom_right:
        kind = attn_bias.BlockDiagonalCausalFromBottomRightMask
    elif bias.causal:
        kind = attn_bias.BlockDiagonalCausalMask
    else:
        kind = attn_bias.BlockDiagonalMask
    converted = kind.from_seqlens(_lengths(bias.q_seqinfo.seqstart_py), _lengths(bias.k_seqinfo.seqstart_py),
                                  device=device)
    _last_conversion = (bias, device, converted)
    return converted


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
        out = fmha.memory_efficient_attention_forward(
            query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0),
            attn_bias=to_xformers_bias(bias, query.device), scale=scale)
        return out.squeeze(0)


def select_backend(device: torch.device) -> TorchAttentionBackend:
    """xformers on CUDA, torch elsewhere (every xformers kernel is CUDA-only)."""
    if torch.device(device).type == "cuda":
        return XFormersAttentionBackend()
    return TorchAttentionBackend()
