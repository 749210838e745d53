"""The `--prefix TEXT` flag of the text commands: a task prefix put before every text prompt (T5 takes its task
this way, e.g. "summarize: " or "translate English to German: ")."""
from __future__ import annotations

import argparse
from typing import Any, List, Optional


def add_prefix_argument(group: Any) -> None:
    group.add_argument("--prefix", default=None, metavar="TEXT",
                       help="text put before every text prompt (T5 tasks: 'summarize: ', 'translate English to "
                            "German: ')")


def with_prefix(prompts: List[Any], args: argparse.Namespace) -> List[Any]:
    """The prompts with --prefix before each text: a plain string, a {"prompt": text} object, or the text of an
    explicit encoder prompt; token-id prompts are left as they are."""
    prefix: Optional[str] = getattr(args, "prefix", None)
    if not prefix:
        return prompts
    return [_prefixed(prompt, prefix) for prompt in prompts]


def _prefixed(prompt: Any, prefix: str) -> Any:
    if isinstance(prompt, str):
        return prefix + prompt
    if isinstance(prompt, dict) and isinstance(prompt.get("prompt"), str):
        return {**prompt, "prompt": prefix + prompt["prompt"]}
    if isinstance(prompt, dict) and "encoder_prompt" in prompt:
        return {**prompt, "encoder_prompt": _prefixed(prompt["encoder_prompt"], prefix)}
    return prompt
