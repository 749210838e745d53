"""The CUDA attention backend: prefill by xformers or torch SDPA and paged decode by the Triton kernel or the torch
path, as the CUDA platform chose once; T5's decode bias computed inside the Triton kernel from its table."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from seq2seq_engine.attention.backends.relative_bias import bucketed_table, decode_query_positions
from seq2seq_engine.attention.backends.torch_backend import (KVCache, PositionBias, TorchAttentionBackend,
                                                             _paged_decode, varlen_attention)
from seq2seq_engine.attention.metadata import AttentionMetadata
from seq2seq_engine.platforms.cuda import PAGED_TORCH, PAGED_TRITON, PREFILL_SDPA, PREFILL_XFORMERS

Decode = Tuple[torch.Tensor, torch.Tensor, int]


class CudaAttentionBackend(TorchAttentionBackend):
    """The torch backend's attention types and cache writes, with the CUDA kernels the platform chose: `prefill`
    "xformers" or "sdpa" (a biased prefill, T5's, always takes SDPA with the float mask); `paged_kernels` "triton"
    or "torch" (decode rows, with T5's bias computed in the kernel where bucketed_table recognises it)."""

    name = "cuda"

    def __init__(self, prefill: str = PREFILL_SDPA, paged_kernels: str = PAGED_TORCH) -> None:
        if prefill not in (PREFILL_XFORMERS, PREFILL_SDPA):
            raise ValueError(f"prefill must be {PREFILL_XFORMERS!r} or {PREFILL_SDPA!r}, got {prefill!r}")
        if paged_kernels not in (PAGED_TRITON, PAGED_TORCH):
            raise ValueError(f"paged_kernels must be {PAGED_TRITON!r} or {PAGED_TORCH!r}, got {paged_kernels!r}")
        self.prefill = prefill
        self.paged_kernels = paged_kernels
        # (the forward pass's bucket object, context lengths, query positions): see _query_positions
        self._positions: Optional[Tuple[object, torch.Tensor, torch.Tensor]] = None

    def prefill_attention(self, query, key, value, bias, scale, position_bias=None):
        if position_bias is None and self.prefill == PREFILL_XFORMERS:
            from seq2seq_engine.attention.backends.xformers_backend import xformers_prefill
            out = xformers_prefill(query, key, value, bias, scale)
            if out is not None:
                return out
        return varlen_attention(query, key, value, bias, scale, position_bias)

    def _prefill_and_decode(self, query, prefill_key, prefill_value, prefill_bias, kv_cache: KVCache,
                            decode: Decode, metadata: AttentionMetadata, scale: float,
                            position_bias: Optional[PositionBias] = None) -> torch.Tensor:
        num_prefill_tokens = metadata.num_prefill_tokens
        if not metadata.num_prefills:
            return self.paged_decode(query, kv_cache, decode, scale, position_bias)
        output = torch.empty_like(query)
        output[:num_prefill_tokens] = self.prefill_attention(
            query[:num_prefill_tokens], prefill_key, prefill_value, prefill_bias, scale, position_bias)
        if metadata.num_decode_tokens:
            rows = output[num_prefill_tokens:]
            out = self.paged_decode(query[num_prefill_tokens:], kv_cache, decode, scale, position_bias, out=rows)
            if out.data_ptr() != rows.data_ptr():
                rows.copy_(out)
        return output

    def paged_decode(self, query: torch.Tensor, kv_cache: KVCache, decode: Decode, scale: float,
                     position_bias: Optional[PositionBias] = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Decode rows over the paged cache: the Triton kernel (T5's bias as a RelativeBias computed in it) where the
        platform chose it, else the torch path (with the bias as a tensor). Returns `out` when the kernel wrote it."""
        kernels = self._triton() if self.paged_kernels == PAGED_TRITON else None
        if kernels is None:
            return _paged_decode(query, kv_cache, decode, scale, position_bias)
        paged_decode_attention, relative_bias_class = kernels
        block_tables, context_lens, _ = decode
        relative = None
        if position_bias is not None:
            table = bucketed_table(position_bias)
            if table is None:  # not T5's bucketed table: the bias tensor through the torch path
                return _paged_decode(query, kv_cache, decode, scale, position_bias)
            positions = self._query_positions(position_bias.buckets, context_lens)
            relative = relative_bias_class(table.table, positions, table.num_buckets, table.max_distance,
                                           table.bidirectional)
        return paged_decode_attention(query, kv_cache[0], kv_cache[1], block_tables, context_lens, scale,
                                      relative_bias=relative, out=out)

    @staticmethod
    def _triton():
        from seq2seq_engine.kernels.decode_attention import load_triton_decode
        return load_triton_decode()

    def _query_positions(self, step_buckets: object, context_lens: torch.Tensor) -> torch.Tensor:
        """Query positions of the decode rows, computed once per forward pass (whose StepRelativeBuckets every layer
        shares) and lengths tensor: never reused from an earlier pass, so a captured CUDA graph records the
        computation instead of reading a tensor an eager pass left behind."""
        last = self._positions
        if last is None or last[0] is not step_buckets or last[1] is not context_lens:
            last = self._positions = (step_buckets, context_lens, decode_query_positions(context_lens))
        return last[2]
