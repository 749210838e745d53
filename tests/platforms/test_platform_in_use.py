"""The platform at work: the engine's start-up line, bfloat16 computed in float32 where the CPU has no native bf16,
and `seq2seq-engine env`'s report, on this machine and under an AVX2 cap."""
import logging
import os
import subprocess
import sys

import pytest
import torch
from hf_reference import build_tiny_model

from seq2seq_engine import LLM, SamplingParams
from seq2seq_engine.kernels.native_linear import panel_linear_available
from seq2seq_engine.models.packed_linear import PackedLinear
from seq2seq_engine.platforms import current_platform
from seq2seq_engine.platforms.cpu_policy import ISA_ENV

PROMPT = {"prompt_token_ids": [5, 17, 42, 9, 77]}


@pytest.fixture
def avx2_cap(monkeypatch):
    """The platform of this CPU capped at AVX2 for the test (the platform is built once per process)."""
    monkeypatch.setenv(ISA_ENV, "avx2")
    current_platform.cache_clear()
    yield
    monkeypatch.delenv(ISA_ENV)
    current_platform.cache_clear()


def _generate(model_dir, dtype, **kwargs):
    llm = LLM(model_dir, dtype=dtype, skip_tokenizer_init=True, kv_cache_space_gb=0.01, **kwargs)
    output = llm.generate([PROMPT], SamplingParams(max_tokens=5, temperature=0.0), use_tqdm=False)[0]
    return llm, output.outputs[0].token_ids


def _log_lines(caplog, capfd):
    """The engine's log lines, whether they went through pytest's capture or the package's own stderr handler."""
    return caplog.text.splitlines() + capfd.readouterr().err.splitlines()


def _platform_lines(lines):
    return [line[line.index("platform cpu:"):] for line in lines if "platform cpu:" in line]


def _bf16_exact_model(tmp_path):
    """A tiny BART whose every weight is a bfloat16 value, so rounding the weights to bfloat16 changes nothing."""
    model_dir, model = build_tiny_model("bart", tmp_path)
    model.to(torch.bfloat16).to(torch.float32).save_pretrained(model_dir)
    return model_dir


def test_bfloat16_keeps_bf16_linear_weights_and_computes_in_float32_without_native_bf16(
        tmp_path, avx2_cap, caplog, capfd):
    model_dir = _bf16_exact_model(tmp_path)
    with caplog.at_level(logging.INFO, logger="seq2seq_engine"):
        llm, tokens = _generate(model_dir, "bfloat16")
    lines = _log_lines(caplog, capfd)
    model = llm.llm_engine.model_runner.model
    assert {p.dtype for p in model.parameters()} <= {torch.float32}
    assert llm.llm_engine.kv_cache_dtype == torch.bfloat16        # the KV cache keeps what was asked for
    assert any("dtype bfloat16 has no native support on this CPU" in line for line in lines)
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert packed and all(m.weight_dtype == torch.bfloat16 for m in packed)
    if panel_linear_available():    # the panels hold the weights in bfloat16: half the bytes
        assert all(m.packed_weight.dtype == torch.bfloat16 for m in packed)
    # the panel kernel widens bf16 weights exactly, so a float32 run of the same (bf16-valued) weights over a
    # bfloat16 KV cache gives the same tokens
    assert tokens == _generate(model_dir, "float32", kv_cache_dtype="bfloat16")[1]
    line = _platform_lines(lines)[0]
    assert "kernel level avx2 (capped by SEQ2SEQ_ENGINE_CPU_ISA)" in line and "float32 linear, decode step:" in line


def test_the_start_up_line_names_this_machines_platform(tmp_path, caplog, capfd):
    model_dir, _ = build_tiny_model("llama", tmp_path)
    platform = current_platform()
    with caplog.at_level(logging.INFO, logger="seq2seq_engine"):
        llm, _ = _generate(model_dir, "bfloat16")
    lines = _platform_lines(_log_lines(caplog, capfd))
    assert lines and all(f"kernel level {platform.isa}" in line for line in lines)
    dtypes = {p.dtype for p in llm.llm_engine.model_runner.model.parameters()}
    assert dtypes == {torch.bfloat16 if platform.native_bf16 else torch.float32}


def _env_report(**env):
    command = [sys.executable, "-m", "seq2seq_engine.entrypoints.cli", "env"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_env_prints_machine_versions_environment_and_kernels():
    out = _env_report()
    for section in ("## platform: cpu", "## versions", "## environment", "## kernels"):
        assert section in out
    assert f"torch           {torch.__version__}" in out
    assert "float32 linear, decode step" in out and "int8 linear" in out and "paged decode attention" in out
    assert "LoRA shrink/expand (float32)" in out
    families = dict(line.split(None, 1) for line in out.split("## model families\n")[1].strip().splitlines())
    assert families["WhisperForConditionalGeneration"] == "LoRA adapters" and families["OPTForCausalLM"] == "no LoRA"
    assert sum(value == "LoRA adapters" for value in families.values()) == 10


def test_env_under_an_avx2_cap_reports_the_avx2_paths():
    out = _env_report(SEQ2SEQ_ENGINE_CPU_ISA="avx2")
    assert "kernel level          avx2 (capped by SEQ2SEQ_ENGINE_CPU_ISA)" in out
    assert "native march          x86-64-v3" in out
    assert "bfloat16 weights on the native panel kernel (avx2), computed in float32" in out
    assert "SEQ2SEQ_ENGINE_CPU_ISA      avx2" in out
    assert "paged decode attention            native (avx2)" in out or "torch gather" in out
