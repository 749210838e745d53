"""An unusable cache root is a CacheDirError naming it and SEQ2SEQ_ENGINE_CACHE; `transcribe` then exits 2."""
import os
import pickle
import subprocess
import sys
import wave

import pytest
from conftest import require_model

from seq2seq_engine.cache_dir import CACHE_ENV, CacheDirError
from seq2seq_engine.model_loader.conversion_cache import convert_into_cache


def _regular_file(tmp_path):
    path = tmp_path / "a-file"
    path.write_text("not a directory\n")
    return str(path)


UNUSABLE_ROOTS = {
    "a regular file": _regular_file,
    "a path under a regular file": lambda tmp_path: os.path.join(_regular_file(tmp_path), "cache"),
}


def _write_config(out_dir):
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as handle:
        handle.write("{}\n")


@pytest.mark.parametrize("kind", sorted(UNUSABLE_ROOTS))
def test_converting_into_an_unusable_root_is_a_cache_dir_error(tmp_path, kind):
    root = UNUSABLE_ROOTS[kind](tmp_path)
    with pytest.raises(CacheDirError) as caught:
        convert_into_cache("entry", _write_config, root)
    assert caught.value.path == root and repr(root) in str(caught.value) and CACHE_ENV in str(caught.value)
    assert isinstance(caught.value, OSError) and isinstance(caught.value, ValueError)
    copy = pickle.loads(pickle.dumps(caught.value))   # as a Ray replica's error travels
    assert type(copy) is CacheDirError and copy.path == root and str(copy) == str(caught.value)


def test_a_complete_entry_is_used_from_a_cache_that_cannot_be_written(tmp_path):
    root = tmp_path / "cache"
    entry = convert_into_cache("entry", _write_config, str(root))
    os.chmod(root, 0o555)
    try:
        assert convert_into_cache("entry", _fail_if_called, str(root)) == entry
    finally:
        os.chmod(root, 0o755)


def _fail_if_called(out_dir):
    raise AssertionError("a complete cache entry was converted again")


def _silent_wav(path):
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(16000)
        handle.writeframes(bytes(2 * 8000))
    return str(path)


def _transcribe_with_cache_root(tmp_path, root):
    require_model("whisper-tiny.en", convert=False)   # skips only when the model's package is not installed
    command = [os.path.join(os.path.dirname(sys.executable), "seq2seq-engine"), "transcribe",
               _silent_wav(tmp_path / "silence.wav"), "--model", "whisper-tiny.en", "--max-new-tokens", "8"]
    env = dict(os.environ, OMP_NUM_THREADS="1", **{CACHE_ENV: root})
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)


def _assert_model_error_naming(result, root):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert f"cannot use the cache directory {root!r}" in result.stderr and CACHE_ENV in result.stderr


@pytest.mark.parametrize("kind", sorted(UNUSABLE_ROOTS))
def test_transcribe_reports_an_unusable_cache_root_as_a_model_error(tmp_path, kind):
    root = UNUSABLE_ROOTS[kind](tmp_path)
    _assert_model_error_naming(_transcribe_with_cache_root(tmp_path, root), root)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root may write a 0o555 directory; the regular-file roots above fail for root too")
def test_transcribe_reports_an_empty_read_only_cache_root_as_a_model_error(tmp_path):
    root = tmp_path / "read-only"
    root.mkdir(mode=0o555)
    try:
        _assert_model_error_naming(_transcribe_with_cache_root(tmp_path, str(root)), str(root))
    finally:
        os.chmod(root, 0o755)
