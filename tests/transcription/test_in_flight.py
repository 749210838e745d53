"""The default number of windows a transcription keeps in the engine: KV bytes per window from the model's shape,
a budget, the bounds, and the bound holding during a real run."""
import math

import numpy as np

from seq2seq_engine.transcription.schedule.in_flight import (KV_BUDGET_BYTES, MAX_WINDOWS, default_windows_in_flight,
                                                             window_kv_bytes)

SR = 16000


def test_window_kv_bytes_counts_cross_blocks_once_and_self_blocks_per_beam(tiny_llm):
    engine = tiny_llm.llm_engine
    config = engine.model_runner.model.config
    layers, heads = config.decoder_layers, config.decoder_attention_heads
    head_size = config.d_model // heads
    block = engine.cache_config.block_size
    block_bytes = 2 * layers * block * heads * head_size * 4  # K and V, float32
    cross = math.ceil(config.max_source_positions / block)
    one_beam = math.ceil((224 + 4) / block)
    assert window_kv_bytes(engine, 224, 1) == (cross + one_beam) * block_bytes
    assert window_kv_bytes(engine, 224, 5) == (cross + 5 * one_beam) * block_bytes


def test_default_fits_the_budget_within_the_bounds(tiny_llm):
    engine = tiny_llm.llm_engine
    greedy, beams = default_windows_in_flight(engine, 224, 1), default_windows_in_flight(engine, 224, 5)
    assert 2 <= beams <= greedy <= MAX_WINDOWS
    model = engine.model_runner.model
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    budget = max(KV_BUDGET_BYTES, 2 * weights)
    for windows, beam in ((greedy, 1), (beams, 5)):
        assert windows == MAX_WINDOWS or windows * window_kv_bytes(engine, 224, beam) <= budget
        assert windows == MAX_WINDOWS or (windows + 1) * window_kv_bytes(engine, 224, beam) > budget


def test_a_long_input_never_has_more_than_the_default_requests_in_the_engine(tiny_dir, monkeypatch):
    from seq2seq_engine import LLM
    llm = LLM(tiny_dir, max_num_seqs=3, kv_cache_space_gb=0.2, swap_space_gb=0.01)  # fewer than the budget allows
    engine = llm.llm_engine
    assert default_windows_in_flight(engine, 8, 1) == 3
    most = [0]
    real_step = engine.step

    def step(**kwargs):
        most[0] = max(most[0], engine.get_num_unfinished_requests())
        return real_step(**kwargs)

    monkeypatch.setattr(engine, "step", step)
    noise = (0.05 * np.random.default_rng(0).standard_normal(200 * SR)).astype(np.float32)  # 7 windows
    (result,) = llm.transcribe((noise, SR), vad_filter=False, max_new_tokens=8, temperature=0.0,
                               use_tqdm=False)
    assert result.error is None and most[0] == 3
