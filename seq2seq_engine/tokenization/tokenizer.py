"""Tokenizer loading: the tokenizer saved in a local model directory (never downloaded): transformers', or for a
Whisper directory the package's own on the `tokenizers` library (whisper_tokenizer.py: no transformers import)."""
from __future__ import annotations

import os
from typing import Any, Optional

from seq2seq_engine.tokenization.whisper_tokenizer import load_whisper_tokenizer


def get_tokenizer(model_dir: str, tokenizer_mode: str = "auto", trust_remote_code: bool = False,
                  revision: Optional[str] = None, **kwargs: Any):
    """Load the tokenizer saved in the local directory `model_dir` (never downloads).

    tokenizer_mode: "auto" (fast when available) or "slow". A Whisper directory in "auto" mode gets
    WhisperJsonTokenizer when its files allow (transformers' tokenizer otherwise).
    """
    if tokenizer_mode not in ("auto", "slow"):
        raise ValueError(f"tokenizer_mode must be 'auto' or 'slow', got {tokenizer_mode!r}")
    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"tokenizer directory {model_dir!r} does not exist")
    if tokenizer_mode == "auto" and not (kwargs or trust_remote_code or revision):
        whisper = load_whisper_tokenizer(model_dir)
        if whisper is not None:
            return whisper
    from transformers import AutoTokenizer

    if tokenizer_mode == "slow":
        kwargs["use_fast"] = False
    try:
        return AutoTokenizer.from_pretrained(model_dir, local_files_only=True, trust_remote_code=trust_remote_code,
                                             revision=revision, **kwargs)
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"could not load a tokenizer from {model_dir!r}: {exc}") from exc
