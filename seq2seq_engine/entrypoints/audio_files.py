"""The audio files a `seq2seq-engine transcribe` run covers: folders expanded by extension, and their output names."""
from __future__ import annotations

import dataclasses
import os
from typing import Dict, List, Sequence

# Files a folder contributes, by extension (case-insensitive): what FFmpeg or libsndfile decode and people keep
# speech in. A file given by name is transcribed whatever its extension.
AUDIO_EXTENSIONS = (
    ".wav", ".flac", ".mp3", ".m4a", ".aac", ".ogg", ".oga", ".opus", ".webm", ".weba", ".mp4", ".m4v", ".mkv",
    ".mka", ".mov", ".avi", ".wma", ".aif", ".aiff", ".caf", ".amr", ".3gp", ".ac3", ".wv", ".mpga", ".mp2",
)


@dataclasses.dataclass
class AudioJob:
    """One file to transcribe and its output name: a path relative to the output folder, without the format's
    extension (`a/x` for `DIR/a/x.mp3`)."""

    source: str
    output_name: str


def find_audio_files(folder: str, recursive: bool) -> List[str]:
    """Audio files in `folder` (and its subfolders with `recursive`) by extension, sorted by path; hidden files and
    folders (names starting with ".", such as macOS "._x.mp3" companions) are left out."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if recursive else []
        found.extend(os.path.join(root, name) for name in files
                     if not name.startswith(".") and os.path.splitext(name)[1].lower() in AUDIO_EXTENSIONS)
    return sorted(found, key=lambda path: os.path.relpath(path, folder).split(os.sep))


def _folder_jobs(folder: str, recursive: bool) -> List[AudioJob]:
    """Output names mirror the path under `folder`; files in one folder sharing a stem (x.mp3, x.wav) keep their
    extension in the name (x.mp3, x.wav) so neither overwrites the other."""
    files = find_audio_files(folder, recursive)
    stems: Dict[str, int] = {}
    for path in files:
        stem = os.path.splitext(os.path.relpath(path, folder))[0]
        stems[stem] = stems.get(stem, 0) + 1
    jobs = []
    for path in files:
        relative = os.path.relpath(path, folder)
        stem = os.path.splitext(relative)[0]
        jobs.append(AudioJob(path, relative if stems[stem] > 1 else stem))
    return jobs


def expand_inputs(paths: Sequence[str], recursive: bool = False) -> List[AudioJob]:
    """One job per file given and per audio file in each folder given. A file's output name is its stem; a folder's
    files mirror their path under it. Names still clashing (the same stem given twice) get "-2", "-3", ... in
    order."""
    jobs: List[AudioJob] = []
    for path in paths:
        if os.path.isdir(path):
            jobs.extend(_folder_jobs(path, recursive))
        else:  # a missing or unreadable file is reported as that input's error
            stem = os.path.splitext(os.path.basename(os.path.normpath(path)))[0] or "audio"
            jobs.append(AudioJob(path, stem))
    used = set()
    for job in jobs:
        name, n = job.output_name, 1
        while name in used:
            n += 1
            name = f"{job.output_name}-{n}"
        used.add(name)
        job.output_name = name
    return jobs


def output_path(output_dir: str, job: AudioJob, output_format: str) -> str:
    return os.path.join(output_dir, f"{job.output_name}.{output_format}")
