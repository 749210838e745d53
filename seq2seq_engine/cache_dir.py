"""The engine's cache directory (converted models, built native kernels): $SEQ2SEQ_ENGINE_CACHE, else ~/.cache."""
from __future__ import annotations

import os

from seq2seq_engine.platforms.overrides import override_value

CACHE_ENV = "SEQ2SEQ_ENGINE_CACHE"

__all__ = ["CACHE_ENV", "cache_root"]


def cache_root() -> str:
    """$SEQ2SEQ_ENGINE_CACHE, else ~/.cache/seq2seq_engine."""
    return override_value(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "seq2seq_engine")
