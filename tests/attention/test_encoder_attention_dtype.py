"""An encoder self-attention layer set to compute in bfloat16 (int8 models where bf16 is native): its inputs are
rounded to bfloat16, the attention runs there and its output comes back in the model's dtype; other layers and
layers with a position bias are untouched."""
import types

import pytest
import torch

from seq2seq_engine.attention.bias import BlockDiagonalMask
from seq2seq_engine.attention.layer import Attention, compute_encoder_attention_in
from seq2seq_engine.attention.metadata import EncoderAttentionMetadata
from seq2seq_engine.attention.types import AttentionType
from seq2seq_engine.models.encoder_decoder_utils import EncoderLayer

HEADS, HEAD_SIZE, LENS = 8, 64, [300, 1500]


def _reference(query, key, value, scale):
    """Per sequence, in float64."""
    out, start = [], 0
    for length in LENS:
        q, k, v = (t[start:start + length].double().view(length, HEADS, HEAD_SIZE).transpose(0, 1)
                   for t in (query, key, value))
        out.append(((q @ k.transpose(1, 2) * scale).softmax(-1) @ v).transpose(0, 1).reshape(length, -1))
        start += length
    return torch.cat(out)


def test_a_bfloat16_encoder_layer_attends_over_rounded_inputs_and_returns_float32():
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(sum(LENS), HEADS * HEAD_SIZE, generator=generator) for _ in range(3))
    metadata = types.SimpleNamespace(encoder=EncoderAttentionMetadata(BlockDiagonalMask.from_seqlens(LENS)))
    layer = Attention(HEADS, HEAD_SIZE, HEAD_SIZE ** -0.5, attn_type=AttentionType.ENCODER)
    exact = layer(query, key, value, None, metadata)
    torch.testing.assert_close(exact, _reference(query, key, value, layer.scale).float(), atol=1e-5, rtol=1e-4)
    layer.compute_dtype = torch.bfloat16
    out = layer(query, key, value, None, metadata)
    assert out.dtype == torch.float32 and out.shape == exact.shape
    rounded = [t.to(torch.bfloat16).float() for t in (query, key, value)]
    expected = _reference(*rounded, layer.scale).to(torch.bfloat16).float()
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)  # bf16 accumulation and output rounding
    assert (out - exact).abs().max() > 1e-4  # it did compute in bfloat16
    assert (out - exact).abs().max() < 5e-2


@pytest.mark.parametrize("pre_norm", [True, False])
def test_only_encoder_self_attention_layers_are_set(pre_norm):
    encoder_layer = EncoderLayer(64, 4, 128, "gelu", pre_norm=pre_norm)
    decoder_attention = Attention(4, 16, 0.25, attn_type=AttentionType.DECODER)
    model = torch.nn.ModuleList([encoder_layer, decoder_attention])
    assert compute_encoder_attention_in(model, torch.bfloat16) == 1
    assert encoder_layer.self_attn.attn.compute_dtype == torch.bfloat16 and decoder_attention.compute_dtype is None
