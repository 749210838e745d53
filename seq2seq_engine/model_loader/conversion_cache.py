"""Convert-once cache for foreign model formats: fingerprinted HF directories under cache_root(), written atomically.

    name = cache_entry_name(source, files, CONVERTER_VERSION, ...)   # changes when any of `files` changes
    hf_dir = convert_into_cache(name, lambda out_dir: convert(source, out_dir), cache_dir)

Used by seq2seq_engine.model_loader.ct2.whisper (CTranslate2 Whisper) and seq2seq_engine.model_loader.gguf.llama
(GGUF Llama). Cache root: $SEQ2SEQ_ENGINE_CACHE, else ~/.cache/seq2seq_engine (seq2seq_engine.cache_dir).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from typing import Any, Callable, Optional, Sequence

from seq2seq_engine.cache_dir import CacheDirError, cache_root, writable_cache_dir

# A cache entry is complete once this file is in it (it is written by every converter).
COMPLETE_MARKER = "config.json"

__all__ = ["cache_entry_name", "convert_into_cache"]


def cache_entry_name(source: str, files: Sequence[str], *settings: Any) -> str:
    """`<last two path parts of source>-<hash>`; the hash covers `settings` (converter version, dtype, ...), the
    absolute source path and the path, size and mtime of each of `files` that exists, so an updated model converts
    again."""
    absolute = os.path.abspath(source)
    fingerprint = [*settings, absolute]
    for path in files:
        if os.path.isfile(path):
            stat = os.stat(path)
            fingerprint.append([os.path.abspath(path), stat.st_size, stat.st_mtime_ns])
    digest = hashlib.sha256(json.dumps(fingerprint).encode()).hexdigest()[:16]
    label = "-".join(part for part in absolute.split(os.sep)[-2:] if part)
    return f"{re.sub(r'[^A-Za-z0-9_.]+', '_', label)}-{digest}"


def convert_into_cache(name: str, convert: Callable[[str], Any], cache_dir: Optional[str] = None) -> str:
    """The cache directory `name`, made by `convert(out_dir)` on first use.

    Concurrent callers are safe: each converts into its own temporary directory, which is renamed into place; a
    caller that loses the race keeps the winner's directory. A complete entry is used even from a read-only cache;
    converting into a cache directory that cannot be written is a CacheDirError.
    """
    root = cache_dir or cache_root()
    target = os.path.join(root, name)
    if os.path.isfile(os.path.join(target, COMPLETE_MARKER)):
        return target
    writable_cache_dir(root)   # a CacheDirError naming the directory, not an OSError from deep inside
    try:
        tmp = tempfile.mkdtemp(prefix=".converting-", dir=root)
    except OSError as error:
        raise CacheDirError.because(root, f"no directory can be made in it ({error.strerror or error})") from error
    try:
        convert(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        try:
            os.rename(tmp, target)
        except OSError:
            if not os.path.isfile(os.path.join(target, COMPLETE_MARKER)):
                raise
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def conversion_parser(module: str, what: str, ct2_dir_help: str) -> argparse.ArgumentParser:
    """The converters' common arguments: ct2_dir, out_dir and --dtype (the dtype names of seq2seq_engine.config)."""
    from seq2seq_engine.config import DTYPE_NAMES
    parser = argparse.ArgumentParser(prog=f"python -m {module}",
                                     description=f"Convert a CTranslate2 {what} directory to HF transformers.")
    parser.add_argument("ct2_dir", help=ct2_dir_help)
    parser.add_argument("out_dir", help="output HF directory (created)")
    parser.add_argument("--dtype", choices=sorted(DTYPE_NAMES), default="float32",
                        help="weight dtype (default float32)")
    return parser


def run_conversion_cli(convert: Callable[[], str]) -> int:
    """The converters' command-line tail: run `convert`, print the output directory (exit 0) or the error (exit 1)."""
    try:
        out = convert()
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0
