"""Encoder/decoder text models in CTranslate2 format (TransformerSpec model.bin + vocabulary + config.json) → HF
transformers directories: BART, mBART, Marian, M2M100/NLLB, Pegasus, T5/mT5 and UMT5.

    hf_dir = load_ct2_text(ct2_dir)            # converted once, then reused from the cache
    ct2_text_to_hf(ct2_dir, out_dir)           # or convert into a directory of your choice
    python -m seq2seq_engine.model_loader.ct2.text CT2_DIR OUT_DIR [--dtype float32]

The output holds model.safetensors (HF parameter names), config.json (the family's architecture, recognised from
the variables: seq2seq_engine/model_loader/ct2/text_spec.py), generation_config.json (token ids) and a tokenizer
(seq2seq_engine/model_loader/ct2/text_vocab.py).
"""
from __future__ import annotations

import json
import logging
import os
import sys
from typing import Dict, Optional, Sequence

import torch

from seq2seq_engine.config import torch_dtype
from seq2seq_engine.model_loader.conversion_cache import (cache_entry_name, conversion_parser, convert_into_cache,
                                                          run_conversion_cli)
from seq2seq_engine.model_loader.ct2.bart_like_weights import bart_like_config, bart_like_state_dict
from seq2seq_engine.model_loader.ct2.model_bin import model_bin_files, read_ct2_config, read_ct2_model
from seq2seq_engine.model_loader.ct2.t5_weights import t5_config, t5_state_dict
from seq2seq_engine.model_loader.ct2.text_spec import TRANSFORMER_SPEC, TextSpec, read_text_spec
from seq2seq_engine.model_loader.ct2.text_vocab import (HF_TOKENIZER_FILES, MARIAN_PAD, copy_hf_tokenizer,
                                                        read_text_vocabulary, special_token_ids,
                                                        write_vocabulary_tokenizer)

logger = logging.getLogger(__name__)

CONVERTER_VERSION = 1
# the HF eps of each family's norms (CTranslate2's config.json has layer_norm_epsilon null for all of them)
_T5_EPSILON = 1e-6

__all__ = ["ct2_text_to_hf", "load_ct2_text", "main"]


def _hf_config(spec: TextSpec, ct2_config: dict, token_ids: Dict[str, int], tied: bool, dtype: torch.dtype):
    import transformers

    fields = t5_config(spec, tied) if spec.family in ("t5", "umt5") else bart_like_config(spec, tied)
    if spec.family in ("t5", "umt5"):
        fields["layer_norm_epsilon"] = ct2_config.get("layer_norm_epsilon") or _T5_EPSILON
    elif ct2_config.get("layer_norm_epsilon") not in (None, 1e-5):
        raise ValueError(f"layer_norm_epsilon {ct2_config['layer_norm_epsilon']} is not supported: HF "
                         f"{spec.family} normalises with 1e-5")
    model_type = fields.pop("model_type")
    ids = {key: value for key, value in token_ids.items() if key != "unk_token_id"}
    config = transformers.AutoConfig.for_model(model_type, **fields, **ids)
    dtype_key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    setattr(config, dtype_key, str(dtype).replace("torch.", ""))
    return config


def _write_tokenizer(ct2_dir: str, out_dir: str, tokens, ct2_config: dict, max_length: int) -> str:
    """"copied" or "vocabulary": which tokenizer the converted directory got."""
    if copy_hf_tokenizer(ct2_dir, out_dir, tokens):
        return "copied"
    write_vocabulary_tokenizer(tokens, ct2_config, out_dir, max_length)
    return "vocabulary"


def ct2_text_to_hf(ct2_dir: str, out_dir: str, dtype: torch.dtype = torch.float32) -> str:
    """Convert the CTranslate2 TransformerSpec directory `ct2_dir` into the HF directory `out_dir`; returns out_dir."""
    from safetensors.torch import save_file

    ct2_dir, out_dir = os.fspath(ct2_dir), os.fspath(out_dir)
    files = model_bin_files(ct2_dir)
    ct2_config = read_ct2_config(ct2_dir)
    name, revision, variables, aliases = read_ct2_model(files)
    if name != TRANSFORMER_SPEC:
        raise ValueError(f"{files[0]} holds a CTranslate2 {name!r} model, not {TRANSFORMER_SPEC!r}")
    spec = read_text_spec(variables, aliases)
    del variables
    tokens = read_text_vocabulary(ct2_dir)
    if spec.family == "marian":
        tokens = tokens + [MARIAN_PAD]
    state, tied = (t5_state_dict if spec.family in ("t5", "umt5") else bart_like_state_dict)(spec)
    config = _hf_config(spec, ct2_config, special_token_ids(tokens, ct2_config, spec.family), tied, dtype)
    if len(tokens) > config.vocab_size:
        raise ValueError(f"the vocabulary has {len(tokens)} tokens, the model's embeddings only {config.vocab_size}")
    os.makedirs(out_dir, exist_ok=True)
    save_file({key: tensor.to(dtype=dtype, copy=True).contiguous() for key, tensor in state.items()},
              os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out_dir)
    ids = {key: getattr(config, key) for key in ("bos_token_id", "eos_token_id", "pad_token_id",
                                                 "decoder_start_token_id")}
    with open(os.path.join(out_dir, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump(ids, f, indent=2)
    max_length = getattr(config, "max_position_embeddings", None) or 512
    tokenizer = _write_tokenizer(ct2_dir, out_dir, tokens, ct2_config, max_length)
    with open(os.path.join(out_dir, "ct2_source.json"), "w", encoding="utf-8") as f:
        json.dump({"ct2_dir": os.path.abspath(ct2_dir), "model_files": [os.path.abspath(p) for p in files],
                   "spec": name, "spec_revision": revision, "family": spec.family, "tokenizer": tokenizer,
                   "converter_version": CONVERTER_VERSION}, f, indent=2)
    logger.info("converted the CTranslate2 %s model %s (tokenizer: %s)", spec.family, ct2_dir, tokenizer)
    return out_dir


def load_ct2_text(ct2_dir: str, dtype: torch.dtype = torch.float32, cache_dir: Optional[str] = None) -> str:
    """The HF directory converted from the CTranslate2 text model `ct2_dir`, converted into the cache on first use."""
    ct2_dir = os.fspath(ct2_dir)
    files = model_bin_files(ct2_dir)
    extra = [os.path.join(ct2_dir, n) for n in ("config.json", "shared_vocabulary.json", "shared_vocabulary.txt",
                                                "source_vocabulary.json", "target_vocabulary.json",
                                                *HF_TOKENIZER_FILES)]
    entry = cache_entry_name(ct2_dir, files + extra, "ct2-text", CONVERTER_VERSION, str(dtype))

    def convert(out_dir: str) -> None:
        logger.info("converting CTranslate2 text model %s into the cache entry %s", ct2_dir, entry)
        ct2_text_to_hf(ct2_dir, out_dir, dtype=dtype)

    return convert_into_cache(entry, convert, cache_dir)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = conversion_parser("seq2seq_engine.model_loader.ct2.text", "text model",
                               "directory with model.bin, config.json and the vocabulary file(s)")
    args = parser.parse_args(argv)
    return run_conversion_cli(lambda: ct2_text_to_hf(args.ct2_dir, args.out_dir, dtype=torch_dtype(args.dtype)))


if __name__ == "__main__":
    sys.exit(main())
