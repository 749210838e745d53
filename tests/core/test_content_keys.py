"""The encoder cache's content keys: equal inputs give equal keys, and any change of a feature value, the dtype, the
shape or the token ids gives another; BLAKE3 where the package is installed (a dependency), hashlib's BLAKE2b
otherwise, with the same properties."""
import sys

import torch

from seq2seq_engine.core import content_keys
from seq2seq_engine.core.content_keys import encoder_content_key, extend_block_hashes


def _keys_behave():
    features = torch.randn(80, 3000, generator=torch.Generator().manual_seed(0))
    key = encoder_content_key([1, 2], {"input_features": features})
    assert len(key) == 16 and key == encoder_content_key([7], {"input_features": features.clone()})
    changed = features.clone()
    changed[79, 2999] += 1e-3
    others = [encoder_content_key([1, 2], {"input_features": changed}),
              encoder_content_key([1, 2], {"input_features": features.to(torch.bfloat16)}),
              encoder_content_key([1, 2], {"input_features": features.reshape(160, 1500)}),
              encoder_content_key([1, 2], {"input_features": features.t()}),   # non-contiguous: other values in order
              encoder_content_key([1, 2], None), encoder_content_key([1, 3], None),
              encoder_content_key([1, 2, 0], None)]
    assert len({key, *others}) == 1 + len(others)
    assert encoder_content_key([1, 2], None) == encoder_content_key([1, 2], {})
    chain = extend_block_hashes([], list(range(40)), 16, 2, key)
    assert chain == extend_block_hashes(chain[:1], list(range(40)), 16, 2, key) and len(set(chain)) == 2
    assert extend_block_hashes([], list(range(40)), 16, 2, b"") != chain


def test_blake3_keys():
    from blake3 import blake3
    assert content_keys._new_hasher is blake3
    _keys_behave()


def test_blake2b_keys_where_blake3_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "blake3", None)   # what an install without dependencies may lack
    fallback = content_keys._hasher_factory()
    assert fallback().name == "blake2b"
    monkeypatch.setattr(content_keys, "_new_hasher", fallback)
    _keys_behave()
