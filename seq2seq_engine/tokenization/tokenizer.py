"""Tokenizer loading: the transformers tokenizer saved in a local model directory (never downloaded)."""
from __future__ import annotations

import os
from typing import Any, Optional


def get_tokenizer(model_dir: str, tokenizer_mode: str = "auto", trust_remote_code: bool = False,
                  revision: Optional[str] = None, **kwargs: Any):
    """Load the transformers tokenizer saved in the local directory `model_dir` (never downloads).

    tokenizer_mode: "auto" (fast when available) or "slow".
    """
    if tokenizer_mode not in ("auto", "slow"):
        raise ValueError(f"tokenizer_mode must be 'auto' or 'slow', got {tokenizer_mode!r}")
    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"tokenizer directory {model_dir!r} does not exist")
    from transformers import AutoTokenizer

    if tokenizer_mode == "slow":
        kwargs["use_fast"] = False
    try:
        return AutoTokenizer.from_pretrained(model_dir, local_files_only=True, trust_remote_code=trust_remote_code,
                                             revision=revision, **kwargs)
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"could not load a tokenizer from {model_dir!r}: {exc}") from exc
