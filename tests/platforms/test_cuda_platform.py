"""The CUDA platform's one decision (prefill by xformers or SDPA, paged kernels by Triton or torch) with the probes
made to succeed or fail, the one shared backend built from it, the kernels' dispatch following it, and the float16
refusal of T5 made before any device is touched."""
import logging
import sys

import pytest
import torch
from t5_reference import build_tiny_t5

from seq2seq_engine import platforms
from seq2seq_engine.attention.backends import backend_for, select_backend
from seq2seq_engine.attention.backends.cuda_backend import CudaAttentionBackend
from seq2seq_engine.attention.backends.torch_backend import TorchAttentionBackend
from seq2seq_engine.kernels import decode_attention
from seq2seq_engine.model_loader.loader import load_model
from seq2seq_engine.platforms import cuda
from seq2seq_engine.platforms.cuda import CudaPlatform


def _probe(works: bool, note: str):
    return lambda: (works, note)


@pytest.mark.parametrize("xformers_ok, triton_ok, prefill, paged", [
    (True, True, "xformers", "triton"), (False, True, "sdpa", "triton"),
    (True, False, "xformers", "torch"), (False, False, "sdpa", "torch")])
def test_the_platform_follows_its_probes_and_says_so(xformers_ok, triton_ok, prefill, paged, caplog):
    with caplog.at_level(logging.INFO, logger="seq2seq_engine"):
        platform = CudaPlatform.probe("NVIDIA H100", _probe(xformers_ok, "x-note"), _probe(triton_ok, "t-note"))
    assert (platform.prefill, platform.paged_kernels) == (prefill, paged)
    facts = platform.describe()
    assert facts["gpu"] == "NVIDIA H100" and facts["prefill"].startswith(prefill) and "x-note" in facts["prefill"]
    assert facts["paged kernels"].startswith(paged) and "t-note" in facts["paged kernels"]
    rows = dict(platform.kernel_rows())
    assert ("xformers" in rows["prefill attention"]) is xformers_ok
    assert ("triton" in rows["paged decode attention"]) is triton_ok
    assert any(f"prefill attention by {prefill}" in r.getMessage() and f"KV-cache writes by {paged}" in r.getMessage()
               for r in caplog.records)


def test_a_platform_refuses_unknown_kernel_names():
    with pytest.raises(ValueError, match="prefill must be"):
        CudaPlatform("gpu", prefill="flash")
    with pytest.raises(ValueError, match="paged_kernels must be"):
        CudaPlatform("gpu", paged_kernels="cuda")
    with pytest.raises(ValueError, match="prefill must be"):
        CudaAttentionBackend("flash")


def test_xformers_that_does_not_import_or_whose_ops_fail_leaves_prefill_to_sdpa(monkeypatch):
    monkeypatch.setitem(sys.modules, "xformers", None)       # `import xformers` raises ImportError
    works, note = cuda.probe_xformers()
    assert not works and "does not import" in note
    monkeypatch.undo()
    pytest.importorskip("xformers.ops.fmha")
    from xformers.ops import fmha

    def failing(*args, **kwargs):
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr(fmha, "memory_efficient_attention_forward", failing)
    monkeypatch.setattr(torch, "randn", lambda *shape, **kwargs: torch.ones(*shape, dtype=kwargs.get("dtype")))
    works, note = cuda.probe_xformers()
    assert not works and "do not run here" in note
    assert CudaPlatform.probe("gpu", cuda.probe_xformers, _probe(True, "")).prefill == "sdpa"


def test_triton_that_does_not_import_leaves_the_paged_kernels_to_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)
    works, note = cuda.probe_triton()
    assert not works and "triton is not usable" in note
    assert CudaPlatform.probe("gpu", _probe(True, ""), cuda.probe_triton).paged_kernels == "torch"


@pytest.fixture
def fake_cuda_platform(monkeypatch):
    """current_platform("cuda") built by a probe that counts its calls, on this CPU machine; caches cleared."""
    calls = []

    def probe(cls):
        calls.append(1)
        return CudaPlatform("fake GPU", "xformers", "triton")

    monkeypatch.setattr(CudaPlatform, "probe", classmethod(probe))
    caches = (platforms.current_platform, backend_for, decode_attention.load_triton_decode)
    for cached in caches:
        cached.cache_clear()
    yield calls
    for cached in caches:
        cached.cache_clear()


def test_the_cuda_backend_is_built_once_from_the_platforms_decision(fake_cuda_platform):
    first = select_backend(torch.device("cuda"))
    assert isinstance(first, CudaAttentionBackend)
    assert (first.prefill, first.paged_kernels) == ("xformers", "triton")
    assert select_backend(torch.device("cuda", 0)) is first and select_backend("cuda") is first
    assert fake_cuda_platform == [1]                          # probed once, for the backend and everything else
    cpu = select_backend(torch.device("cpu"))
    assert type(cpu) is TorchAttentionBackend and select_backend("cpu") is cpu


def test_the_kernels_take_triton_only_where_the_platform_chose_it(fake_cuda_platform, monkeypatch):
    monkeypatch.setattr(decode_attention, "load_triton_decode", lambda: ("kernel", "bias"))
    assert decode_attention.triton_decode_kernels() == ("kernel", "bias")
    monkeypatch.setattr(CudaPlatform, "probe", classmethod(lambda cls: CudaPlatform("fake GPU")))
    platforms.current_platform.cache_clear()
    assert decode_attention.triton_decode_kernels() is None


def test_a_triton_module_that_does_not_load_leaves_decode_to_torch(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "seq2seq_engine.kernels.triton_attention", None)
    decode_attention.load_triton_decode.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="seq2seq_engine"):
            assert decode_attention.load_triton_decode() is None
    finally:
        decode_attention.load_triton_decode.cache_clear()
    assert any("runs the torch path" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_float16_is_refused_for_t5_whatever_the_device(tmp_path, device):
    model_dir, _ = build_tiny_t5("t5", tmp_path)
    with pytest.raises(ValueError, match="float16.*T5 activations overflow float16"):
        load_model(model_dir, torch.float16, device)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_this_gpus_platform_runs_what_its_probes_found():
    platform = CudaPlatform.probe()
    assert platform.device_name == torch.cuda.get_device_name()
    assert (platform.prefill == "xformers") is cuda.probe_xformers()[0]
    assert (platform.paged_kernels == "triton") is cuda.probe_triton()[0]


def test_an_fp8_kv_cache_is_a_cuda_feature_of_capability_8_9_and_later(tmp_path):
    """Refused on the CPU (by the config, before a model loads) and on older GPUs; accepted on a GPU beside any model
    dtype, where every other cache dtype must be the model's."""
    import dataclasses

    from transformers import AutoConfig

    from seq2seq_engine import LLM
    from seq2seq_engine.config import DeviceConfig, cache_torch_dtype
    from seq2seq_engine.engine.arg_utils import EngineArgs
    model_dir, _ = build_tiny_t5("t5", tmp_path)
    with pytest.raises(ValueError, match=r"kv_cache_dtype 'fp8' needs a CUDA GPU of compute capability 8.9"):
        LLM(model_dir, skip_tokenizer_init=True, device="cpu", kv_cache_dtype="fp8")
    hf_config = AutoConfig.from_pretrained(model_dir)
    for name in ("fp8", "fp8_e4m3"):
        args = EngineArgs(model=model_dir, dtype="bfloat16", kv_cache_dtype=name, device="cuda")
        assert cache_torch_dtype(args.create_engine_config(hf_config).kv_cache_dtype) == torch.float8_e4m3fn
    config = EngineArgs(model=model_dir, dtype="bfloat16", kv_cache_dtype="float32").create_engine_config(hf_config)
    with pytest.raises(ValueError, match="on a GPU the cache is the model's dtype or fp8"):
        dataclasses.replace(config, device_config=DeviceConfig("cuda"))
    with pytest.raises(ValueError, match="compute capability 8.9 or later; this one is 8.0"):
        cuda.require_fp8_cache_support("cuda", capability=(8, 0))
    cuda.require_fp8_cache_support("cuda", capability=(9, 0))
    with pytest.raises(ValueError, match="needs a CUDA device, got 'cpu'"):
        cuda.require_fp8_cache_support("cpu")
