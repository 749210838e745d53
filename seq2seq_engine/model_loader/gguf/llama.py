"""Llama models in GGUF format (llama.cpp) → HF transformers directories with dequantized float32 weights.

    hf_dir = load_gguf_llama("model.gguf")        # converted once, then reused from the cache
    gguf_llama_to_hf("model.gguf", out_dir)        # or convert into a directory of your choice
    python -m seq2seq_engine.model_loader.gguf.llama FILE.gguf OUT_DIR

The output directory holds model.safetensors (float32; no lm_head.weight when the file has no `output.weight`, i.e.
tied embeddings), config.json (LlamaForCausalLM), generation_config.json, the tokenizer (built by transformers from
the GGUF metadata; left out, with a warning, when the file has no tokenizer.ggml.* fields) and gguf_source.json.
Tensors are read and dequantized with the `gguf` package; Q and K rows get back the order HF's rotary embedding
expects. Cache root: $SEQ2SEQ_ENGINE_CACHE, else ~/.cache/seq2seq_engine (seq2seq_engine.model_loader.conversion_cache).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import torch

from seq2seq_engine.model_loader.conversion_cache import cache_entry_name, convert_into_cache, run_conversion_cli

logger = logging.getLogger(__name__)

CONVERTER_VERSION = 1
SUPPORTED_ARCHITECTURE = "llama"
_REQUIRED = object()
_GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                   "output.weight": "lm_head.weight"}
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_LAYER_NAME = re.compile(r"blk\.(\d+)\.([a-z_]+)\.weight")

__all__ = ["gguf_llama_to_hf", "load_gguf_llama", "llama_config_kwargs", "gguf_llama_state_dict", "main"]


def open_gguf(path: str):
    """A gguf.GGUFReader over `path`; FileNotFoundError if it is missing, ValueError if it is not a GGUF file."""
    import gguf

    if not os.path.isfile(path):
        raise FileNotFoundError(f"no GGUF file {path!r}")
    try:
        return gguf.GGUFReader(path)
    except ValueError as exc:
        raise ValueError(f"{path!r} is not a readable GGUF file: {exc}") from exc


def _field(reader, key: str, default: Any = _REQUIRED) -> Any:
    field = reader.fields.get(key)
    if field is None:
        if default is _REQUIRED:
            raise ValueError(f"the GGUF file lacks the metadata field {key!r}")
        return default
    return field.contents()


def _rope_scaling(reader) -> Optional[dict]:
    """HF rope_scaling from llama.rope.scaling.*: none or linear (llama.cpp's other kinds are refused)."""
    kind = _field(reader, "llama.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(_field(reader, "llama.rope.scaling.factor"))}
    raise ValueError(f"llama.rope.scaling.type is {kind!r}; only 'none' and 'linear' are supported")


def llama_config_kwargs(reader) -> Dict[str, Any]:
    """LlamaConfig keyword arguments from the GGUF metadata; ValueError naming the field that is missing or
    unsupported."""
    architecture = _field(reader, "general.architecture")
    if architecture != SUPPORTED_ARCHITECTURE:
        raise ValueError(f"general.architecture is {architecture!r}; only {SUPPORTED_ARCHITECTURE!r} GGUF files can be "
                         f"converted")
    hidden = int(_field(reader, "llama.embedding_length"))
    heads = int(_field(reader, "llama.attention.head_count"))
    head_dim = int(_field(reader, "llama.attention.key_length", hidden // heads))
    rotary_dims = int(_field(reader, "llama.rope.dimension_count", head_dim))
    if rotary_dims != head_dim:
        raise ValueError(f"llama.rope.dimension_count is {rotary_dims}, not the head size {head_dim}: partial "
                         f"rotary embeddings are not supported")
    vocab = _field(reader, "llama.vocab_size", None)
    if vocab is None:
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        if tokens is None:
            raise ValueError("the GGUF file has neither llama.vocab_size nor tokenizer.ggml.tokens")
        vocab = len(tokens.data)
    kwargs = dict(
        vocab_size=int(vocab), hidden_size=hidden, intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_hidden_layers=int(_field(reader, "llama.block_count")), num_attention_heads=heads,
        num_key_value_heads=int(_field(reader, "llama.attention.head_count_kv", heads)), head_dim=head_dim,
        max_position_embeddings=int(_field(reader, "llama.context_length")),
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        tie_word_embeddings=all(tensor.name != "output.weight" for tensor in reader.tensors))
    eps = _field(reader, "llama.attention.layer_norm_rms_epsilon", None)
    if eps is not None:
        kwargs["rms_norm_eps"] = float(eps)
    scaling = _rope_scaling(reader)
    if scaling is not None:
        kwargs["rope_scaling"] = scaling
    for key, gguf_key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                          ("pad_token_id", "padding_token_id")):
        token_id = _field(reader, f"tokenizer.ggml.{gguf_key}", None)
        if token_id is not None:
            kwargs[key] = int(token_id)
    return kwargs


def _hf_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    match = _LAYER_NAME.fullmatch(gguf_name)
    if match is None or match.group(2) not in _LAYER_TENSORS:
        raise ValueError(f"unexpected tensor {gguf_name!r} in a llama GGUF file (known: token_embd, output_norm, "
                         f"output, blk.N.{{{', '.join(_LAYER_TENSORS)}}})")
    return f"model.layers.{match.group(1)}.{_LAYER_TENSORS[match.group(2)]}.weight"


def _expected_shapes(config: Dict[str, Any]) -> Dict[str, Tuple[int, ...]]:
    hidden, ffn, head_dim = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q_rows, kv_rows = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    layer = {"input_layernorm": (hidden,), "post_attention_layernorm": (hidden,),
             "self_attn.q_proj": (q_rows, hidden), "self_attn.k_proj": (kv_rows, hidden),
             "self_attn.v_proj": (kv_rows, hidden), "self_attn.o_proj": (hidden, q_rows),
             "mlp.gate_proj": (ffn, hidden), "mlp.up_proj": (ffn, hidden), "mlp.down_proj": (hidden, ffn)}
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], hidden), "model.norm.weight": (hidden,)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (config["vocab_size"], hidden)
    for index in range(config["num_hidden_layers"]):
        shapes.update({f"model.layers.{index}.{name}.weight": shape for name, shape in layer.items()})
    return shapes


def _unpermute_rotary(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row order. HF rotates the two halves of each head (rotate_half); llama.cpp's converter
    interleaves them into (x0, x_half, x1, x_half+1, ...) pairs for ggml's rope, so row 2i+j of a head goes back
    to row j*half+i."""
    half = weight.shape[0] // num_heads // 2
    return weight.reshape(num_heads, half, 2, -1).transpose(1, 2).reshape(weight.shape).contiguous()


def _dequantize(tensor) -> np.ndarray:
    import gguf

    try:
        return gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as exc:
        raise ValueError(f"tensor {tensor.name!r} has type {tensor.tensor_type.name}, which the gguf package "
                         f"cannot dequantize ({exc})") from exc


def gguf_llama_state_dict(reader, config: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    """HF LlamaForCausalLM state dict (float32) of the reader's tensors; ValueError for an unknown, missing or
    misshapen tensor."""
    expected = _expected_shapes(config)
    state: Dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        weight = torch.from_numpy(np.array(_dequantize(tensor), dtype=np.float32))  # a copy: the file is read-only
        if name not in expected or tuple(weight.shape) != expected[name]:
            raise ValueError(f"tensor {tensor.name!r} has shape {tuple(weight.shape)}; the metadata implies "
                             f"{expected.get(name, 'no such tensor')} for {name!r}")
        if name.endswith("q_proj.weight"):
            weight = _unpermute_rotary(weight, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            weight = _unpermute_rotary(weight, config["num_key_value_heads"])
        state[name] = weight
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ValueError(f"the GGUF file lacks {len(missing)} tensor(s) for {missing[:4]}")
    return state


def _write_config_files(config_kwargs: Dict[str, Any], out_dir: str) -> None:
    import transformers

    config = transformers.LlamaConfig(**config_kwargs, architectures=["LlamaForCausalLM"])
    dtype_key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    setattr(config, dtype_key, "float32")
    config.save_pretrained(out_dir)
    special_tokens = {key: value for key, value in config_kwargs.items() if key.endswith("_token_id")}
    transformers.GenerationConfig(**special_tokens).save_pretrained(out_dir)


def gguf_llama_to_hf(path: str, out_dir: str) -> str:
    """Convert the llama GGUF file `path` into the HF directory `out_dir`; returns out_dir."""
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    path, out_dir = os.path.abspath(os.fspath(path)), os.fspath(out_dir)
    reader = open_gguf(path)
    config_kwargs = llama_config_kwargs(reader)
    state = gguf_llama_state_dict(reader, config_kwargs)
    os.makedirs(out_dir, exist_ok=True)
    save_file(state, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    del state
    _write_config_files(config_kwargs, out_dir)
    if "tokenizer.ggml.model" in reader.fields:
        tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
        tokenizer.save_pretrained(out_dir)
    else:
        logger.warning("%s has no tokenizer.ggml.* metadata: converted without a tokenizer (token prompts only)",
                       path)
    with open(os.path.join(out_dir, "gguf_source.json"), "w", encoding="utf-8") as f:
        json.dump({"gguf_file": path, "name": _field(reader, "general.name", None),
                   "converter_version": CONVERTER_VERSION}, f, indent=2)
    return out_dir


def load_gguf_llama(path: str, cache_dir: Optional[str] = None) -> str:
    """The HF directory converted from the GGUF file `path`, converting it into the cache on first use (the entry is
    fingerprinted by the file's path, size and mtime). A cache hit does not open the file: parsing the metadata of
    a 49k-token vocabulary alone takes seconds."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no GGUF file {path!r}")
    name = cache_entry_name(path, [path], CONVERTER_VERSION, "gguf-llama")

    def convert(out_dir: str) -> None:
        logger.info("converting GGUF model %s into the cache entry %s", path, name)
        gguf_llama_to_hf(path, out_dir)

    return convert_into_cache(name, convert, cache_dir)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seq2seq_engine.model_loader.gguf.llama",
                                     description="Convert a llama GGUF file to an HF transformers directory "
                                                 "(float32 weights).")
    parser.add_argument("gguf_file", help="the .gguf file (general.architecture = llama)")
    parser.add_argument("out_dir", help="output HF directory (created)")
    args = parser.parse_args(argv)
    return run_conversion_cli(lambda: gguf_llama_to_hf(args.gguf_file, args.out_dir))


if __name__ == "__main__":
    sys.exit(main())
