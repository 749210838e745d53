"""CTranslate2 TransformerSpec variables read as one text family (BART, mBART, Marian, M2M100/NLLB, Pegasus, T5/UMT5).

CTranslate2 keeps no architecture name in a TransformerSpec model.bin, only what the graph does; the family is
recognised from that: T5 has relative attention biases and RMS norms; the BART-like families differ in pre/post-norm,
`layernorm_embedding`, Marian's zero-embedding decoder start, and their position tables (learned for (m)BART, the
Marian/Pegasus sinusoid, or the fairseq sinusoid of M2M100). A spec matching none of them is refused by name.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Dict, Mapping

import torch

from seq2seq_engine.model_loader.ct2.whisper_weights import dequantize

TRANSFORMER_SPEC = "TransformerSpec"
FAMILIES = ("bart", "mbart", "marian", "m2m100", "pegasus", "t5", "umt5")
# CTranslate2 ActivationType ids -> HF activation names
ACTIVATIONS = {0: "relu", 1: "gelu_new", 2: "silu", 3: "gelu", 4: "quick_gelu", 5: "tanh", 6: "sigmoid"}
_LAYER_RE = re.compile(r"^(encoder|decoder)/layer_(\d+)/")
# features of a TransformerSpec that no supported family has
_UNSUPPORTED_SCALARS = {"decoder/alibi": 0, "encoder/multi_query_attention": 0}
_UNSUPPORTED_NAMES = ("relative_position_keys", "relative_asymmetric_position_keys", "rotary_dim", "num_heads_kv",
                      "embeddings_1/", "project_in/", "q_norm/", "sliding_window", "multiply_by_sqrt_depth")


@dataclass(frozen=True)
class TextSpec:
    """One CTranslate2 TransformerSpec model: its family and its variables (aliases resolved, int8/int16 weights
    dequantized to float32)."""
    family: str
    variables: Mapping[str, torch.Tensor]

    def scalar(self, name: str, default=None):
        return scalar(self.variables, name, default)

    def num_layers(self, side: str) -> int:
        return num_layers(self.variables, side)

    def tensor(self, name: str) -> torch.Tensor:
        if name not in self.variables:
            raise ValueError(f"the CTranslate2 {self.family} model has no {name!r} variable")
        return self.variables[name]


def scalar(variables: Mapping[str, torch.Tensor], name: str, default=None):
    """A scalar variable as a Python number (`default` when absent; ValueError when absent without one)."""
    if name not in variables:
        if default is None:
            raise ValueError(f"the CTranslate2 model has no {name!r} variable")
        return default
    value = variables[name].reshape(-1)[0]
    return value.item() if value.is_floating_point() else int(value)


def num_layers(variables: Mapping[str, torch.Tensor], side: str) -> int:
    indices = {int(m.group(2)) for m in map(_LAYER_RE.match, variables) if m and m.group(1) == side}
    if indices != set(range(len(indices))):
        raise ValueError(f"{side} layer indices are not contiguous: {sorted(indices)}")
    return len(indices)


def resolve_variables(variables: Dict[str, torch.Tensor], aliases: Dict[str, str]) -> Dict[str, torch.Tensor]:
    """Variables with int8/int16 weights dequantized, then every alias (CTranslate2 stores equal tensors once)
    filled in with its target. Dequantizing comes first: an alias never has a scale of its own."""
    resolved = dequantize(variables)
    for alias, target in aliases.items():
        if target not in resolved:
            raise ValueError(f"CTranslate2 alias {alias!r} points to the missing variable {target!r}")
        resolved[alias] = resolved[target]
    return resolved


def marian_sinusoid(rows: int, dim: int) -> torch.Tensor:
    """The Marian/Pegasus position table: sin of the even frequencies in the first half, cos in the second."""
    position = torch.arange(rows, dtype=torch.float64)[:, None]
    inv_freq = torch.pow(10000.0, -2 * torch.arange(dim // 2, dtype=torch.float64) / dim)
    return torch.cat([torch.sin(position * inv_freq), torch.cos(position * inv_freq)], dim=1).float()


def fairseq_sinusoid(rows: int, dim: int, offset: int = 2) -> torch.Tensor:
    """The M2M100/NLLB position table (fairseq's), rows from position `offset` on, as CTranslate2 stores it."""
    half = dim // 2
    inv_freq = torch.exp(torch.arange(half, dtype=torch.float64) * -(math.log(10000.0) / (half - 1)))
    position = torch.arange(offset, offset + rows, dtype=torch.float64)[:, None]
    table = torch.cat([torch.sin(position * inv_freq), torch.cos(position * inv_freq)], dim=1)
    if dim % 2:
        table = torch.cat([table, torch.zeros(rows, 1, dtype=torch.float64)], dim=1)
    return table.float()


def position_kind(table: torch.Tensor) -> str:
    """"marian", "fairseq" (a sinusoid, recomputed by HF) or "learned" (a trained table, kept as weights)."""
    rows, dim = table.shape
    table = table.float()
    for kind, reference in (("marian", marian_sinusoid), ("fairseq", fairseq_sinusoid)):
        if torch.allclose(table, reference(rows, dim), atol=2e-3):
            return kind
    return "learned"


def _refuse_unsupported(variables: Mapping[str, torch.Tensor]) -> None:
    for name, expected in _UNSUPPORTED_SCALARS.items():
        if name in variables and scalar(variables, name) != expected:
            raise ValueError(f"CTranslate2 TransformerSpec with {name} = {scalar(variables, name)} is not supported")
    odd = sorted({part for name in variables for part in _UNSUPPORTED_NAMES if part in name})
    if odd:
        raise ValueError(f"CTranslate2 TransformerSpec uses {odd}, which no supported family "
                         f"({', '.join(FAMILIES)}) has")


def _t5_family(variables: Mapping[str, torch.Tensor]) -> str:
    """"t5" when later layers reuse layer 0's relative attention bias (stored as aliases), "umt5" when each
    layer has its own."""
    first = variables["encoder/layer_0/self_attention/relative_attention_bias"]
    later = [variables.get(f"encoder/layer_{i}/self_attention/relative_attention_bias")
             for i in range(1, num_layers(variables, "encoder"))]
    return "t5" if all(bias is None or torch.equal(bias, first) for bias in later) else "umt5"


def classify(variables: Mapping[str, torch.Tensor]) -> str:
    """The family of a TransformerSpec's variables (aliases resolved); ValueError naming the features when it
    matches no supported family."""
    _refuse_unsupported(variables)
    if "encoder/layer_0/self_attention/relative_attention_bias" in variables:
        return _t5_family(variables)
    for name in ("encoder/embeddings_0/weight", "decoder/embeddings/weight", "encoder/position_encodings/encodings",
                 "decoder/position_encodings/encodings"):
        if name not in variables:
            raise ValueError(f"CTranslate2 TransformerSpec without {name!r}: not an encoder/decoder text model of "
                             f"a supported family ({', '.join(FAMILIES)})")
    pre_norm = bool(scalar(variables, "encoder/pre_norm", 1))
    embedding_norm = "encoder/layernorm_embedding/gamma" in variables
    zero_start = bool(scalar(variables, "decoder/start_from_zero_embedding", 0))
    positions = position_kind(variables["encoder/position_encodings/encodings"])
    final_norm = "encoder/layer_norm/gamma" in variables
    features = (pre_norm, embedding_norm, zero_start, positions, final_norm)
    known = {(False, True, False, "learned", False): "bart", (True, True, False, "learned", True): "mbart",
             (False, False, True, "marian", False): "marian", (True, False, False, "fairseq", True): "m2m100",
             (True, False, False, "marian", True): "pegasus"}
    if features in known:
        return known[features]
    raise ValueError(f"CTranslate2 TransformerSpec with pre_norm={pre_norm}, layernorm_embedding={embedding_norm}, "
                     f"start_from_zero_embedding={zero_start}, {positions} positions, final layer norm={final_norm} "
                     f"matches no supported family ({', '.join(FAMILIES)})")


def read_text_spec(variables: Dict[str, torch.Tensor], aliases: Dict[str, str]) -> TextSpec:
    resolved = resolve_variables(variables, aliases)
    return TextSpec(classify(resolved), resolved)
