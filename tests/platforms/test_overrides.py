"""Every SEQ2SEQ_ENGINE_* variable is registered in seq2seq_engine/platforms/overrides.py and listed in
docs/platforms.md."""
import os
import re

import pytest

from seq2seq_engine.platforms.overrides import OVERRIDES, env_switch, override_value, overrides_markdown

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE_DIRS = ("seq2seq_engine", "kernels", "models", "scripts", "benchmarks", "examples")


def _names_in_sources():
    names = set()
    for folder in SOURCE_DIRS:
        for directory, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                if name.endswith((".py", ".c", ".h", ".sh")):
                    with open(os.path.join(directory, name), encoding="utf-8") as handle:
                        names.update(re.findall(r"SEQ2SEQ_ENGINE_[A-Z0-9_]*[A-Z0-9]", handle.read()))
    return names


def test_every_variable_the_code_names_is_registered():
    found = _names_in_sources()
    assert "SEQ2SEQ_ENGINE_CPU_ISA" in found and "SEQ2SEQ_ENGINE_PACKED_LINEAR" in found
    assert found <= {override.name for override in OVERRIDES}


def test_the_docs_list_the_same_table():
    with open(os.path.join(ROOT, "docs", "platforms.md"), encoding="utf-8") as handle:
        assert overrides_markdown() in handle.read()


def test_switches_and_unregistered_names(monkeypatch):
    monkeypatch.delenv("SEQ2SEQ_ENGINE_STARTUP_GC", raising=False)
    assert env_switch("SEQ2SEQ_ENGINE_STARTUP_GC")
    for value, on in (("0", False), (" Off ", False), ("no", False), ("1", True), ("yes", True)):
        monkeypatch.setenv("SEQ2SEQ_ENGINE_STARTUP_GC", value)
        assert env_switch("SEQ2SEQ_ENGINE_STARTUP_GC") is on
    with pytest.raises(KeyError, match="SEQ2SEQ_ENGINE_TYPO is not a registered override"):
        override_value("SEQ2SEQ_ENGINE_TYPO")
