"""A model directory's config: Whisper's read from config.json alone (transformers not imported), others through
transformers' AutoConfig."""
from __future__ import annotations

import copy
import json
import os
from typing import Any, Dict, Union

# What the engine reads of a Whisper config (models/whisper.py, config.py's model_config_from_hf); a config.json
# without one of them is read by transformers, which fills its defaults.
WHISPER_FIELDS = ("architectures", "activation_function", "d_model", "decoder_attention_heads", "decoder_ffn_dim",
                  "decoder_layers", "decoder_start_token_id", "encoder_attention_heads", "encoder_ffn_dim",
                  "encoder_layers", "eos_token_id", "is_encoder_decoder", "max_source_positions",
                  "max_target_positions", "num_mel_bins", "vocab_size")


class JsonConfig:
    """config.json's fields as attributes, as an HF config holds them: what the engine reads of a Whisper model
    without importing transformers (a missing field is an AttributeError, so getattr's defaults apply)."""

    def __init__(self, fields: Dict[str, Any], name_or_path: str) -> None:
        self.__dict__.update(copy.deepcopy(fields))
        self._name_or_path = name_or_path

    @property
    def name_or_path(self) -> str:
        return self._name_or_path

    def to_dict(self) -> Dict[str, Any]:
        return {key: copy.deepcopy(value) for key, value in self.__dict__.items() if not key.startswith("_")}

    def __repr__(self) -> str:
        return f"JsonConfig({self._name_or_path!r}, model_type={self.__dict__.get('model_type')!r})"


def read_config_json(model_dir: str) -> Dict[str, Any]:
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        return json.load(f)


def plain_whisper_config(fields: Dict[str, Any]) -> bool:
    """Whether config.json names a Whisper model and every field the engine reads of it."""
    return fields.get("model_type") == "whisper" and all(name in fields for name in WHISPER_FIELDS)


def load_config(model_dir: Union[str, os.PathLike]):
    """The directory's config: a JsonConfig for a Whisper config.json that names what the engine reads, else
    transformers' AutoConfig (never downloads)."""
    model_dir = os.fspath(model_dir)
    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"model directory {model_dir!r} does not exist")
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise FileNotFoundError(f"no config.json in model directory {model_dir!r}")
    try:
        fields = read_config_json(model_dir)
    except (OSError, ValueError):
        fields = {}   # transformers reports an unreadable file in its words
    if isinstance(fields, dict) and plain_whisper_config(fields):
        return JsonConfig(fields, model_dir)
    import transformers

    return transformers.AutoConfig.from_pretrained(model_dir, local_files_only=True)
