"""The engine's cache directory (converted models, built native kernels): $SEQ2SEQ_ENGINE_CACHE, else ~/.cache."""
from __future__ import annotations

import os

from seq2seq_engine.platforms.overrides import override_value

CACHE_ENV = "SEQ2SEQ_ENGINE_CACHE"

__all__ = ["CACHE_ENV", "CacheDirError", "cache_root", "writable_cache_dir"]


class CacheDirError(OSError, ValueError):
    """A cache directory that cannot be created or written. An OSError, so callers that treat the cache as optional
    (prepared weights) go on without it; a ValueError, so the commands report it as a model error (exit 2) where a
    model cannot be made without the cache (a conversion)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path

    def __reduce__(self):   # pickled whole (a Ray replica's error reaches the driver so)
        return type(self), (self.path, str(self))

    @classmethod
    def because(cls, path: str, reason: str) -> "CacheDirError":
        """The error for `path`, naming it, why it cannot be used and where the cache root comes from."""
        setting = override_value(CACHE_ENV)
        source = f"{CACHE_ENV}={setting!r}" if setting else f"{CACHE_ENV} is unset, so {cache_root()!r}"
        return cls(path, f"cannot use the cache directory {path!r}: {reason} (the cache root: {source}); set "
                         f"{CACHE_ENV} to a writable directory")


def cache_root() -> str:
    """$SEQ2SEQ_ENGINE_CACHE, else ~/.cache/seq2seq_engine."""
    return override_value(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "seq2seq_engine")


def writable_cache_dir(path: str) -> str:
    """`path`, created if missing; a CacheDirError naming it when it is not a directory this process may write."""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError as error:
        raise CacheDirError.because(path, "it exists and is not a directory") from error
    except NotADirectoryError as error:
        raise CacheDirError.because(path, "a part of its path is a file, not a directory") from error
    except OSError as error:   # no permission to create it, a read-only file system
        raise CacheDirError.because(path, f"it cannot be created ({error.strerror or error})") from error
    if not os.access(path, os.W_OK | os.X_OK):
        raise CacheDirError.because(path, "the directory is not writable")
    return path
