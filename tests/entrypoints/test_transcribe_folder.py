"""`seq2seq-engine transcribe DIR`: audio files found by extension (entrypoints/audio_files.py), output names mirroring
the folder, atomic and resumable outputs (entrypoints/transcribe_outputs.py), and the real console command run on a
temporary folder of generated files (nested folders, a broken file): outputs written, the failure reported with exit
status 1, existing outputs skipped on a second run and redone with --overwrite."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from av_media import encode, speech_clip

from seq2seq_engine.entrypoints.audio_files import AudioJob, expand_inputs, find_audio_files, output_path
from seq2seq_engine.entrypoints.transcribe_outputs import is_done, pending_jobs, write_atomic
from seq2seq_engine.transcription.output.results import TranscriptionResult, render


def _touch(folder, *names):
    for name in names:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")


def test_folders_expand_by_extension_and_mirror_their_paths(tmp_path):
    _touch(tmp_path, "top.WAV", "a/x.mp3", "b/x.mp3", "c/y.mp3", "c/y.wav", "notes.txt", ".hidden.mp3",
           "a/._x.mp3", ".cache/z.mp3", "d/e/deep.opus")
    top = find_audio_files(str(tmp_path), recursive=False)
    assert [os.path.relpath(p, tmp_path) for p in top] == ["top.WAV"]
    jobs = expand_inputs([str(tmp_path)], recursive=True)
    assert [(os.path.relpath(j.source, tmp_path), j.output_name) for j in jobs] == [
        ("a/x.mp3", "a/x"), ("b/x.mp3", "b/x"), ("c/y.mp3", "c/y.mp3"), ("c/y.wav", "c/y.wav"),
        ("d/e/deep.opus", "d/e/deep"), ("top.WAV", "top")]
    # files given by name: their stem, a clash gets -2; a folder and a file may be mixed
    jobs = expand_inputs([str(tmp_path / "a/x.mp3"), str(tmp_path / "b"), "missing.m4a"])
    assert [j.output_name for j in jobs] == ["x", "x-2", "missing"]
    assert output_path("out", AudioJob("DIR/a/x.mp3", "a/x"), "srt") == os.path.join("out", "a/x.srt")


def test_outputs_are_written_atomically_and_runs_resume(tmp_path):
    path = str(tmp_path / "deep" / "a.txt")
    write_atomic(path, "first\n")
    write_atomic(path, "second\n")
    assert open(path, encoding="utf-8").read() == "second\n"
    assert os.listdir(tmp_path / "deep") == ["a.txt"]  # no temporary file left behind
    ok = TranscriptionResult("Hi.", "en", [], None, 1.0)
    failed = TranscriptionResult("", None, [], "b.wav: file not found", 0.0)
    jobs = [AudioJob("a.wav", "a"), AudioJob("b.wav", "b"), AudioJob("c.wav", "c"), AudioJob("d.wav", "d")]
    write_atomic(output_path(str(tmp_path), jobs[0], "json"), render(ok, "json"))
    write_atomic(output_path(str(tmp_path), jobs[1], "json"), render(failed, "json"))
    write_atomic(output_path(str(tmp_path), jobs[2], "json"), "{truncated")
    assert [is_done(output_path(str(tmp_path), j, "json"), "json") for j in jobs] == [True, False, False, False]
    pending, skipped = pending_jobs(jobs, str(tmp_path), "json", overwrite=False)
    assert [j.source for j in pending] == ["b.wav", "c.wav", "d.wav"] and skipped == 1  # failures are retried
    assert pending_jobs(jobs, str(tmp_path), "json", overwrite=True) == (jobs, 0)


# ---------------------------------------------------------------------------------------------- the real command
@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """in/clip.wav, in/a/x.mp3, in/b/x.m4a (same stem, other folder), in/b/c/counting.ogg, in/broken.mp3 (text),
    in/notes.txt (not audio); expected transcript words per output."""
    pytest.importorskip("av")
    root = tmp_path_factory.mktemp("folder") / "in"
    fox_path, fox, _ = speech_clip("quick_brown_fox")
    _, hello, _ = speech_clip("hello_world")
    _, counting, _ = speech_clip("counting")
    (root / "a").mkdir(parents=True)
    (root / "b" / "c").mkdir(parents=True)
    (root / "clip.wav").write_bytes(open(fox_path, "rb").read())
    encode(root / "a" / "x.mp3", hello, 16000, "mp3")
    encode(root / "b" / "x.m4a", np.concatenate([fox, np.zeros(8000, np.float32)]), 16000, "m4a")
    encode(root / "b" / "c" / "counting.ogg", counting, 16000, "ogg")
    (root / "broken.mp3").write_text("this is not an mp3\n" * 20)
    (root / "notes.txt").write_text("not audio\n")
    return root, {"clip.txt": "lazy dog", "a/x.txt": "hello", "b/x.txt": "lazy dog", "b/c/counting.txt": "seven"}


def _run(*args):
    command = [os.path.join(os.path.dirname(sys.executable), "seq2seq-engine"), "transcribe", *args,
               "--max-new-tokens", "32", "--kv-cache-space-gb", "0.2", "--swap-space-gb", "0.01"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)


def _outputs(out):
    return sorted(os.path.relpath(os.path.join(d, f), out) for d, _, files in os.walk(out) for f in files)


def test_the_command_transcribes_a_folder_reports_failures_and_resumes(folder, tmp_path):
    root, expected = folder
    out = str(tmp_path / "out")
    first = _run(str(root), "--recursive", "--output-dir", out)
    assert first.returncode == 1, first.stderr
    assert _outputs(out) == sorted(expected)
    for name, words in expected.items():
        assert words in open(os.path.join(out, name), encoding="utf-8").read().lower(), name
    assert "broken.mp3: cannot decode audio file" in first.stderr
    assert "1 of 5 input(s) failed" in first.stderr
    assert "x realtime" in first.stderr  # the progress bar over audio seconds

    before = {name: os.stat(os.path.join(out, name)).st_mtime_ns for name in expected}
    again = _run(str(root), "--recursive", "--output-dir", out, "--quiet")
    assert again.returncode == 1  # the broken file is retried and fails again; the others are skipped
    assert "skipped 4 input(s) whose output exists" in again.stderr and "1 of 1 input(s) failed" in again.stderr
    assert {name: os.stat(os.path.join(out, name)).st_mtime_ns for name in expected} == before

    redo = _run(str(root), "--recursive", "--output-dir", out, "--quiet", "--overwrite", "--output-format", "json")
    assert redo.returncode == 1 and "skipped" not in redo.stderr
    records = {name: json.load(open(os.path.join(out, name), encoding="utf-8"))
               for name in _outputs(out) if name.endswith(".json")}
    assert sorted(records) == sorted([name[:-4] + ".json" for name in expected] + ["broken.json"])
    assert "cannot decode" in records["broken.json"]["error"]


def test_without_recursive_only_the_top_folder(folder, tmp_path):
    root, _ = folder
    out = str(tmp_path / "top")
    result = _run(str(root), "--output-dir", out, "--quiet")
    assert result.returncode == 1 and _outputs(out) == ["clip.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    result = _run(str(empty), "--quiet")
    assert result.returncode == 2 and "no audio files in" in result.stderr


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_output_files_follow_the_umask(tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        write_atomic(str(tmp_path / "out" / "a.txt"), "text")
    finally:
        os.umask(previous)
    assert os.stat(tmp_path / "out" / "a.txt").st_mode & 0o777 == mode
