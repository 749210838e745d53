"""Packaging: the wheel maps kernels/ and models/ into seq2seq_engine and ships the browser page's files, every
subpackage imports, the demo runs."""
import importlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SUBPACKAGES = ["kernels", "models", "core", "worker", "attention", "sampling", "entrypoints", "inputs", "engine",
               "audio", "transcription", "model_loader", "model_loader.ct2", "model_loader.gguf", "platforms",
               "tokenization"]
_NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis",
                                      ".pytest_cache")


def test_wheel_maps_kernels_and_models_into_the_package(tmp_path):
    # Build from a copy so the in-tree build/ and egg-info of pip do not touch the working tree.
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=_NOT_SOURCES)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(tmp_path / "wheels"), str(source)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (tmp_path / "wheels").glob("seq2seq_engine-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in ("seq2seq_engine/kernels/__init__.py", "seq2seq_engine/models/__init__.py",
                     "seq2seq_engine/core/scheduler.py", "seq2seq_engine/inputs/data.py",
                     "seq2seq_engine/model_loader/ct2/model_bin.py", "seq2seq_engine/model_loader/gguf/llama.py",
                     "seq2seq_engine/kernels/csrc/paged_attention_cpu.c",   # a native kernel's source
                     "seq2seq_engine/kernels/csrc/tile_activation.h"):      # and the header two of them include
        assert expected in names
    ui = Path("seq2seq_engine", "entrypoints", "openai", "ui")
    assert {"index.html", "app.js", "style.css"} <= {path.name for path in (REPO / ui).iterdir()}
    for path in (REPO / ui).iterdir():  # the page `seq2seq-engine serve` serves at /
        assert (ui / path.name).as_posix() in names
    top_level = {name.split("/", 1)[0] for name in names}
    assert "kernels" not in top_level and "models" not in top_level
    assert not {"tests", "examples", "docs", "benchmarks"} & top_level


@pytest.mark.parametrize("name", SUBPACKAGES)
def test_every_subpackage_imports_from_the_editable_install(name):
    module = importlib.import_module(f"seq2seq_engine.{name}")
    assert Path(module.__file__).resolve().is_relative_to(REPO)
    if name in ("kernels", "models"):
        assert Path(module.__file__).resolve() == REPO / name / "__init__.py"


def test_no_top_level_kernels_or_models_package_is_installed(tmp_path):
    # Run outside the repository, where only the installed package can be found.
    code = ("import importlib.util as u, seq2seq_engine.kernels, seq2seq_engine.models; "
            "print(u.find_spec('kernels'), u.find_spec('models'))")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "None None"


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_schedule_demo_runs_and_preempts(mode):
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "schedule_demo.py"), "--num-requests", "6", "--num-gpu-blocks", "16",
         "--block-size", "4", "--preemption-mode", mode, "--seed", "0"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = result.stdout.strip().splitlines()[-1]
    match = re.search(r"(\d+) preemptions \((\w+)\)", summary)
    assert match and int(match.group(1)) > 0 and match.group(2) == mode, summary
    assert "leaked blocks/tables 0" in summary and "unfinished 0" in summary
    assert "step   1 |" in result.stdout
