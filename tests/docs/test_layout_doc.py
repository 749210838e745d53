"""docs/architecture.md's layout block names every source file of the package, and only files that exist."""
import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOPS = ("seq2seq_engine", "kernels", "models")
INDENT = 2


def _layout_block() -> list:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    match = re.search(r"^## 0\. Layout\n.*?```\n(.*?)```", text, flags=re.S | re.M)
    assert match, "docs/architecture.md has no '## 0. Layout' section with a code block"
    return match.group(1).splitlines()


def _listed_paths() -> set:
    """Paths named by the block: each line's first word, nested under the folders above it by indentation."""
    paths, stack = set(), []
    for line in _layout_block():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip(" "))) // INDENT
        name = line.split()[0]
        stack = stack[:depth] + [name.rstrip("/")]
        paths.add("/".join(stack) + ("/" if name.endswith("/") else ""))
    return paths


def _source_paths() -> set:
    paths = set()
    for top in TOPS:
        for folder, dirs, files in os.walk(REPO / top):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            rel = os.path.relpath(folder, REPO)
            paths.add(rel + "/")
            paths.update(f"{rel}/{name}" for name in files if name.endswith((".py", ".c", ".h")))
    return paths


def test_layout_block_matches_the_source_tree():
    listed, actual = _listed_paths(), _source_paths()
    assert not actual - listed, f"source files missing from docs/architecture.md's layout: {sorted(actual - listed)}"
    assert not listed - actual, f"layout names files that do not exist: {sorted(listed - actual)}"
