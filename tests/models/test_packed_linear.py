"""Packed float32 linear layers (models/packed_linear.py: native panels or oneDNN's reordered weight) against
F.linear, and where they are installed."""
import pytest
import torch
import torch.nn.functional as F
from hf_reference import build_tiny_model
from t5_reference import build_tiny_t5
from torch import nn

from seq2seq_engine.kernels.native_linear import PANEL_ACTIVATIONS, PANEL_WIDTH, panel_linear_available
from seq2seq_engine.model_loader.loader import load_model
from seq2seq_engine.models.packed_linear import (ONEDNN_ACTIVATIONS, PackedLinear, decode_step_linears, float32_packing,
                                                 linear_then_activation, onednn_linear_available, pack_linears,
                                                 pack_logits_head, packed_linear_available)
from seq2seq_engine.models.utils import get_activation

pytestmark = pytest.mark.skipif(not packed_linear_available(), reason="neither the panel kernel nor oneDNN here")
# both packings, each where it is available
LAYOUTS = [pytest.param(True, id="panels", marks=pytest.mark.skipif(not panel_linear_available(),
                                                                    reason="the panel kernel did not build here")),
           pytest.param(False, id="onednn", marks=pytest.mark.skipif(not onednn_linear_available(),
                                                                     reason="torch built without oneDNN"))]


def _randn(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _packed_numel(layer, weight):
    """Elements the packed copy of `weight` holds: oneDNN's reorder keeps the size, panels pad to 32 columns."""
    out_features, in_features = weight.shape
    return -(-out_features // PANEL_WIDTH) * PANEL_WIDTH * in_features if layer.panels else weight.numel()


@pytest.mark.parametrize("panels", LAYOUTS)
@pytest.mark.parametrize("rows", [1, 7, 130])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_f_linear(rows, bias, panels):
    weight, x = _randn(0, 3001, 96) * 0.1, _randn(1, rows, 96)
    b = _randn(2, 3001) if bias else None
    layer = PackedLinear(weight, b, panels=panels)
    torch.testing.assert_close(layer(x), F.linear(x, weight, b), rtol=1e-5, atol=1e-5)
    assert layer(x.view(rows, 1, 96)).shape == (rows, 1, 3001)
    assert layer(x[:0]).shape == (0, 3001)


@pytest.mark.parametrize("panels", LAYOUTS)
@pytest.mark.parametrize("keep_weight", [False, True])
@pytest.mark.parametrize("activation", [None, *ONEDNN_ACTIVATIONS])
def test_packed_linear_adds_the_addend_and_applies_the_activation(activation, keep_weight, panels):
    weight, bias, addend, x = _randn(0, 300, 40), _randn(1, 300), _randn(2, 1, 300), _randn(3, 9, 40)
    layer = PackedLinear(weight, bias, keep_weight=keep_weight, panels=panels)
    expected = F.linear(x, weight, bias) + addend
    expected = expected if activation is None else get_activation(activation)(expected)
    torch.testing.assert_close(layer(x, addend=addend, activation=activation), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)   # bias left as it was
    with pytest.raises(TypeError, match=r"float32 CPU input \[\.\.\., 40\], got torch.float64"):
        layer(x.double(), addend=addend, activation=activation)


@pytest.mark.parametrize("activation", ["gelu", "silu", "gelu_new", "quick_gelu"])
@pytest.mark.parametrize("packed", [False, True])
def test_linear_then_activation(activation, packed):
    """A packed layer applies the activations it knows itself (inside oneDNN's pass on that path)."""
    weight, bias, x = _randn(0, 64, 16), _randn(1, 64), _randn(2, 5, 16)
    layer = nn.Linear(16, 64)
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(bias)
    calls = []

    def activation_fn(t):
        calls.append(t.shape)
        return get_activation(activation)(t)
    expected = get_activation(activation)(F.linear(x, weight, bias))
    if packed:
        layer = PackedLinear(weight, bias, keep_weight=False)
    torch.testing.assert_close(linear_then_activation(layer, activation, activation_fn, x), expected,
                               rtol=1e-5, atol=1e-5)
    fused = packed and activation in ONEDNN_ACTIVATIONS
    assert calls == ([] if fused else [(5, 64)])     # the layer applied it, or the function did


def test_both_packings_fuse_the_same_activations():
    """linear_then_activation asks a packed layer for ONEDNN_ACTIVATIONS whichever packing it has."""
    assert set(PANEL_ACTIVATIONS) == set(ONEDNN_ACTIVATIONS)


def test_packed_linear_refuses_a_weight_it_cannot_pack():
    with pytest.raises(ValueError, match="float32"):
        PackedLinear(torch.ones(4, 4, dtype=torch.bfloat16))
    if not panel_linear_available():
        with pytest.raises(ValueError, match="panel linear kernel is not available"):
            PackedLinear(torch.ones(4, 4), panels=True)


class _Head(nn.Module):
    """The BART-family hooks pack_logits_head uses: lm_head or a tied weight, and set_lm_head."""

    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.lm_head = None if tied else nn.Linear(8, 50, bias=False)

    def tied_lm_head_weight(self):
        return self.embed.weight if self.lm_head is None else None

    def set_lm_head(self, head):
        self.lm_head = head


@pytest.mark.parametrize("panels", LAYOUTS)
def test_packed_linear_refuses_other_inputs_and_may_drop_its_weight(panels):
    weight = _randn(0, 6, 5)
    layer = PackedLinear(weight, keep_weight=False, panels=panels)
    assert layer.weight is None and layer.packed_weight.numel() == _packed_numel(layer, weight)
    torch.testing.assert_close(layer(_randn(1, 3, 5)), F.linear(_randn(1, 3, 5), weight), rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match=r"float32 CPU input \[\.\.\., 5\], got torch.bfloat16"):
        layer(_randn(1, 3, 5).bfloat16())
    with pytest.raises(TypeError, match=r"\[\.\.\., 5\], got torch.float32 \(3, 4\)"):
        layer(_randn(1, 3, 4))


@pytest.mark.parametrize("tied", [False, True])
def test_pack_logits_head_replaces_the_head_with_the_same_weight(tied):
    model = _Head(tied)
    weight = model.embed.weight if tied else model.lm_head.weight
    assert pack_logits_head(model)
    assert isinstance(model.lm_head, PackedLinear)
    if tied:    # the embedding matrix stays shared; an own head's plain weight is dropped for the packed copy
        assert model.lm_head.weight.data_ptr() == weight.data_ptr()
    else:
        assert model.lm_head.weight is None
    x = _randn(3, 4, 8)
    torch.testing.assert_close(model.lm_head(x), F.linear(x, weight), rtol=1e-5, atol=1e-5)
    assert not pack_logits_head(nn.Linear(3, 3))        # no set_lm_head: not a BART-family model


def test_pack_linears_replaces_float32_linears_only():
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Sequential(nn.Linear(7, 3, bias=False)),
                          nn.Linear(3, 2).bfloat16())
    x = _randn(4, 6, 5)
    expected = model[:3](x)
    assert pack_linears(model) == 2
    assert [type(m).__name__ for m in (model[0], model[2][0], model[3])] == ["PackedLinear", "PackedLinear", "Linear"]
    assert model[0].bias is not None and model[2][0].bias is None
    torch.testing.assert_close(model[:3](x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["bart", "whisper", "llama"])
def test_load_model_packs_every_float32_linear_in_place_of_its_weight(arch, tmp_path, monkeypatch):
    """Every nn.Linear of a float32 model becomes a PackedLinear whose packed copy replaces the weight (no second
    copy kept) and computes what the unpacked layer computes."""
    model_dir, _ = build_tiny_model(arch, tmp_path)
    packed, _ = load_model(model_dir)
    packing = {step: float32_packing(decode_step=step) for step in (False, True)}
    monkeypatch.setenv("SEQ2SEQ_ENGINE_PACKED_LINEAR", "0")     # the switch back to F.linear
    plain, _ = load_model(model_dir)
    assert not [name for name, m in packed.named_modules() if isinstance(m, nn.Linear)]
    linears = {name: m for name, m in plain.named_modules() if isinstance(m, nn.Linear)}
    assert len(linears) > 4
    for name, linear in linears.items():
        layer = packed.get_submodule(name)
        assert isinstance(layer, PackedLinear) and layer.weight is None, name
        decode_step = arch != "llama" and "decoder" in name.split(".") and name.split(".")[-1] != "kv_proj"
        assert layer.panels == (packing[decode_step] == "panels"), name
        assert layer.packed_weight.numel() == _packed_numel(layer, linear.weight), name
        x = _randn(5, 3, linear.in_features)
        torch.testing.assert_close(layer(x), linear(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["bart", "whisper", "t5", "llama"])
def test_decode_step_linears_are_the_decoders_but_its_cross_attention_kv(arch, tmp_path, monkeypatch):
    """The linears that run once per decode step: a decoder's self-attention, cross-attention query and output,
    feed-forward; not the encoder's, not the cross-attention K/V projections (encoder rows); none in a
    decoder-only model, whose layers also prefill long prompts."""
    model_dir = build_tiny_t5("t5", tmp_path)[0] if arch == "t5" else build_tiny_model(arch, tmp_path)[0]
    monkeypatch.setenv("SEQ2SEQ_ENGINE_PACKED_LINEAR", "0")
    model, _ = load_model(model_dir)
    found = decode_step_linears(model)
    names = {name for name, m in model.named_modules() if id(m) in found}
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if arch == "llama":
        assert not names
        return
    in_decoder = [name for name in linears if "decoder" in name.split(".")]
    cross_kv = [name for name in in_decoder if name.split(".")[-1] in ("kv_proj", "kv")]
    assert names == set(in_decoder) - set(cross_kv) and len(names) >= 8 and cross_kv
    assert any(".encoder." in f".{name}." for name in linears)


@pytest.mark.parametrize("panels", LAYOUTS)
@pytest.mark.parametrize("rows", [1, 9, 70])
def test_bfloat16_weights_compute_the_float32_layer_of_the_rounded_weight(rows, panels):
    """weight_dtype=bfloat16 rounds the weight once; the panels keep it in bfloat16 (half the bytes) and widen it
    exactly, so the output is the float32 layer's on the rounded weight, bit for bit."""
    weight, bias, x = _randn(0, 333, 70) * 0.1, _randn(1, 333), _randn(2, rows, 70)
    layer = PackedLinear(weight, bias, panels=panels, weight_dtype=torch.bfloat16)
    rounded = PackedLinear(weight.to(torch.bfloat16).float(), bias, panels=panels)
    assert torch.equal(layer(x, activation="gelu"), rounded(x, activation="gelu"))
    assert layer.packed_weight.dtype == (torch.bfloat16 if panels else torch.float32)
    assert "weights bfloat16" in repr(layer)
    torch.testing.assert_close(layer(x), F.linear(x, weight.to(torch.bfloat16).float(), bias), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="float32 or bfloat16 weights, not torch.float16"):
        PackedLinear(weight, panels=panels, weight_dtype=torch.float16)
