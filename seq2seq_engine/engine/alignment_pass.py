"""The engine's alignment pass: finished Whisper windows teacher-forced through its model, over its cached cross K/V."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch

from seq2seq_engine.core.content_keys import adapter_key, encoder_content_key
from seq2seq_engine.core.cross_cache import CrossCache
from seq2seq_engine.engine_port import AlignmentRequest, AlignmentResult
from seq2seq_engine.lora.layers import lora_rows
from seq2seq_engine.lora.manager import LoRAManager
from seq2seq_engine.lora.step_rows import uniform_rows
from seq2seq_engine.models.whisper_alignment import CrossKV, aligned_decode, alignment_heads, encoder_cross_kv

# Windows run in one pass at most: each holds its cross K/V of every layer gathered from the cache (about 36 MB
# for whisper-base in float32, 150 MB for large-v3), on top of the pass's activations.
MAX_WINDOWS_PER_PASS = 8


def cached_cross_kv(cross_cache: Optional[CrossCache], device_cache: Sequence[Tuple[torch.Tensor, torch.Tensor]],
                    features: torch.Tensor, encoder_len: int, dtype: torch.dtype,
                    lora_cache_tag: int = 0) -> Optional[CrossKV]:
    """Per decoder layer (keys, values) [encoder_len, d], in `dtype`, of the computed cross table of `features`
    (the log-mel tensor a finished request carried as `input_features`: same values, dtype and shape, so the same
    content key) under the adapter of `lora_cache_tag` (0: none); None when no computed entry is cached (evicted, or the
    encoder cache is off). Read between engine steps only: an idle entry's blocks are evictable, and the next step
    may reuse them."""
    if cross_cache is None:
        return None
    entry = cross_cache.find(encoder_content_key([], {"input_features": features}) + adapter_key(lora_cache_tag))
    if entry is None or not entry.computed:
        return None
    block_size = device_cache[0][0].shape[1]
    num_blocks = -(-encoder_len // block_size)
    if len(entry.table) < num_blocks:
        raise ValueError(f"cross entry {entry.key.hex()} has {len(entry.table)} blocks; an encoder output of "
                         f"{encoder_len} rows needs {num_blocks}")
    blocks = torch.tensor([block.block_number for block in entry.table[:num_blocks]], dtype=torch.long,
                          device=device_cache[0][0].device)
    return [tuple(cache[blocks].flatten(0, 1)[:encoder_len].flatten(1).to(dtype) for cache in layer_cache)
            for layer_cache in device_cache]


class AlignmentPass:
    """Runs AlignmentRequests on the engine's model: each window's cross K/V from the encoder cache (else its
    encoder runs again, through the model's layers), the windows' tokens through the decoder together, the LM head
    over the scored rows only."""

    def __init__(self, model: torch.nn.Module, hf_config: Any, generation_config: Any, encoder_len: int,
                 lora_manager: Optional[LoRAManager] = None) -> None:
        if not hasattr(model, "model") or not hasattr(model.model, "encoder") or not hasattr(hf_config,
                                                                                             "num_mel_bins"):
            raise ValueError(f"the alignment pass needs a Whisper model; {type(model).__name__} has no audio encoder")
        self.model, self.lora_manager = model, lora_manager
        self.heads = alignment_heads(hf_config, generation_config)
        self.encoder_len = encoder_len

    def run(self, requests: Sequence[AlignmentRequest], cross_cache: Optional[CrossCache],
            device_cache: Sequence[Tuple[torch.Tensor, torch.Tensor]]) -> List[AlignmentResult]:
        for index, request in enumerate(requests):
            self._check(index, request)
            if request.lora_int_id and self.lora_manager is None:
                raise ValueError(f"alignment request {index}: lora_int_id {request.lora_int_id} needs an engine "
                                 f"built with enable_lora=True")
        results: List[Optional[AlignmentResult]] = [None] * len(requests)
        for lora_int_id in sorted({request.lora_int_id for request in requests}):
            # one pass per adapter, every row of it on that adapter's slot
            indices = [i for i, request in enumerate(requests) if request.lora_int_id == lora_int_id]
            slots = self.lora_manager.activate([lora_int_id]) if lora_int_id else {}
            with lora_rows(uniform_rows(slots[lora_int_id]) if lora_int_id else {}):
                for start in range(0, len(indices), MAX_WINDOWS_PER_PASS):
                    batch = indices[start:start + MAX_WINDOWS_PER_PASS]
                    for index, result in zip(batch, self._run_batch([requests[i] for i in batch], cross_cache,
                                                                    device_cache)):
                        results[index] = result
        return results

    def _check(self, index: int, request: AlignmentRequest) -> None:
        """ValueError naming the request and field that the pass cannot run."""
        length, first, count = len(request.token_ids), request.first_scored_row, request.num_scored
        limit = self.model.config.max_target_positions
        if not 0 < length <= limit:
            raise ValueError(f"alignment request {index}: token_ids has {length} tokens; 1 to {limit} fit the decoder")
        if first < 0 or count < 0 or first + count >= length:
            raise ValueError(f"alignment request {index}: rows {first} .. {first + count - 1} (first_scored_row, "
                             f"num_scored) must each have a next token among the {length} token_ids")
        targets = [int(t) for t in request.token_ids[first + 1:first + 1 + count]]
        if any(not 0 <= t < request.vocab_limit for t in targets):
            raise ValueError(f"alignment request {index}: a scored token is not below vocab_limit "
                             f"{request.vocab_limit}: {[t for t in targets if not 0 <= t < request.vocab_limit][:3]}")

    @torch.inference_mode()
    def _run_batch(self, requests: Sequence[AlignmentRequest], cross_cache: Optional[CrossCache],
                   device_cache: Sequence[Tuple[torch.Tensor, torch.Tensor]]) -> List[AlignmentResult]:
        dtype = self.model.model.decoder.embed_tokens.weight.dtype
        cross_kvs, cached = [], []
        for request in requests:
            tag = self.lora_manager.cache_tag(request.lora_int_id) if request.lora_int_id else 0
            cross_kv = cached_cross_kv(cross_cache, device_cache, request.features, self.encoder_len, dtype, tag)
            cached.append(cross_kv is not None)
            cross_kvs.append(cross_kv if cross_kv is not None else encoder_cross_kv(self.model, request.features))
        hidden, scores = aligned_decode(self.model, [list(r.token_ids) for r in requests], cross_kvs, self.heads)
        probs = self._token_probs(requests, hidden)
        return [AlignmentResult(window_scores, window_probs, was_cached)
                for window_scores, window_probs, was_cached in zip(scores, probs, cached)]

    def _token_probs(self, requests: Sequence[AlignmentRequest], hidden: torch.Tensor) -> List[torch.Tensor]:
        """Each request's scored rows: the probability of the token after the row, softmax over the ids below
        the request's vocab_limit (the LM head runs over these rows only: it is most of the pass)."""
        rows, targets, offset = [], [], 0
        for request in requests:
            first = request.first_scored_row
            rows.extend(range(offset + first, offset + first + request.num_scored))
            targets.extend(int(t) for t in request.token_ids[first + 1:first + 1 + request.num_scored])
            offset += len(request.token_ids)
        index = torch.tensor(rows, dtype=torch.long, device=hidden.device)
        logits = self.model.compute_logits(hidden.index_select(0, index))
        probs, start = [], 0
        for request in requests:
            window = logits[start:start + request.num_scored, :request.vocab_limit].softmax(dim=-1)
            window_targets = torch.tensor(targets[start:start + request.num_scored], device=window.device)
            probs.append(window[torch.arange(request.num_scored, device=window.device), window_targets].cpu())
            start += request.num_scored
        return probs
