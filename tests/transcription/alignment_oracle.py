"""The test oracle of the engine's alignment pass: one window's tokens through the Whisper decoder, in plain torch
(its modules read for their weights only, openai-whisper's find_alignment without a KV cache)."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

Head = Tuple[int, int]                                # (decoder layer, head)
CrossKV = List[Tuple[torch.Tensor, torch.Tensor]]     # per decoder layer: cross keys and values [S, d]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int, causal: bool = False,
            scores_wanted: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Multi-head attention over [T, d] / [S, d]; returns (output [T, d], scaled scores [heads, T, S] when
    scores_wanted (cross-attention only), else None: then the fused scaled_dot_product_attention runs)."""
    length, dim = q.shape
    head_size = dim // num_heads
    q = q.view(length, num_heads, head_size).transpose(0, 1)
    k = k.view(-1, num_heads, head_size).transpose(0, 1)
    v = v.view(-1, num_heads, head_size).transpose(0, 1)
    if not scores_wanted:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return out.transpose(0, 1).reshape(length, dim), None
    scores = (q @ k.transpose(-1, -2)) * head_size ** -0.5
    out = scores.softmax(dim=-1) @ v
    return out.transpose(0, 1).reshape(length, dim), scores


def _self_attention(module: Any, hidden: torch.Tensor, num_heads: int, causal: bool) -> torch.Tensor:
    q, k, v = module.qkv_proj(hidden).split(module.embed_dim, dim=-1)
    return module.out_proj(_attend(q, k, v, num_heads, causal)[0])


def _encode(encoder: Any, features: torch.Tensor, num_heads: int) -> torch.Tensor:
    weight = encoder.conv1.weight
    hidden = features.to(dtype=weight.dtype, device=weight.device).unsqueeze(0)
    hidden = F.gelu(encoder.conv2(F.gelu(encoder.conv1(hidden))))[0].transpose(0, 1)
    hidden = hidden + encoder.embed_positions.weight[:hidden.shape[0]]
    for layer in encoder.layers:
        hidden = hidden + _self_attention(layer.self_attn, layer.self_attn_layer_norm(hidden), num_heads, False)
        hidden = hidden + layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(hidden))))
    return encoder.layer_norm(hidden)


@torch.inference_mode()
def encoder_cross_kv(model: Any, features: torch.Tensor) -> CrossKV:
    """The window's cross K/V computed in plain torch: the encoder over log-mel `features` [n_mels, frames], then
    each decoder layer's kv_proj over its output (what the engine writes into a request's cross blocks)."""
    encoded = _encode(model.model.encoder, features, model.config.encoder_attention_heads)
    cross_kv = []
    for layer in model.model.decoder.layers:
        cross = layer.encoder_attn
        k, v = cross.kv_proj(encoded).split(cross.embed_dim, dim=-1)
        cross_kv.append((k, v))
    return cross_kv


def _decode(decoder: Any, token_ids: Sequence[int], cross_kv: CrossKV, num_heads: int,
            heads: Sequence[Head]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(final hidden states [T, d], the heads' cross-attention scores [len(heads), T, S])."""
    weight = decoder.embed_tokens.weight
    ids = torch.tensor(list(token_ids), dtype=torch.long, device=weight.device)
    hidden = decoder.embed_tokens(ids) + decoder.embed_positions.weight[:len(ids)]
    wanted = {}
    for index, layer in enumerate(decoder.layers):
        hidden = hidden + _self_attention(layer.self_attn, layer.self_attn_layer_norm(hidden), num_heads, True)
        cross = layer.encoder_attn
        k, v = (t.to(dtype=hidden.dtype, device=hidden.device) for t in cross_kv[index])
        layer_heads = [head for head in range(num_heads) if (index, head) in heads]
        out, scores = _attend(cross.q_proj(layer.encoder_attn_layer_norm(hidden)), k, v, num_heads,
                              scores_wanted=bool(layer_heads))
        hidden = hidden + cross.out_proj(out)
        hidden = hidden + layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(hidden))))
        wanted.update({(index, head): scores[head] for head in layer_heads})
    scores = torch.stack([wanted[head] for head in heads]).float()
    return decoder.layer_norm(hidden), scores


@torch.inference_mode()
def alignment_pass(model: Any, features: Optional[torch.Tensor], token_ids: Sequence[int], heads: Sequence[Head],
                   cross_kv: Optional[CrossKV] = None,
                   logit_rows: Optional[slice] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Run one window teacher-forced. model: the engine's WhisperForConditionalGeneration; features: log-mel
    [n_mels, frames], read only when `cross_kv` is None; token_ids: the decoder input (prompt + generated tokens);
    cross_kv: the window's cross K/V per decoder layer, else encoder_cross_kv computes them from the features.

    Returns (scores [len(heads), len(token_ids), encoder frames]: scaled q·kᵀ of the alignment heads, softmax
    not applied; logits [len(token_ids), vocab], float32, or only the rows `logit_rows` names: the LM head over
    the whole vocabulary is most of the pass). Row i is the query at input position i.
    """
    if cross_kv is None:
        cross_kv = encoder_cross_kv(model, features)
    hidden, scores = _decode(model.model.decoder, token_ids, cross_kv, model.config.decoder_attention_heads,
                             list(heads))
    return scores, model.compute_logits(hidden if logit_rows is None else hidden[logit_rows])
