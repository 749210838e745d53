"""quantization="int8": Int8Linear against a plain-torch reference of its dequantized weights, weight quantization,
model conversion (fused projections, tied heads), option validation and the engine on tiny random models."""
import math

import pytest
import torch
import torch.nn.functional as F
from hf_reference import build_tiny_model

from seq2seq_engine.config import ModelConfig
from seq2seq_engine.kernels.native_int8 import int8_linear_available
from seq2seq_engine.models.int8 import (Int8Embedding, Int8Linear, activations_need_reduced_range,
                                        int8_unsupported_reason, quantize_weight)
from seq2seq_engine.models.packed_linear import PackedLinear, linear_then_activation
from seq2seq_engine.platforms import current_platform

pytestmark = pytest.mark.skipif(int8_unsupported_reason("cpu") is not None, reason="no fbgemm in this torch build")
NEEDS_NATIVE_INT8 = pytest.mark.skipif(not int8_linear_available(), reason="the native int8 kernel did not build here")
# fbgemm without VNNI adds pairs of u8 x s8 products in int16 with saturation: 8-bit activations overflow there, which
# is why the engine quantizes them to 7 bits on such CPUs (activations_need_reduced_range).
NEEDS_FBGEMM_VNNI = pytest.mark.skipif(activations_need_reduced_range(),
                                       reason="fbgemm runs without VNNI here: 8-bit activations saturate")


def _random(shape, seed, scale=1.0):
    """Gaussian values plus an offset so that no entry is zero and inputs are not centred on 0."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=generator) + 0.3) * scale


def _activation_steps(x: torch.Tensor, reduce_range: bool, per_row: bool, native: bool = False) -> torch.Tensor:
    """The step of the grid each row of x is rounded to ([rows, 1]). The native kernel rounds each row to
    max |x_row| / 127. fbgemm rounds to uint8: the quantized tensor's range widened to include 0, over 255 levels
    (127 when reduced); per row, x is first divided by its row's max |x| and the output scaled back, so a row's
    step is its max |x| times the step of the divided tensor."""
    amax = x.abs().amax(dim=1, keepdim=True) if per_row else torch.ones(x.shape[0], 1)
    if native:
        return amax / 127
    scaled = x / amax
    low, high = min(scaled.min().item(), 0.0), max(scaled.max().item(), 0.0)
    return amax * (high - low) / (127 if reduce_range else 255)


# ------------------------------------------------------------------------------------------------ weights
def test_quantize_weight_is_symmetric_per_channel_within_half_a_step():
    weight = _random((48, 96), 0)
    weight[5] = 0.0                                   # an all-zero row gets scale 1, not a division by zero
    qweight, scale = quantize_weight(weight)
    assert qweight.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (48,)
    assert int(qweight.abs().max()) == 127 and bool((qweight[5] == 0).all()) and scale[5] == 1.0
    rows = [i for i in range(48) if i != 5]
    assert torch.equal(qweight[rows].abs().amax(dim=1), torch.full((47,), 127, dtype=torch.int8))
    error = (qweight.float() * scale[:, None] - weight).abs()
    assert bool((error <= scale[:, None] / 2 * (1 + 1e-6)).all())


# ------------------------------------------------------------------------------------------------ kernel
@pytest.mark.parametrize("native, per_row, reduce_range", [
    pytest.param(True, True, False, marks=NEEDS_NATIVE_INT8), pytest.param(False, True, False, marks=NEEDS_FBGEMM_VNNI),
    (False, True, True), pytest.param(False, False, False, marks=NEEDS_FBGEMM_VNNI), (False, False, True)])
@pytest.mark.parametrize("rows, k, n, bias", [(1, 64, 32, True), (37, 256, 96, True), (300, 510, 383, False)])
def test_int8_linear_matches_dequantized_reference_within_the_activation_rounding(rows, k, n, bias, native, per_row,
                                                                                  reduce_range):
    """y_int8 - x W_deq^T comes only from rounding x to its grid (step s of its row): each of the K products
    is off by at most s * |W_deq[n, k]| (half a step of rounding plus at most half a step from the zero point's
    rounding), so |error| <= s * ||W_deq[n]||_1 always. Independent rounding errors are uniform in +-s/2, so the
    error's RMS is close to s / sqrt(12) * ||W_deq[n]||_2, which also shows the activations really were quantized.
    The rows get scales 10^-2..10^2 apart: per row, each keeps its own precision."""
    weight, x = _random((n, k), 1, k ** -0.5), _random((rows, k), 2)
    x = x * torch.logspace(-2, 2, rows)[:, None] if rows > 1 else x
    b = _random((n,), 3) if bias else None
    layer = Int8Linear(weight, b, reduce_range=reduce_range, per_row=per_row, native=native)
    assert layer.weight.dtype == torch.int8 and layer.reduce_range is reduce_range and layer.native is native
    assert torch.equal(layer.weight, quantize_weight(weight)[0])
    assert all(buffer.dtype != torch.int8 for buffer in layer.buffers())  # one int8 copy: the kernel's packed one
    w_deq = layer.dequantized_weight()
    reference = F.linear(x, w_deq, b)
    with torch.inference_mode():
        out = layer(x)
    steps = _activation_steps(x, reduce_range, per_row, native)
    error = (out - reference).abs()
    bound = steps * w_deq.abs().sum(dim=1) + 1e-5 * reference.abs().amax(dim=1, keepdim=True)
    assert bool((error <= bound).all()), float((error - bound).max())
    if rows * n >= 1000:
        expected_rms = (steps / math.sqrt(12) * w_deq.norm(dim=1)).pow(2).mean().sqrt()
        assert 0.5 * expected_rms < error.pow(2).mean().sqrt() < 1.5 * expected_rms


def test_int8_linear_is_close_to_float_and_keeps_leading_dimensions():
    weight, b = _random((64, 128), 4, 128 ** -0.5), _random((64,), 5)
    x = _random((3, 5, 128), 6)
    layer = Int8Linear(weight, b)
    out = layer(x)
    assert out.shape == (3, 5, 64) and out.dtype == torch.float32
    reference = F.linear(x, weight, b)
    assert (out - reference).abs().max() < 0.03 * reference.abs().max()
    assert layer(x[:0]).shape == (0, 5, 64) and layer(x.reshape(15, 128)[:0]).shape == (0, 64)
    with pytest.raises(TypeError, match="float32"):
        layer(x.bfloat16())


@pytest.mark.parametrize("native, per_row", [pytest.param(True, True, marks=NEEDS_NATIVE_INT8), (False, True),
                                             (False, False)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("addend_rows", [1, 9])
def test_int8_linear_adds_an_addend_in_its_output_pass(native, per_row, bias, addend_rows):
    weight, x = _random((300, 64), 7, 64 ** -0.5), _random((9, 64), 8)
    layer = Int8Linear(weight, _random((300,), 9) if bias else None, per_row=per_row, native=native)
    addend = _random((addend_rows, 300), 10)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x, addend=addend), layer(x) + addend, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("native", [pytest.param(True, marks=NEEDS_NATIVE_INT8), False])
@pytest.mark.parametrize("activation", ["relu", "silu", "swish", "gelu"])
def test_int8_linear_applies_an_activation_after_the_bias(native, activation):
    """On the native kernel the activation runs inside its pass (fuses_activations), on fbgemm after it: the same
    function of the same output either way, as linear_then_activation asks of a layer that fuses."""
    weight, x, b = _random((70, 40), 11, 40 ** -0.5), _random((10, 40), 12), _random((70,), 13)
    layer = Int8Linear(weight, b, native=native)
    assert layer.fuses_activations is native
    activation_fn = {"relu": F.relu, "silu": F.silu, "swish": F.silu, "gelu": F.gelu}[activation]
    with torch.inference_mode():
        plain = layer(x)
        torch.testing.assert_close(layer(x, activation=activation), activation_fn(plain), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(linear_then_activation(layer, activation, activation_fn, x), activation_fn(plain),
                                   rtol=1e-5, atol=1e-6)


def test_native_int8_needs_per_row_scales():
    weight = _random((8, 8), 14)
    with pytest.raises(ValueError, match="per row"):
        Int8Linear(weight, per_row=False, native=True)
    assert not Int8Linear(weight, per_row=False).native


@NEEDS_NATIVE_INT8
def test_native_int8_refuses_a_per_row_addend_with_an_activation():
    """A [rows, N] addend is added after the kernel, so an activation inside the kernel would come before it."""
    layer, x = Int8Linear(_random((30, 16), 15), native=True), _random((4, 16), 16)
    with pytest.raises(ValueError, match="per-row addend and an activation"):
        layer(x, addend=_random((4, 30), 17), activation="relu")


def test_reduced_range_follows_vnni_and_a_forced_fbgemm_isa(monkeypatch):
    monkeypatch.setenv("FBGEMM_ENABLE_INSTRUCTIONS", "AVX2")
    assert activations_need_reduced_range()
    monkeypatch.delenv("FBGEMM_ENABLE_INSTRUCTIONS")
    assert activations_need_reduced_range() is (current_platform().int8_dot != "avx512_vnni")


# ------------------------------------------------------------------------------------------------ models
@pytest.mark.parametrize("arch, head", [("whisper", "proj_out"), ("bart", "lm_head"), ("llama", "lm_head")])
def test_load_model_int8_replaces_every_linear_and_the_tied_head(arch, head, tmp_path):
    from seq2seq_engine.model_loader.loader import load_model
    model_dir, _ = build_tiny_model(arch, tmp_path)
    model, _ = load_model(model_dir, quantization="int8")
    float_model, _ = load_model(model_dir)
    assert not [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    int8_layers = {name for name, m in model.named_modules() if isinstance(m, Int8Linear)}
    float_layers = {name for name, m in float_model.named_modules() if isinstance(m, (torch.nn.Linear, PackedLinear))}
    assert len(float_layers) > 4 and float_layers <= int8_layers and head in int8_layers
    fused = [name for name in int8_layers if name.endswith("qkv_proj")]
    assert fused and all(model.get_submodule(n).out_features == 3 * model.get_submodule(n).in_features
                         for n in fused if arch != "llama")
    hidden = _random((4, model.get_submodule(head).in_features), 7)
    logits, float_logits = model.compute_logits(hidden), float_model.compute_logits(hidden)
    assert (logits - float_logits).abs().max() < 0.05 * float_logits.abs().max()
    tables = {name: m for name, m in model.named_modules(remove_duplicate=False) if isinstance(m, Int8Embedding)}
    assert bool(tables) == (arch != "llama")   # tied heads (Whisper, BART): the lookup reads int8 rows too
    for name, table in tables.items():
        float_table = float_model.get_submodule(name).weight
        ids = torch.tensor([[0, 3], [float_table.shape[0] - 1, 7]])
        step = float_table.abs().amax(dim=1) / 127
        assert table(ids).shape == (2, 2, float_table.shape[1]) and table.qweight.dtype == torch.int8
        assert ((table(ids) - float_table[ids]).abs() <= step[ids].unsqueeze(-1) / 2 + 1e-7).all()


def test_int8_option_is_validated():
    base = dict(model="m", vocab_size=10, max_target_positions=8, is_encoder_decoder=False)
    assert ModelConfig(**base, quantization="int8").quantization == "int8"
    with pytest.raises(ValueError, match=r"^quantization must be None or 'int8', got 'int4'"):
        ModelConfig(**base, quantization="int4")
    with pytest.raises(ValueError, match=r"dtype must be 'float32', got 'bfloat16'"):
        ModelConfig(**base, dtype="bfloat16", quantization="int8")
    assert "CPU only" in int8_unsupported_reason("cuda")


def test_llm_rejects_int8_off_the_cpu(tmp_path):
    from seq2seq_engine import LLM
    model_dir, _ = build_tiny_model("gpt2", tmp_path)
    with pytest.raises(ValueError, match="runs on the CPU only"):
        LLM(model_dir, quantization="int8", device="cuda", skip_tokenizer_init=True)
    with pytest.raises(ValueError, match="^quantization must be None or 'int8'"):
        LLM(model_dir, quantization="fp8", skip_tokenizer_init=True)


@pytest.mark.parametrize("arch", ["bart", "llama"])
def test_llm_generates_with_int8_linears(arch, tmp_path):
    """The engine runs the int8 model end to end; on these random models the first greedy token matches float."""
    from seq2seq_engine import LLM, SamplingParams
    model_dir, _ = build_tiny_model(arch, tmp_path)
    prompt = {"prompt_token_ids": [5, 17, 42, 9, 77]}
    params = SamplingParams(max_tokens=6, temperature=0.0, logprobs=1)
    outputs = {}
    for quantization in (None, "int8"):
        llm = LLM(model_dir, quantization=quantization, skip_tokenizer_init=True, kv_cache_space_gb=0.01)
        outputs[quantization] = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
    model = llm.llm_engine.model_runner.model
    assert any(isinstance(m, Int8Linear) for m in model.modules())
    assert len(outputs["int8"].token_ids) == 6
    assert outputs["int8"].token_ids[0] == outputs[None].token_ids[0]


def test_an_outlier_row_keeps_the_other_rows_precise():
    """Whisper's decoder feeds some layers a row ~100x larger than the others (the language token's position):
    one scale for the whole input would leave the other rows a few levels; a scale per row keeps them at 8 bits."""
    weight, x = _random((96, 256), 8, 256 ** -0.5), _random((16, 256), 9)
    x[3] *= 150.0
    reference = F.linear(x, weight)
    normal = [i for i in range(16) if i != 3]

    reduced = activations_need_reduced_range()     # 7-bit activations on fbgemm without VNNI: twice the step

    def normal_rows_error(per_row, native=False):
        out = Int8Linear(weight, per_row=per_row, reduce_range=reduced and not native, native=native)(x)
        return ((out - reference)[normal].norm() / reference[normal].norm()).item()

    per_row_bound = 0.02 * (255 / 127 if reduced else 1)
    assert normal_rows_error(True) < per_row_bound < 0.2 < normal_rows_error(False)
    if int8_linear_available():
        assert normal_rows_error(True, native=True) < 0.02


def test_cli_quantization_flag(tmp_path, spm_bart_tokenizer):
    import json

    from hf_reference import build_tiny_bart_with_tokenizer

    from seq2seq_engine.entrypoints.cli import main
    model_dir, _ = build_tiny_bart_with_tokenizer(tmp_path, spm_bart_tokenizer, max_length=6)
    (tmp_path / "in.txt").write_text("the quick brown fox\nhello world\n", encoding="utf-8")
    out_path = tmp_path / "out.jsonl"
    assert main(["generate", "--model", model_dir, "--input", str(tmp_path / "in.txt"), "--output", str(out_path),
                 "--quantization", "int8", "--quiet", "--kv-cache-space-gb", "0.05"]) == 0
    records = [json.loads(line) for line in out_path.read_text(encoding="utf-8").splitlines()]
    assert [r["index"] for r in records] == [0, 1] and all(r["token_ids"] for r in records)
    with pytest.raises(SystemExit):
        main(["generate", "--model", model_dir, "--input", str(tmp_path / "in.txt"), "--quantization", "int4"])


def test_kv_cache_dtype_defaults_to_bfloat16_for_int8_and_is_validated(tmp_path):
    from seq2seq_engine import LLM
    model_dir, _ = build_tiny_model("bart", tmp_path)

    def cache_dtype(**kwargs):
        llm = LLM(model_dir, skip_tokenizer_init=True, kv_cache_space_gb=0.01, **kwargs)
        return llm.llm_engine.cache_engine.device_cache[0][0].dtype

    assert cache_dtype(quantization="int8") == torch.bfloat16
    assert cache_dtype(quantization="int8", kv_cache_dtype="float32") == torch.float32
    assert cache_dtype() == torch.float32 and cache_dtype(kv_cache_dtype="bfloat16") == torch.bfloat16
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be 'auto' or one of .*got 'int8'"):
        cache_dtype(kv_cache_dtype="int8")


def test_a_bfloat16_cache_under_a_float32_model_follows_float32(tmp_path, monkeypatch):
    """Chunked prefill reads the cached context back (bfloat16 widened to the query's float32); greedy tokens
    of a float32 model with a bfloat16 cache agree with an all-float32 run on most steps."""
    from seq2seq_engine import LLM, SamplingParams
    from seq2seq_engine.attention.backends import torch_backend
    gathered = []
    real_gather = torch_backend._gather_context

    def spy(kv_cache, *args):
        gathered.append(kv_cache[0].dtype)
        return real_gather(kv_cache, *args)

    monkeypatch.setattr(torch_backend, "_gather_context", spy)
    model_dir, _ = build_tiny_model("llama", tmp_path)
    prompts = [{"prompt_token_ids": [(7 * k + 3 * i) % 90 + 5 for k in range(40)]} for i in range(3)]
    params = SamplingParams(max_tokens=8, temperature=0.0)
    tokens = {}
    for kv_cache_dtype in ("float32", "bfloat16"):
        llm = LLM(model_dir, skip_tokenizer_init=True, kv_cache_space_gb=0.01, kv_cache_dtype=kv_cache_dtype,
                  enable_chunked_prefill=True, max_num_batched_tokens=16)
        tokens[kv_cache_dtype] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert torch.bfloat16 in gathered and torch.float32 in gathered
    pairs = [(a, b) for x, y in zip(tokens["float32"], tokens["bfloat16"]) for a, b in zip(x, y)]
    assert all(x[0] == y[0] for x, y in zip(tokens["float32"], tokens["bfloat16"]))
    assert sum(a == b for a, b in pairs) >= 0.75 * len(pairs)
