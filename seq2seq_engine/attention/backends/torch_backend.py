"""The torch attention backend: prefill by scaled_dot_product_attention per bias block, decode by paged kernels."""
from __future__ import annotations

from typing import List, Optional, Tuple, Union

import torch
import torch.nn.functional as F

from seq2seq_engine.attention.bias import AttentionBias, block_causal_mask, is_causal, segment_bounds
from seq2seq_engine.attention.metadata import AttentionMetadata
from seq2seq_engine.attention.position_bias import PositionBiasFn, StepPositionBias, as_step_bias
from seq2seq_engine.attention.types import AttentionType
from seq2seq_engine.kernels import paged_attention, reshape_and_cache
from seq2seq_engine.kernels.cache_dtype import storage_view

KVCache = Tuple[torch.Tensor, torch.Tensor]
PositionBias = Union[PositionBiasFn, StepPositionBias]


def _runs_of_equal_shape(bias: AttentionBias) -> List[Tuple[int, int, int, int, int]]:
    """Group neighbouring blocks of equal (q_len, k_len): (q_start, k_start, count, q_len, k_len)."""
    runs: List[List[int]] = []
    for q_start, q_end, k_start, k_end in segment_bounds(bias):
        q_len, k_len = q_end - q_start, k_end - k_start
        if runs and runs[-1][3] == q_len and runs[-1][4] == k_len:
            runs[-1][2] += 1
        else:
            runs.append([q_start, k_start, 1, q_len, k_len])
    return [tuple(run) for run in runs]


def varlen_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: AttentionBias,
                     scale: float, position_bias: Optional[PositionBias] = None) -> torch.Tensor:
    """Block-diagonal attention. query [Tq, H, D]; key/value [Tk, Hkv, D]; returns [Tq, H, D]. With
    ``position_bias`` each block's scores get the bias of its (query, key) positions, queries bottom-right
    aligned (a StepPositionBias hands back the masks it already built for an earlier layer)."""
    step_bias = None if position_bias is None else as_step_bias(position_bias)
    num_heads, head_size = query.shape[1], query.shape[2]
    num_kv_heads = key.shape[1]
    causal = is_causal(bias)
    bottom_right = bias.bottom_right
    output = torch.empty_like(query)
    for q_start, k_start, count, q_len, k_len in _runs_of_equal_shape(bias):
        q = query[q_start:q_start + count * q_len].view(count, q_len, num_heads, head_size).transpose(1, 2)
        k = key[k_start:k_start + count * k_len].view(count, k_len, num_kv_heads, head_size).transpose(1, 2)
        v = value[k_start:k_start + count * k_len].view(count, k_len, num_kv_heads, head_size).transpose(1, 2)
        mask, use_is_causal = None, False
        if step_bias is not None:
            if causal and not bottom_right and q_len != k_len:
                raise ValueError("a position bias needs bottom-right aligned causal blocks when q_len != k_len")
            mask = step_bias.prefill_mask(q_len, k_len, causal, query.dtype, query.device)
        elif causal and q_len == k_len:
            use_is_causal = True
        elif causal:
            mask = block_causal_mask(q_len, k_len, k_len - q_len if bottom_right else 0, query.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=use_is_causal, scale=scale,
                                             enable_gqa=num_heads != num_kv_heads)
        output[q_start:q_start + count * q_len] = out.transpose(1, 2).reshape(count * q_len, num_heads, head_size)
    return output


def _gather_context(kv_cache: KVCache, block_tables: torch.Tensor, bias: AttentionBias) -> KVCache:
    """K/V of whole prefill sequences (cached context + new tokens) read back from the paged cache."""
    key_cache, value_cache = kv_cache
    block_size = key_cache.shape[1]
    key_bytes, value_bytes = storage_view(key_cache), storage_view(value_cache)  # float8 is gathered as bytes
    keys, values = [], []
    for row, (_, _, k_start, k_end) in enumerate(segment_bounds(bias)):
        seq_len = k_end - k_start
        blocks = block_tables[row, :(seq_len + block_size - 1) // block_size].long()
        keys.append(key_bytes[blocks].flatten(0, 1)[:seq_len])
        values.append(value_bytes[blocks].flatten(0, 1)[:seq_len])
    return torch.cat(keys).view(key_cache.dtype), torch.cat(values).view(value_cache.dtype)


class TorchAttentionBackend:
    """Runs one attention call of any type; works on any device."""

    name = "torch"

    def prefill_attention(self, query, key, value, bias, scale, position_bias=None):
        return varlen_attention(query, key, value, bias, scale, position_bias)

    def forward(self, attn_type: AttentionType, query: torch.Tensor, key: Optional[torch.Tensor],
                value: Optional[torch.Tensor], kv_cache: Optional[KVCache], metadata: AttentionMetadata,
                scale: float, position_bias: Optional[PositionBias] = None) -> torch.Tensor:
        if attn_type == AttentionType.ENCODER:
            return self.prefill_attention(query, key, value, metadata.encoder.bias, scale, position_bias)
        if attn_type == AttentionType.DECODER:
            return self._decoder_self(query, key, value, kv_cache, metadata, scale, position_bias)
        if position_bias is not None:
            raise ValueError("a position bias applies to encoder and decoder self-attention, not cross-attention")
        return self._cross(query, key, value, kv_cache, metadata, scale)

    def _decoder_self(self, query, key, value, kv_cache, metadata, scale, position_bias=None):
        self_md = metadata.self_attn
        if kv_cache is not None:
            reshape_and_cache(key, value, kv_cache[0], kv_cache[1], self_md.slot_mapping)
        prefill_key, prefill_value = key[:metadata.num_prefill_tokens], value[:metadata.num_prefill_tokens]
        if self_md.prefill_block_tables is not None:
            prefill_key, prefill_value = (t.to(query.dtype) for t in _gather_context(
                kv_cache, self_md.prefill_block_tables, self_md.prefill_bias))
        decode = (self_md.decode_block_tables, self_md.decode_seq_lens, self_md.max_decode_seq_len)
        return self._prefill_and_decode(query, prefill_key, prefill_value, self_md.prefill_bias, kv_cache, decode,
                                        metadata, scale, position_bias)

    def _cross(self, query, key, value, kv_cache, metadata, scale):
        if key is not None and kv_cache is not None:
            reshape_and_cache(key, value, kv_cache[0], kv_cache[1], metadata.cross.cross_slot_mapping)
        return self.cached_cross(query, key, value, kv_cache, metadata, scale)

    def cached_cross(self, query, key, value, kv_cache, metadata, scale):
        """Cross-attention whose cross blocks the model already wrote: prefill tokens attend to ``key``/``value``
        (this step's encoder rows), or read their cross blocks when some prefill's encoder output was cached
        (``prefill_block_tables``); decode tokens read ``kv_cache`` through the cross block tables."""
        cross_md = metadata.cross
        if cross_md.prefill_block_tables is not None:
            key, value = (t.to(query.dtype) for t in _gather_context(
                kv_cache, cross_md.prefill_block_tables, cross_md.prefill_bias))
        decode = (cross_md.decode_block_tables, cross_md.decode_encoder_lens, cross_md.max_decode_encoder_len)
        return self._prefill_and_decode(query, key, value, cross_md.prefill_bias, kv_cache, decode, metadata, scale)

    def _prefill_and_decode(self, query, prefill_key, prefill_value, prefill_bias, kv_cache: KVCache,
                            decode: Tuple[torch.Tensor, torch.Tensor, int], metadata: AttentionMetadata,
                            scale: float, position_bias: Optional[PositionBias] = None) -> torch.Tensor:
        """Prefill tokens attend to prefill_key/value under prefill_bias; decode tokens read the paged cache
        through decode = (block tables, context lengths, longest context)."""
        num_prefill_tokens = metadata.num_prefill_tokens
        if not metadata.num_prefills:  # a pure decode step: the kernel's output is the whole output
            return _paged_decode(query, kv_cache, decode, scale, position_bias)
        output = torch.empty_like(query)
        output[:num_prefill_tokens] = self.prefill_attention(
            query[:num_prefill_tokens], prefill_key, prefill_value, prefill_bias, scale, position_bias)
        if metadata.num_decode_tokens:
            output[num_prefill_tokens:] = _paged_decode(query[num_prefill_tokens:], kv_cache, decode, scale,
                                                        position_bias)
        return output


def _paged_decode(query: torch.Tensor, kv_cache: KVCache, decode: Tuple[torch.Tensor, torch.Tensor, int],
                  scale: float, position_bias: Optional[PositionBias]) -> torch.Tensor:
    """Decode tokens over the paged cache, with the position bias of each query against its cached positions."""
    block_tables, context_lens, max_context_len = decode
    decode_bias = None
    if position_bias is not None:
        on_host = context_lens.device.type == "cpu"
        longest = int(context_lens.max()) if on_host and context_lens.numel() else int(max_context_len)
        decode_bias = as_step_bias(position_bias).decode_bias(context_lens, longest)
    return paged_attention(query, kv_cache[0], kv_cache[1], block_tables, context_lens, scale, max_context_len,
                           position_bias=decode_bias)
