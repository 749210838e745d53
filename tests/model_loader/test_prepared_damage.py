"""A prepared-weights file damaged in place is caught by its checksum and prepared again; a FIFO is never opened."""
import json
import os
import stat
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch
from hf_reference import build_tiny_model
from safetensors import safe_open
from test_prepared_weights import _prepared_files, _refuse_preparing, _same_model

from seq2seq_engine.model_loader.loader import load_model
from seq2seq_engine.model_loader.prepared_cache import PAD_PREFIX, PreparedWeights

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DAMAGES = {
    "zeros": lambda count: bytes(count),
    "random": lambda count: np.random.default_rng(0).integers(0, 256, count, dtype=np.uint8).tobytes(),
    "nan": lambda count: np.full(count // 4, np.nan, dtype=np.float32).tobytes(),
}


def _largest_tensor_span(path):
    """(file offset, byte count) of the file's largest tensor (padding entries aside)."""
    with open(path, "rb") as handle:
        header_size = struct.unpack("<Q", handle.read(8))[0]
        header = json.loads(handle.read(header_size))
    entries = [entry for name, entry in header.items() if name != "__metadata__" and not name.startswith(PAD_PREFIX)]
    start, end = max((entry["data_offsets"] for entry in entries), key=lambda span: span[1] - span[0])
    return 8 + header_size + start, end - start


def _overwrite_in_place(path, offset, data):
    """Write `data` at `offset` of the file itself (not a new file), then put its mtime back."""
    before = os.stat(path)
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_file_damaged_in_place_is_prepared_again_not_used(tmp_path, monkeypatch, caplog, damage):
    model_dir, _ = build_tiny_model("bart", tmp_path)
    cache_dir = str(tmp_path / "cache")
    reference, _ = load_model(model_dir)
    load_model(model_dir, prepared=True, cache_dir=cache_dir)
    path = os.path.join(cache_dir, "prepared", _prepared_files(cache_dir)[0])
    offset, count = _largest_tensor_span(path)
    _overwrite_in_place(path, offset, DAMAGES[damage](count))

    model, _ = load_model(model_dir, prepared=True, cache_dir=cache_dir)
    assert f"prepared weights {path} are damaged" in caplog.text
    _same_model(model, reference)
    caplog.clear()
    _refuse_preparing(monkeypatch)   # the file written again is whole: the next load maps it
    again, _ = load_model(model_dir, prepared=True, cache_dir=cache_dir)
    assert "damaged" not in caplog.text
    _same_model(again, reference)


def test_a_file_whose_metadata_was_altered_is_prepared_again(tmp_path, caplog):
    model_dir, _ = build_tiny_model("bart", tmp_path)
    cache_dir = str(tmp_path / "cache")
    load_model(model_dir, prepared=True, cache_dir=cache_dir)
    path = os.path.join(cache_dir, "prepared", _prepared_files(cache_dir)[0])
    with open(path, "rb") as handle:
        head = handle.read(8)
        head += handle.read(struct.unpack("<Q", head)[0])
    position = head.index(b'\\"training\\": false')   # a scalar attribute in the layout, same length altered
    _overwrite_in_place(path, position, b'\\"training\\": true ')
    model, _ = load_model(model_dir, prepared=True, cache_dir=cache_dir)
    assert f"prepared weights {path} are damaged" in caplog.text
    _same_model(model, load_model(model_dir)[0])


def _load_in_a_child(model_dir, cache_dir, timeout):
    script = ("import sys; from seq2seq_engine.model_loader.loader import load_model; "
              "load_model(sys.argv[1], prepared=True, cache_dir=sys.argv[2])")
    try:
        return subprocess.run([sys.executable, "-c", script, model_dir, cache_dir], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"loading with a FIFO in {cache_dir}/prepared did not end within {timeout} s: a FIFO was opened")


def test_a_fifo_in_the_cache_is_never_opened(tmp_path, monkeypatch):
    model_dir, _ = build_tiny_model("bart", tmp_path)
    cache_dir = str(tmp_path / "cache")
    slot = PreparedWeights(model_dir, [os.path.join(model_dir, "model.safetensors")], torch.float32, None, None,
                           cache_dir).path
    os.makedirs(os.path.dirname(slot))
    stray = os.path.join(os.path.dirname(slot), "stray.safetensors")
    os.mkfifo(stray)
    os.mkfifo(slot)
    # A child process: a thread blocked in open() inside safetensors may hold the GIL, and could not be timed out.
    result = _load_in_a_child(model_dir, cache_dir, timeout=300)
    assert result.returncode == 0, result.stderr
    assert stat.S_ISFIFO(os.stat(stray).st_mode)          # not the cache's: left alone
    assert stat.S_ISREG(os.stat(slot).st_mode)            # the slot's own name: replaced by the prepared file
    with safe_open(slot, framework="pt") as handle:
        assert handle.metadata()["model_dir"] == os.path.abspath(model_dir)
    reference, _ = load_model(model_dir)
    _refuse_preparing(monkeypatch)
    _same_model(load_model(model_dir, prepared=True, cache_dir=cache_dir)[0], reference)
