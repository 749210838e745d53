"""Prepared weights: a CPU model's final tensors saved once as aligned safetensors, memory-mapped by later loads."""
from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import struct
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from torch import nn

from seq2seq_engine.cache_dir import cache_root, writable_cache_dir
from seq2seq_engine.model_loader.prepared_checksum import CHECKSUM_ALGORITHM, CHECKSUM_KEY, checksum
from seq2seq_engine.model_loader.prepared_state import PreparedMismatch, restore, snapshot

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2   # 2: the file carries its checksum
ALIGNMENT = 64
PAD_PREFIX = "__pad__."
_DTYPE_NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                torch.bool: "BOOL"}
_STALE_TEMP_SECONDS = 3600
MAX_FILES_PER_MODEL = 4   # float32, int8, bfloat16 and one more (another kernel plan, an ISA cap)


def write_aligned_safetensors(path: str, tensors: Dict[str, torch.Tensor], metadata: Dict[str, str]) -> None:
    """A safetensors file whose tensors each start on an ALIGNMENT-byte boundary of the file (padding entries
    fill the gaps; the format allows no holes); the header is padded with spaces so the data starts aligned too."""
    header: Dict[str, Any] = {}
    chunks: List[Any] = []
    offset = 0
    for name, tensor in tensors.items():
        pad = -offset % ALIGNMENT
        if pad:
            header[f"{PAD_PREFIX}{len(chunks)}"] = {"dtype": "U8", "shape": [pad],
                                                    "data_offsets": [offset, offset + pad]}
            chunks.append(bytes(pad))
            offset += pad
        data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        header[name] = {"dtype": _DTYPE_NAMES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + data.nbytes]}
        chunks.append(data)
        offset += data.nbytes
    header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % ALIGNMENT)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(text)))
        handle.write(text)
        for chunk in chunks:
            handle.write(chunk)


def _code_files() -> List[str]:
    """The model definitions and kernel front ends: preparation is their code."""
    from seq2seq_engine import kernels, models
    folders = [os.path.dirname(os.path.abspath(package.__file__)) for package in (kernels, models)]
    here = os.path.dirname(os.path.abspath(__file__))
    return sorted([path for folder in folders for path in glob.glob(os.path.join(folder, "*.py"))]
                  + [os.path.join(here, name) for name in ("prepared_cache.py", "prepared_state.py",
                                                           "prepared_checksum.py")])


def _stats(paths: Sequence[str]) -> list:
    entries = []
    for path in paths:
        stat = os.stat(path)
        entries.append([os.path.abspath(path), stat.st_size, stat.st_mtime_ns])
    return entries


def preparation_plan(dtype: torch.dtype, quantization: Optional[str],
                     linear_weight_dtype: Optional[torch.dtype]) -> list:
    """What load_model makes of the weights on this machine (dtypes, and the kernels the linears are prepared
    for), for the slot's name."""
    if quantization is not None:
        from seq2seq_engine.kernels.native_int8 import int8_linear_available
        from seq2seq_engine.models.int8 import activations_need_reduced_range
        return [str(dtype), quantization, int8_linear_available(), activations_need_reduced_range()]
    if dtype == torch.float32:
        from seq2seq_engine.models.packed_linear import float32_packing
        weights = linear_weight_dtype or torch.float32
        bf16 = weights == torch.bfloat16
        return [str(dtype), str(weights), float32_packing(False, bf16), float32_packing(True, bf16)]
    return [str(dtype)]


class PreparedWeights:
    """The prepared-weights file of one model directory loaded one way on this machine, under cache_root()/prepared:

        cache = PreparedWeights(model_dir, weight_files, dtype, quantization, linear_weight_dtype)
        model = cache.load(build_skeleton)   # None: no usable file
        cache.save(model)                    # after the slow load; atomic, one file per slot

    The slot (the file name) is the model directory and `preparation_plan`; inside, a fingerprint of the weight
    files, config.json, torch's version and the model and kernel code (size and mtime) must match, else the slot is
    prepared again. Every tensor starts on a 64-byte boundary, as torch's own allocations do, so the kernels read
    mapped weights as fast as loaded ones. The file's checksum (prepared_checksum.py) is checked on every load: a
    damaged file is logged and prepared again, never used."""

    def __init__(self, model_dir: str, weight_files: Sequence[str], dtype: torch.dtype, quantization: Optional[str],
                 linear_weight_dtype: Optional[torch.dtype], cache_dir: Optional[str] = None) -> None:
        self.model_dir = os.path.abspath(model_dir)
        slot = [self.model_dir, preparation_plan(dtype, quantization, linear_weight_dtype)]
        digest = hashlib.sha256(json.dumps(slot).encode()).hexdigest()[:16]
        label = re.sub(r"[^A-Za-z0-9_.]+", "_", os.path.basename(self.model_dir.rstrip(os.sep)))
        self.folder = os.path.join(cache_dir or cache_root(), "prepared")
        self.path = os.path.join(self.folder, f"{label}-{digest}.safetensors")
        files = [*weight_files, os.path.join(model_dir, "config.json"), *_code_files()]
        self.fingerprint = hashlib.sha256(json.dumps([FORMAT_VERSION, torch.__version__, CHECKSUM_ALGORITHM,
                                                      _stats(files)]).encode()).hexdigest()
        self.refused = False   # an up-to-date file that did not fit: not written again

    def load(self, build_skeleton: Callable[[], nn.Module]) -> Optional[nn.Module]:
        """The prepared model, its tensors memory-mapped from the file; None when there is no up-to-date file or
        it does not fit the model or is damaged (logged; the caller loads the slow way)."""
        from safetensors import SafetensorError, safe_open
        if not os.path.isfile(self.path):   # a regular file only: opening a FIFO would wait for a writer
            return None
        try:
            with safe_open(self.path, framework="pt", device="cpu") as handle:
                metadata = handle.metadata() or {}
                if metadata.get("fingerprint") != self.fingerprint:
                    return None
                tensors = {name: handle.get_tensor(name) for name in handle.keys() if not name.startswith(PAD_PREFIX)}
            if metadata.get(CHECKSUM_KEY) != checksum(metadata, tensors):
                logger.warning("prepared weights %s are damaged (their checksum does not match): preparing %s again "
                               "from its weights", self.path, self.model_dir)
                return None
            model = restore(build_skeleton(), json.loads(metadata["layout"]), tensors)
            os.utime(self.path)   # last used: prune_prepared keeps the most recently used files of a model
            return model
        except PreparedMismatch as error:   # up to date, yet not this model: preparing again would not help
            self.refused = True
            logger.warning("prepared weights %s do not fit %s (%s): loading it from its checkpoint", self.path,
                           self.model_dir, error)
        except (SafetensorError, OSError, KeyError, ValueError, RuntimeError) as error:   # a damaged file
            logger.warning("prepared weights %s are unreadable (%s): preparing %s again", self.path, error,
                           self.model_dir)
        return None

    def save(self, model: nn.Module) -> None:
        """Write the prepared model's file (atomically); a failure is only logged."""
        if self.refused:
            return
        try:
            layout, tensors = snapshot(model)
            metadata = {"format": "pt", "fingerprint": self.fingerprint, "model_dir": self.model_dir,
                        "layout": json.dumps(layout)}
            metadata[CHECKSUM_KEY] = checksum(metadata, tensors)
            writable_cache_dir(self.folder)
            handle, temporary = tempfile.mkstemp(prefix=".preparing-", suffix=".safetensors", dir=self.folder)
            os.close(handle)
            try:
                write_aligned_safetensors(temporary, tensors, metadata)
                os.replace(temporary, self.path)
            finally:
                if os.path.exists(temporary):
                    os.remove(temporary)
            prune_prepared(self.folder)
        except (OSError, RuntimeError, KeyError, TypeError, ValueError) as error:   # the model is loaded anyway
            logger.warning("could not write prepared weights %s: %s", self.path, error)


def prune_prepared(folder: str, per_model: int = MAX_FILES_PER_MODEL) -> None:
    """Remove prepared files whose model directory is gone, all but the `per_model` most recently used files of each
    model directory (other dtypes, kernels or ISA caps), and temporary files left by a crashed write. Only regular
    files are opened: a FIFO would block the open until a writer came, a device could be anything. Such an entry is
    left alone, as the cache never makes one; one at a slot's own name is replaced by that slot's next write."""
    from safetensors import SafetensorError, safe_open
    by_model: Dict[str, List[str]] = {}
    for path in glob.glob(os.path.join(folder, "*.safetensors")):
        if not os.path.isfile(path):
            continue
        try:
            with safe_open(path, framework="pt", device="cpu") as handle:
                model_dir = (handle.metadata() or {}).get("model_dir", "")
            if os.path.isdir(model_dir):
                by_model.setdefault(model_dir, []).append(path)
            else:
                os.remove(path)
        except (SafetensorError, OSError):
            continue
    for paths in by_model.values():
        for path in sorted(paths, key=_mtime, reverse=True)[per_model:]:
            _remove(path)
    for path in glob.glob(os.path.join(folder, ".preparing-*")):
        if time.time() - _mtime(path) > _STALE_TEMP_SECONDS:
            _remove(path)


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except OSError:
        return time.time()   # gone already, or being replaced: newest, so kept


def _remove(path: str) -> None:
    try:
        os.remove(path)   # a process that mapped it keeps its pages
    except OSError:
        pass
