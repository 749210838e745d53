"""quantization="int8" on real weights: whisper-base in int8 transcribes the bundled clear English clips as float32
does, through int8 Linear layers; and benchmarks/linear_kernels.py --quick (AVX-512 and the AVX2 stand-in)."""
import glob
import importlib.util
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import require_model

from seq2seq_engine.models.int8 import Int8Linear, int8_unsupported_reason
from seq2seq_engine.platforms import current_platform

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = [pytest.mark.skipif(int8_unsupported_reason("cpu") is not None, reason="no fbgemm in this torch build"),
              pytest.mark.usefixtures("one_thread")]


def _clips():
    spec = importlib.util.find_spec("pytest_audioeval")
    if spec is None:
        pytest.skip("pytest-audioeval (the speech clips) is not installed")
    folder = os.path.join(list(spec.submodule_search_locations)[0], "samples", "audio", "en")
    return {os.path.basename(p)[:-4]: p for p in sorted(glob.glob(os.path.join(folder, "*.wav")))}


@pytest.fixture(scope="module")
def whisper_base():
    return require_model("whisper-base")


def _transcribe(model_dir, quantization, clips):
    from seq2seq_engine import LLM
    llm = LLM(model_dir, quantization=quantization, kv_cache_space_gb=0.2, swap_space_gb=0.01)
    results = llm.transcribe(clips, language="en", use_tqdm=False)
    assert not [r.error for r in results if r.error]
    return llm, [r.text.strip() for r in results]


def test_whisper_base_int8_transcribes_clear_clips_as_float32(whisper_base):
    clips = _clips()
    clear = [clips["hello_world"], clips["quick_brown_fox"]]
    _, float_texts = _transcribe(whisper_base, None, clear)
    llm, int8_texts = _transcribe(whisper_base, "int8", clear)
    assert int8_texts == float_texts
    assert float_texts[1] == "The quick brown fox jumps over the lazy dog."
    model = llm.llm_engine.model_runner.model
    fused = model.model.encoder.layers[0].self_attn.qkv_proj
    assert isinstance(fused, Int8Linear) and fused.weight.dtype == torch.int8 and fused.out_features == 3 * 512
    assert isinstance(model.model.decoder.layers[5].fc2, Int8Linear)
    assert isinstance(model.proj_out, Int8Linear) and model.proj_out.out_features == 51865
    assert model.model.decoder.embed_tokens.weight.dtype == torch.float32   # the lookup stays float32
    # the encoder's self-attention computes in bfloat16 where that is native (the platform's choice), else float32
    expected = getattr(torch, current_platform("cpu").encoder_attention_dtype("int8"))
    assert {layer.self_attn.attn.compute_dtype for layer in model.model.encoder.layers} == {expected}
    assert {layer.self_attn.attn.compute_dtype for layer in model.model.decoder.layers} == {None}


def _bench(*args):
    result = subprocess.run([sys.executable, "-m", "benchmarks.linear_kernels", "--quick", "--threads", "1", *args],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.mark.parametrize("avx2", [False, True])
def test_int8_matmul_benchmark_quick(avx2):
    """Every candidate timed on both quick shapes; the engine's int8 kernels within 3% of float32 (random inputs:
    8-bit activations, ~1%; 7-bit on the AVX2 stand-in, ~2%). The native VNNI kernel is not built for the AVX2
    stand-in (the ISA caps reach the libraries, not the C compiler), so it runs in the AVX-512 case only."""
    from seq2seq_engine.kernels.native_int8 import int8_linear_available
    from seq2seq_engine.models.int8 import activations_need_reduced_range
    native = int8_linear_available() and not avx2
    candidates = ["float32", "bfloat16", "int8-fbgemm", "int8-fbgemm-pt"] + (["int8-panels"] if native else [])
    stdout = _bench(*(["--avx2"] if avx2 else []), "--candidates", ",".join(candidates))
    assert f"int8 activations reduced to 7 bits: {avx2 or activations_need_reduced_range()}" in stdout
    assert not avx2 or "'FBGEMM_ENABLE_INSTRUCTIONS': 'AVX2'" in stdout
    rows = [line for line in stdout.splitlines() if line.startswith("| quick |")]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        times = cells[3:3 + len(candidates)]
        assert all(float(ms) > 0 for ms in times) and all(c.endswith("x") for c in cells[3 + len(candidates):])
    errors = dict(re.findall(r"([\w-]+) ([0-9.]+)", stdout.split("largest relative error vs float32 over the "
                                                                 "shapes: ")[1]))
    assert float(errors["float32"]) == 0.0 and float(errors["bfloat16"]) < 0.01
    assert 0.001 < float(errors["int8-fbgemm"]) < 0.03
    if native:
        assert 0.001 < float(errors["int8-panels"]) < 0.03


def test_int8_matmul_benchmark_times_both_float32_packings_cold():
    """--cold evicts the caches before each call; both packed float32 candidates compute F.linear's result."""
    from seq2seq_engine.kernels.native_linear import panel_linear_available
    stdout = _bench("--cold", "--candidates", "float32,float32-onednn,float32-panels")
    assert "--cold" in next(line for line in stdout.splitlines() if line.startswith("argv:"))
    rows = [line for line in stdout.splitlines() if line.startswith("| quick |")]
    assert len(rows) == 2
    errors = dict(re.findall(r"([\w-]+) ([0-9.]+)", stdout.split("largest relative error vs float32 over the "
                                                                 "shapes: ")[1]))
    assert float(errors["float32-onednn"]) < 1e-5
    if panel_linear_available():
        assert float(errors["float32-panels"]) < 1e-5
    else:
        assert "float32-panels skipped" in stdout and "float32-panels" not in errors
