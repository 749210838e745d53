"""Device plumbing around the CUDA platform: Ray replicas reserving a GPU, swaps as runs of consecutive blocks (pinned
and asynchronous on a GPU), the sampler's one wait per step, Whisper's log-mel on the GPU."""
import types

import numpy as np
import pytest
import torch

from seq2seq_engine.audio.features import log_mel_spectrogram_batch
from seq2seq_engine.integrations import ray_jobs
from seq2seq_engine.integrations.ray_data import GenerateBatch, ReplicaConfig
from seq2seq_engine.kernels import swap_blocks
from seq2seq_engine.sampling.metadata import SamplingMetadata, make_generator
from seq2seq_engine.sampling.sampler import Sampler, SamplerOutput
from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.worker.cache_engine import CacheEngine, block_runs, copy_block_runs


@pytest.mark.parametrize("device, given, expected", [
    ("cuda", None, 1.0), ("cuda:1", None, 1.0), ("cpu", None, 0.0), ("auto", None, 0.0), (None, None, 0.0),
    ("cuda", 0.5, 0.5), ("cpu", 2, 2.0)])
def test_replicas_reserve_a_gpu_when_their_engines_run_on_cuda(device, given, expected):
    config = ReplicaConfig("model", {"device": device} if device else {})
    assert ray_jobs.RayJob(gpus_per_replica=given).replica_gpus(config) == expected


def test_gpus_per_replica_must_be_a_number_of_at_least_zero():
    for bad in (-1, "1", float("nan")):
        with pytest.raises(ValueError, match="gpus_per_replica must be a number >= 0"):
            ray_jobs.RayJob(gpus_per_replica=bad)


@pytest.mark.parametrize("device, num_gpus", [("cuda", 1.0), ("cpu", None)])
def test_the_map_asks_ray_for_the_replicas_gpus(device, num_gpus, monkeypatch):
    calls = []
    dataset = types.SimpleNamespace(map_batches=lambda *a, **kw: calls.append(kw) or dataset, iter_rows=lambda: [])
    fake_ray = types.SimpleNamespace(is_initialized=lambda: True, data=types.SimpleNamespace(
        from_items=lambda rows, **kw: dataset, ActorPoolStrategy=lambda size: ("pool", size)))
    monkeypatch.setattr(ray_jobs, "import_ray", lambda: fake_ray)
    job = ray_jobs.RayJob(num_replicas=3, cpus_per_replica=2.0)
    list(ray_jobs.run_rows(job, [{"prompt": "a"}], GenerateBatch, ReplicaConfig("m", {"device": device})))
    assert calls[0]["num_cpus"] == 2.0 and calls[0]["compute"] == ("pool", 3)
    assert calls[0].get("num_gpus") == num_gpus


def test_block_runs_cover_the_pairs_with_consecutive_runs():
    pairs = [(7, 2), (3, 9), (4, 10), (5, 11), (8, 3), (0, 0)]
    assert block_runs(pairs) == [(0, 0, 1), (3, 9, 3), (7, 2, 2)]
    assert block_runs([]) == []


def test_copying_block_runs_moves_what_swap_blocks_moves():
    generator = torch.Generator().manual_seed(0)
    src = torch.randn(12, 4, 2, 8, generator=generator)
    pairs = [(1, 5), (2, 6), (9, 0), (3, 7), (11, 1)]
    expected = torch.randn(8, 4, 2, 8, generator=generator)
    got = expected.clone()
    swap_blocks(src, expected, torch.tensor(pairs))
    copy_block_runs(src, got, block_runs(pairs), non_blocking=False)
    assert torch.equal(got, expected)
    with pytest.raises(ValueError, match="block layouts differ"):
        copy_block_runs(src, torch.zeros(8, 4, 2, 4), block_runs(pairs), non_blocking=False)


def test_a_cpu_output_goes_to_the_host_as_it_is():
    output = SamplerOutput(torch.tensor([3, 1]), torch.tensor([-0.5, -1.5]))
    assert output.to_host() is output


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("pairs", [[(0, 0)], [(1, 2), (2, 3), (5, 0)]], ids=["one", "runs"])
def test_pinned_swaps_round_trip_blocks_on_the_gpu(pairs):
    engine = CacheEngine(num_layers=2, num_kv_heads=2, head_size=8, block_size=4, num_gpu_blocks=8, num_cpu_blocks=6,
                         dtype=torch.bfloat16, device=torch.device("cuda"))
    assert engine.async_swaps and all(t.is_pinned() for kv in engine.cpu_cache for t in kv)
    for key, value in engine.device_cache:
        key.normal_()
        value.normal_()
    before = [(k.clone(), v.clone()) for k, v in engine.device_cache]
    engine.swap_out(pairs)
    engine.synchronize()
    for (key, value), (cpu_key, cpu_value) in zip(before, engine.cpu_cache):
        for src, dst in pairs:
            assert torch.equal(cpu_key[dst], key[src].cpu()) and torch.equal(cpu_value[dst], value[src].cpu())
    for key, value in engine.device_cache:   # overwritten right after the swap-out: stream order keeps the copy first
        key.zero_()
        value.zero_()
    engine.swap_in([(dst, src) for src, dst in pairs])
    for (key, value), (old_key, old_value) in zip(engine.device_cache, before):
        for src, _ in pairs:
            assert torch.equal(key[src], old_key[src]) and torch.equal(value[src], old_value[src])


def _rows(device):
    return [(SamplingParams(temperature=0.0, logprobs=2), None),
            (SamplingParams(temperature=0.8, top_p=0.9, seed=3), make_generator(3, device)),
            (SamplingParams(temperature=1.0, top_k=5), None),
            (SamplingParams(temperature=0.7, min_p=0.1), None)]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_gpu_sampling_step_waits_for_the_device_once():
    device = torch.device("cuda")
    logits = torch.randn(4, 3000, device=device)
    metadata = SamplingMetadata.build(_rows(device), device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")     # any implicit wait for the device raises
    try:
        output = Sampler()(logits, metadata)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    host = output.to_host()
    assert host.sampled_token_ids.device.type == "cpu" and host.topk_token_ids.device.type == "cpu"
    assert torch.equal(host.sampled_token_ids, output.sampled_token_ids.cpu())
    assert host.sampled_token_ids[0] == logits[0].argmax().item()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_whisper_log_mel_on_the_gpu_matches_the_cpus():
    rng = np.random.default_rng(0)
    audios = [rng.standard_normal(n).astype(np.float32) * 0.1 for n in (16000, 80000, 480000)]
    gpu = log_mel_spectrogram_batch(audios, n_mels=80, device="cuda")
    cpu = log_mel_spectrogram_batch(audios, n_mels=80, device="cpu")
    assert gpu.device.type == "cuda"
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-4, rtol=1e-4)
