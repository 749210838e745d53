"""xformers' memory-efficient prefill attention (CUDA) over the engine's block-diagonal masks, converted to xformers'
bias classes once per step's mask; grouped-query heads as expanded views."""
from __future__ import annotations

import logging
from typing import Any, Optional, Tuple

import torch

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


def xformers_prefill(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: AttentionBias,
                     scale: float) -> Optional[torch.Tensor]:
    """Block-diagonal attention by xformers' memory-efficient kernels: query [Tq, H, D], key/value [Tk, Hkv, D] ->
    [Tq, H, D]; None where xformers has no kernel for these inputs (the caller then runs torch SDPA). Grouped-query
    heads go in xformers' 5-D form [1, T, Hkv, H / Hkv, D], K/V expanded over the group as views, never copied."""
    from xformers.ops import fmha

    num_tokens, num_heads, head_size = query.shape
    num_kv_tokens, num_kv_heads = key.shape[0], key.shape[1]
    if num_heads == num_kv_heads:
        query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
    else:
        group = num_heads // num_kv_heads
        grouped = (1, num_kv_tokens, num_kv_heads, group, head_size)
        query = query.view(1, num_tokens, num_kv_heads, group, head_size)
        key = key.view(1, num_kv_tokens, num_kv_heads, 1, head_size).expand(grouped)
        value = value.view(1, num_kv_tokens, num_kv_heads, 1, head_size).expand(grouped)
    try:
        out = fmha.memory_efficient_attention_forward(query, key, value, attn_bias=to_xformers_bias(bias, query.device),
                                                      scale=scale)
    except NotImplementedError as error:  # xformers' "no operator found for these inputs"
        _warn_once(str(error).splitlines()[0] if str(error) else type(error).__name__)
        return None
    return out.reshape(num_tokens, num_heads, head_size)


_warned: set = set()


def _warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        logging.getLogger(__name__).warning("xformers cannot run this prefill (%s); torch SDPA runs it", reason)
