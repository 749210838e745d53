"""Whisper's teacher-forced alignment pass: finished windows' tokens through the decoder, alignment heads' scores."""
from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from seq2seq_engine.attention import AttentionMetadata
from seq2seq_engine.attention.bias import BlockDiagonalCausalMask, BlockDiagonalMask
from seq2seq_engine.attention.metadata import CrossAttentionMetadata, EncoderAttentionMetadata, SelfAttentionMetadata
from seq2seq_engine.models.encoder_decoder_utils import feed_forward

Head = Tuple[int, int]                                  # (decoder layer, head)
CrossKV = List[Tuple[torch.Tensor, torch.Tensor]]       # per decoder layer: cross keys and values [S, d]


def alignment_heads(hf_config: Any, generation_config: Mapping[str, Any]) -> List[Head]:
    """The model's alignment heads: generation_config.json's `alignment_heads` (HF layout, also written by the
    CTranslate2 conversion), else the config's, else every head of the last half of the decoder layers
    (openai-whisper's default)."""
    heads = generation_config.get("alignment_heads") or getattr(hf_config, "alignment_heads", None)
    if heads:
        return [(int(layer), int(head)) for layer, head in heads]
    layers, num_heads = hf_config.decoder_layers, hf_config.decoder_attention_heads
    return [(layer, head) for layer in range(layers // 2, layers) for head in range(num_heads)]


def prefill_metadata(query_lens: Sequence[int], key_lens: Optional[Sequence[int]], device: torch.device,
                     encoder: bool = False) -> AttentionMetadata:
    """Metadata of a step of prefills only that writes no cache: causal self-attention over `query_lens` blocks
    and cross-attention of each block to `key_lens` encoder rows (or, with `encoder`, the encoder's own)."""
    self_md = SelfAttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.long, device=device),
                                    prefill_bias=BlockDiagonalCausalMask.from_seqlens(query_lens),
                                    prefill_block_tables=None, decode_seq_lens=None, decode_block_tables=None)
    metadata = AttentionMetadata(num_prefills=len(query_lens), num_prefill_tokens=sum(query_lens),
                                 num_decode_tokens=0, self_attn=self_md)
    if encoder:
        metadata.encoder = EncoderAttentionMetadata(BlockDiagonalMask.from_seqlens(query_lens))
    if key_lens is not None:
        metadata.cross = CrossAttentionMetadata(BlockDiagonalMask.from_seqlens(query_lens, key_lens), None, None,
                                                None)
    return metadata


@torch.inference_mode()
def encoder_cross_kv(model: Any, features: torch.Tensor) -> CrossKV:
    """A window's cross K/V through the model's own layers: its encoder over log-mel `features` [n_mels, frames],
    then each decoder layer's kv_proj (what a request's prefill writes into its cross blocks)."""
    frames = model.model.encoder.max_source_positions
    metadata = prefill_metadata([frames], None, features.device, encoder=True)
    encoded = model.encode(metadata, encoder_features=features.unsqueeze(0))
    cross_kv = []
    for layer in model.model.decoder.layers:
        cross = layer.encoder_attn
        k, v = cross.kv_proj(encoded).split(cross.embed_dim, dim=-1)
        cross_kv.append((k, v))
    return cross_kv


def _cross_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, num_heads: int,
                     heads: Sequence[int]) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """One window's cross-attention: query [T, d] over its encoder rows' keys/values [S, d] (read in place, no
    copy). Returns (output [T, d], the scaled q·kᵀ of `heads` [len(heads), T, S] in float32, or None without
    heads: then the fused scaled_dot_product_attention runs)."""
    length, dim = query.shape
    head_size = dim // num_heads
    q = query.view(length, num_heads, head_size).transpose(0, 1)
    k, v = (t.to(query.dtype).view(-1, num_heads, head_size).transpose(0, 1) for t in (keys, values))
    if not heads:
        out = F.scaled_dot_product_attention(q, k, v)
        return out.transpose(0, 1).reshape(length, dim), None
    scores = (q @ k.transpose(-1, -2)) * head_size ** -0.5
    out = scores.softmax(dim=-1) @ v
    return out.transpose(0, 1).reshape(length, dim), scores[list(heads)].float()


@torch.inference_mode()
def aligned_decode(model: Any, token_ids: Sequence[Sequence[int]], cross_kv: Sequence[CrossKV],
                   heads: Sequence[Head]) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """Several windows teacher-forced in one flattened pass through the decoder's own layers (its linears, its
    self-attention over the block-diagonal causal mask), no KV cache written: window i's tokens `token_ids[i]`
    attend causally to each other and across to `cross_kv[i]` (each window's cross-attention apart, in place: the
    alignment heads' weights are wanted, which no attention kernel returns). Returns (final hidden states [total
    tokens, d], per window the scaled cross-attention scores of `heads` [len(heads), tokens, encoder rows],
    float32, softmax not applied): row r of a window is the query at its position r."""
    decoder = model.model.decoder
    device = decoder.embed_tokens.weight.device
    lengths = [len(ids) for ids in token_ids]
    ids = torch.tensor([t for window in token_ids for t in window], dtype=torch.long, device=device)
    positions = torch.cat([torch.arange(length, device=device) for length in lengths])
    metadata = prefill_metadata(lengths, None, device)
    bounds = metadata.self_attn.prefill_bias.q_seqinfo.intervals()
    hidden = decoder.embed_tokens(ids) + decoder.embed_positions(positions)
    wanted: List[dict] = [{} for _ in token_ids]
    num_heads = model.config.decoder_attention_heads
    for index, layer in enumerate(decoder.layers):
        hidden = hidden + layer.self_attn(layer.self_attn_layer_norm(hidden), None, metadata)
        cross = layer.encoder_attn
        query = cross.q_proj(layer.encoder_attn_layer_norm(hidden))
        layer_heads = [head for layer_index, head in heads if layer_index == index]
        attended = torch.empty_like(query)
        for window, (start, end) in enumerate(bounds):
            keys, values = cross_kv[window][index]
            attended[start:end], scores = _cross_attention(query[start:end], keys, values, num_heads, layer_heads)
            wanted[window].update(zip(((index, head) for head in layer_heads), scores if layer_heads else ()))
        hidden = hidden + cross.out_proj(attended)
        hidden = hidden + feed_forward(layer, layer.final_layer_norm(hidden))
    scores = [torch.stack([window[head] for head in heads]) for window in wanted]
    return decoder.layer_norm(hidden), scores
