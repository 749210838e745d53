"""Whisper models in CTranslate2 format (model.bin v6 + config.json + tokenizer.json) → HF transformers directories.

    hf_dir = load_ct2_whisper(ct2_dir)         # converted once, then reused from the cache
    ct2_whisper_to_hf(ct2_dir, out_dir)        # or convert into a directory of your choice
    python -m seq2seq_engine.model_loader.ct2.whisper CT2_DIR OUT_DIR [--dtype float32] [--model-file PART ...]

The output directory holds model.safetensors, config.json (WhisperForConditionalGeneration), generation_config.json
(suppress lists, task/language ids, alignment heads), preprocessor_config.json (WhisperFeatureExtractor) and the
fixed tokenizer (see seq2seq_engine/model_loader/ct2/whisper_tokenizer.py). Cache root: $SEQ2SEQ_ENGINE_CACHE, else
~/.cache/seq2seq_engine.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from typing import Optional, Sequence

import torch

from seq2seq_engine.config import torch_dtype
from seq2seq_engine.model_loader.conversion_cache import (cache_entry_name, conversion_parser, convert_into_cache,
                                                          run_conversion_cli)
from seq2seq_engine.model_loader.ct2.model_bin import (BINARY_VERSION, model_bin_files, read_ct2_config,
                                                       read_ct2_header, read_ct2_model)
from seq2seq_engine.model_loader.ct2.whisper_tokenizer import (language_tokens, read_vocab, special_ids,
                                                               write_fixed_tokenizer)
from seq2seq_engine.model_loader.ct2.whisper_weights import ct2_to_hf_state_dict, whisper_dims

logger = logging.getLogger(__name__)

CONVERTER_VERSION = 1
WHISPER_SPEC = "WhisperSpec"

__all__ = ["read_ct2_model", "ct2_whisper_to_hf", "load_ct2_whisper", "main"]


def _generation_config(ct2_dir: str, ct2_config: dict, vocab, ids: dict, dims: dict, suppress: list,
                       begin_suppress: list) -> dict:
    """Contents of the converted model's generation_config.json."""
    multilingual = dims["vocab_size"] >= 51865
    alignment_heads = [[int(layer), int(head)] for layer, head in ct2_config.get("alignment_heads", [])]
    generation = dict(
        decoder_start_token_id=ids["sot"], bos_token_id=ids["eot"], eos_token_id=ids["eot"], pad_token_id=ids["eot"],
        suppress_tokens=suppress, begin_suppress_tokens=begin_suppress, max_length=dims["max_target_positions"],
        no_timestamps_token_id=ids["notimestamps"], is_multilingual=multilingual, return_timestamps=False,
        max_initial_timestamp_index=50, alignment_heads=alignment_heads)
    if "startofprev" in ids:
        generation["prev_sot_token_id"] = ids["startofprev"]
    if multilingual:
        generation["lang_to_id"] = language_tokens(vocab)
        generation["task_to_id"] = {task: ids[task] for task in ("transcribe", "translate") if task in ids}
        lang_ids = sorted(int(i) for i in ct2_config.get("lang_ids", []))
        if lang_ids and lang_ids != sorted(generation["lang_to_id"].values()):
            logger.warning("%s: config.json lang_ids differ from the tokenizer's language tokens; using the "
                           "tokenizer's", ct2_dir)
    return generation


def _config_json(dims: dict, ids: dict, suppress: list, begin_suppress: list, dtype: torch.dtype) -> dict:
    """config.json: what transformers' WhisperConfig holds beyond its defaults (the engine reads it without
    transformers: model_loader/config_file.py)."""
    return dict(architectures=["WhisperForConditionalGeneration"], model_type="whisper", is_encoder_decoder=True,
                **dims, decoder_start_token_id=ids["sot"], bos_token_id=ids["eot"], eos_token_id=ids["eot"],
                pad_token_id=ids["eot"], suppress_tokens=suppress, begin_suppress_tokens=begin_suppress,
                dtype=str(dtype).replace("torch.", ""))


def _feature_extractor_json(num_mel_bins: int) -> dict:
    """preprocessor_config.json: transformers' WhisperFeatureExtractor for 30 s windows of 16 kHz audio."""
    return dict(feature_extractor_type="WhisperFeatureExtractor", feature_size=num_mel_bins, sampling_rate=16000,
                hop_length=160, chunk_length=30, n_fft=400, n_samples=480000, nb_max_frames=3000, padding_side="right",
                padding_value=0.0, return_attention_mask=False, dither=0.0)


def _write_json(out_dir: str, name: str, content: dict) -> None:
    with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
        json.dump(content, f, indent=2)


def ct2_whisper_to_hf(ct2_dir: str, out_dir: str, dtype: torch.dtype = torch.float32,
                      model_files: Optional[Sequence[str]] = None) -> str:
    """Convert the CTranslate2 Whisper directory `ct2_dir` into the HF directory `out_dir`; returns out_dir.

    model_files: the model.bin (or its parts, read as one concatenated file) when not in `ct2_dir` itself;
    by default model_bin_files(ct2_dir).
    """
    from safetensors.torch import save_file

    ct2_dir, out_dir = os.fspath(ct2_dir), os.fspath(out_dir)
    files = list(model_files) if model_files else model_bin_files(ct2_dir)
    ct2_config = read_ct2_config(ct2_dir)
    spec, revision, variables, aliases = read_ct2_model(files)
    if spec != WHISPER_SPEC:
        raise ValueError(f"{files[0]} holds a CTranslate2 {spec!r} model, not {WHISPER_SPEC!r}")
    dims = whisper_dims(variables, aliases)
    state = ct2_to_hf_state_dict(variables, aliases, dtype)
    del variables

    vocab = read_vocab(ct2_dir)
    ids = special_ids(vocab)
    os.makedirs(out_dir, exist_ok=True)
    save_file(state, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    suppress = [int(i) for i in ct2_config.get("suppress_ids", [])]
    begin_suppress = [int(i) for i in ct2_config.get("suppress_ids_begin", [])]
    _write_json(out_dir, "config.json", _config_json(dims, ids, suppress, begin_suppress, dtype))
    generation = _generation_config(ct2_dir, ct2_config, vocab, ids, dims, suppress, begin_suppress)
    _write_json(out_dir, "generation_config.json", generation)
    _write_json(out_dir, "preprocessor_config.json", _feature_extractor_json(dims["num_mel_bins"]))
    write_fixed_tokenizer(ct2_dir, out_dir, dims["vocab_size"], model_max_length=dims["max_target_positions"])
    _write_json(out_dir, "ct2_source.json", {"ct2_dir": os.path.abspath(ct2_dir),
                                             "model_files": [os.path.abspath(p) for p in files],
                                             "spec_revision": revision, "converter_version": CONVERTER_VERSION})
    return out_dir


def load_ct2_whisper(ct2_dir: str, model_files: Optional[Sequence[str]] = None, dtype: torch.dtype = torch.float32,
                     cache_dir: Optional[str] = None) -> str:
    """The HF directory converted from `ct2_dir`, converting it into the cache on first use.

    The cache entry is named after the directory plus a hash of the model files' paths, sizes and mtimes, so an
    updated package converts again (seq2seq_engine.model_loader.conversion_cache).
    """
    ct2_dir = os.fspath(ct2_dir)
    files = [os.fspath(p) for p in model_files] if model_files else model_bin_files(ct2_dir)
    version, spec, _ = read_ct2_header(files[0])
    if version != BINARY_VERSION or spec != WHISPER_SPEC:
        raise ValueError(f"{files[0]} is a CTranslate2 binary version {version} {spec or '?'} model; only version "
                         f"{BINARY_VERSION} {WHISPER_SPEC} models can be converted")
    fingerprinted = files + [os.path.join(ct2_dir, n) for n in ("config.json", "tokenizer.json")]
    name = cache_entry_name(ct2_dir, fingerprinted, CONVERTER_VERSION, str(dtype))

    def convert(out_dir: str) -> None:
        logger.info("converting CTranslate2 Whisper model %s into the cache entry %s", ct2_dir, name)
        ct2_whisper_to_hf(ct2_dir, out_dir, dtype=dtype, model_files=files)

    return convert_into_cache(name, convert, cache_dir)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = conversion_parser("seq2seq_engine.model_loader.ct2.whisper", "Whisper model",
                               "directory with model.bin (or model.bin.partN), config.json, tokenizer.json")
    parser.add_argument("--model-file", action="append", default=None,
                        help="a model.bin or a part of it, in order (repeat); default: found in/next to ct2_dir")
    args = parser.parse_args(argv)
    return run_conversion_cli(lambda: ct2_whisper_to_hf(args.ct2_dir, args.out_dir, dtype=torch_dtype(args.dtype),
                                                        model_files=args.model_file))


if __name__ == "__main__":
    sys.exit(main())
