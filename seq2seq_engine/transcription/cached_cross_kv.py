"""A window's cross-attention K/V read back from the engine's encoder cache, for the word-timestamp alignment pass."""
from __future__ import annotations

from typing import Any, Optional

import torch

from seq2seq_engine.core.content_keys import encoder_content_key
from seq2seq_engine.transcription.alignment import CrossKV


def cached_cross_kv(engine: Any, features: torch.Tensor, dtype: torch.dtype) -> Optional[CrossKV]:
    """Per decoder layer (keys, values) [encoder length, d], in `dtype`, of the engine's computed cross table of
    `features` (the log-mel tensor a finished request carried as `input_features`: same values, dtype and shape,
    so the same content key); None when no computed entry is cached (evicted, or the encoder cache is off).

    Read between engine steps only: an idle entry's blocks are evictable, and the next step may reuse them."""
    cross_cache = engine.scheduler.block_manager.cross_cache
    if cross_cache is None:
        return None
    entry = cross_cache.find(encoder_content_key([], {"input_features": features}))
    if entry is None or not entry.computed:
        return None
    encoder_len = engine.model_config.max_encoder_len
    device_cache = engine.cache_engine.device_cache
    block_size = device_cache[0][0].shape[1]
    num_blocks = -(-encoder_len // block_size)
    if len(entry.table) < num_blocks:
        raise ValueError(f"cross entry {entry.key.hex()} has {len(entry.table)} blocks; an encoder output of "
                         f"{encoder_len} rows needs {num_blocks}")
    blocks = torch.tensor([block.block_number for block in entry.table[:num_blocks]], dtype=torch.long,
                          device=device_cache[0][0].device)
    return [tuple(cache[blocks].flatten(0, 1)[:encoder_len].flatten(1).to(dtype) for cache in layer_cache)
            for layer_cache in device_cache]
