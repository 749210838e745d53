"""Content keys of the KV caches: a request's encoder input (token ids, or audio features) hashed to one key, and
the hash chain over a decoder sequence's full blocks that automatic prefix caching looks blocks up by."""
from __future__ import annotations

import hashlib
from typing import Any, Callable, List, Optional, Sequence

import numpy as np
import torch

_DIGEST_SIZE = 16


def _hasher_factory() -> Callable[[], Any]:
    """BLAKE3 (the `blake3` package, a dependency: about ten times BLAKE2b's speed on a window's features, 5 against
    0.55 GB/s measured), or hashlib's BLAKE2b where an install without dependencies lacks it. Keys live in one
    process only, so the two never meet."""
    try:
        from blake3 import blake3
    except ImportError:
        return lambda: hashlib.blake2b(digest_size=_DIGEST_SIZE)
    return blake3


_new_hasher = _hasher_factory()


def _digest(*parts: Any) -> bytes:
    """The key of the parts (bytes or contiguous arrays, hashed without a copy), each length-prefixed."""
    hasher = _new_hasher()
    for part in parts:
        hasher.update(memoryview(part).nbytes.to_bytes(8, "little"))
        hasher.update(part)
    return hasher.digest()[:_DIGEST_SIZE]


def _token_bytes(token_ids: Sequence[int]) -> bytes:
    return np.asarray(token_ids, dtype=np.int64).tobytes()


def _tensor_parts(tensor: Any) -> tuple:
    """(dtype and shape header, the values as a contiguous array)."""
    array = torch.as_tensor(tensor).detach().cpu().contiguous()
    header = f"{array.dtype}:{tuple(array.shape)}".encode()
    if array.dtype == torch.bfloat16:
        array = array.view(torch.int16)
    return header, array.numpy().reshape(-1).view(np.uint8)


def encoder_content_key(encoder_token_ids: Sequence[int], multi_modal_data: Optional[dict]) -> bytes:
    """The key of what the encoder reads: the audio features when the request carries them (a Whisper window),
    else the encoder token ids. One engine holds one model in one dtype, so they need not be part of the key."""
    features = (multi_modal_data or {}).get("input_features")
    if features is not None:
        return _digest(b"features", *_tensor_parts(features))
    return _digest(b"tokens", _token_bytes(encoder_token_ids))


def adapter_key(lora_cache_tag: int) -> bytes:
    """What the caches add to a key for a request's LoRA adapter, by the tag of its registration (nothing without
    one): an adapter changes the encoder output and every K/V, so content is equal only under the same adapter."""
    return _digest(b"lora", lora_cache_tag.to_bytes(8, "little")) if lora_cache_tag else b""


def request_encoder_key(seq_group: Any) -> bytes:
    """The encoder content key of a request (a SequenceGroup with an encoder) under its adapter, computed once and
    kept on it."""
    if seq_group.encoder_key is None:
        inputs = seq_group.inputs
        key = encoder_content_key(seq_group.encoder_seq.prompt_token_ids,
                                  inputs.multi_modal_data if inputs is not None else None)
        seq_group.encoder_key = key + adapter_key(seq_group.lora_cache_tag)
    return seq_group.encoder_key


def shares_prefix(params: Any) -> bool:
    """Whether a request's prompt may start from cached blocks: prompt logprobs and prompt-logit hooks need every
    prompt position computed."""
    return params is None or (getattr(params, "prompt_logprobs", None) is None
                              and not getattr(params, "prompt_logits_hooks", None))


def extend_block_hashes(hashes: List[bytes], token_ids: Sequence[int], block_size: int, num_blocks: int,
                        seed: bytes) -> List[bytes]:
    """`hashes` (the chain of the sequence's first blocks, computed earlier) extended in place to `num_blocks`
    full blocks of `token_ids`: block i's hash covers the seed (the encoder key, or nothing), block i-1's hash and
    its own tokens, so equal hashes mean equal prefixes."""
    for index in range(len(hashes), num_blocks):
        parent = hashes[index - 1] if index else _digest(b"root", seed)
        hashes.append(_digest(parent, _token_bytes(token_ids[index * block_size:(index + 1) * block_size])))
    return hashes
