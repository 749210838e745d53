"""A request that makes its step fail is aborted alone (its output says why, its blocks come back); the other
requests of the step get exactly the outputs of a clean run (engine/step_isolation.py)."""
import pytest
import torch
from hf_reference import build_tiny_model

from seq2seq_engine import LLM, SamplingParams

POISON = 99          # an encoder token id the failing forward refuses
PROMPTS = [{"prompt_token_ids": [5, 17, 42, 9, 77]}, {"prompt_token_ids": [8, 33, 21]},
           {"prompt_token_ids": [12, 64, 7, 7, 30, 41]}]
PARAMS = [SamplingParams(max_tokens=8, temperature=0.0), SamplingParams(max_tokens=8, temperature=0.9, seed=3),
          SamplingParams(max_tokens=8, temperature=0.7, top_p=0.9)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model("bart", tmp_path_factory.mktemp("bart"))[0]


@pytest.fixture(scope="module")
def llm(model_dir):
    # The tests send the same prompts again: without the encoder cache every step runs its encoders (what the
    # failing forwards look at).
    return LLM(model_dir, skip_tokenizer_init=True, kv_cache_space_gb=0.01, enable_encoder_cache=False)


@pytest.fixture
def failing_forward(llm, monkeypatch):
    """The model raises on any step whose encoder input holds POISON (a stand-in for a request the model cannot
    run); `calls` counts the forwards."""
    model = llm.llm_engine.model_runner.model
    original, calls = model.forward, []

    def forward(*args, **kwargs):
        calls.append(1)
        encoder_ids = kwargs.get("encoder_input_ids")
        if encoder_ids is not None and bool((encoder_ids == POISON).any()):
            raise RuntimeError("poisoned input")
        return original(*args, **kwargs)
    monkeypatch.setattr(model, "forward", forward)
    return calls


def _pool_is_empty(llm):
    engine = llm.llm_engine
    manager, config = engine.scheduler.block_manager, engine.cache_config
    return (not engine.has_unfinished_requests() and manager.get_num_free_gpu_blocks() == config.num_gpu_blocks
            and manager.get_num_free_cpu_blocks() == config.num_cpu_blocks and not manager.block_tables
            and not manager.cross_block_tables and engine.model_runner.input_batch.num_live_rows == 0)


def _tokens(outputs):
    return [[list(c.token_ids) for c in o.outputs] for o in outputs]


def test_the_failing_request_is_aborted_and_the_others_get_a_clean_runs_outputs(llm, failing_forward):
    torch.manual_seed(0)
    clean = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    poisoned = {"prompt_token_ids": [4, POISON, 6]}
    torch.manual_seed(0)
    outputs = llm.generate(PROMPTS[:1] + [poisoned] + PROMPTS[1:], PARAMS[:1] + [PARAMS[0]] + PARAMS[1:],
                           use_tqdm=False)
    assert _tokens(outputs[:1] + outputs[2:]) == _tokens(clean)
    assert [o.error for o in clean] == [None] * 3 and outputs[0].error is None
    failed = outputs[1]
    assert failed.finished and failed.error == "RuntimeError: poisoned input"
    assert [c.finish_reason for c in failed.outputs] == ["abort"]
    assert _pool_is_empty(llm)


def test_a_request_failing_alone_in_its_step(llm, failing_forward):
    outputs = llm.generate([{"prompt_token_ids": [POISON]}], PARAMS[0], use_tqdm=False)
    assert outputs[0].error == "RuntimeError: poisoned input" and outputs[0].finished
    assert _pool_is_empty(llm)
    assert llm.generate(PROMPTS[:1], PARAMS[0], use_tqdm=False)[0].error is None


def test_a_batch_that_fails_with_no_request_to_blame_raises(llm, monkeypatch):
    engine = llm.llm_engine
    model = engine.model_runner.model
    original = model.forward

    def forward(*args, **kwargs):
        encoder_ids = kwargs.get("encoder_input_ids")
        if encoder_ids is not None and encoder_ids.numel() > 8:       # only the whole batch is too much
            raise RuntimeError("batch too large")
        return original(*args, **kwargs)
    monkeypatch.setattr(model, "forward", forward)
    for index, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{index}", prompt, PARAMS[0])
    with pytest.raises(RuntimeError, match="batch too large"):
        engine.step()
    engine.abort_request([f"r{index}" for index in range(len(PROMPTS))])
    assert _pool_is_empty(llm)


def test_an_audio_model_refuses_a_text_prompt_before_any_step(tmp_path):
    model_dir, _ = build_tiny_model("whisper", tmp_path)
    whisper = LLM(model_dir, skip_tokenizer_init=True, kv_cache_space_gb=0.01)
    with pytest.raises(ValueError, match="transcribes audio: its encoder prompt needs multi_modal_data"):
        whisper.generate([{"prompt_token_ids": [1, 2, 3]}], PARAMS[0], use_tqdm=False)
    assert _pool_is_empty(whisper)


def test_a_shared_encoder_output_is_computed_by_a_survivor_when_its_first_holder_fails(model_dir, monkeypatch):
    """Two requests with the same document: the first (whose decoder prompt the model refuses) would run the shared
    encoder; it is aborted, and the step run again without it runs the encoder for the second."""
    cached = LLM(model_dir, skip_tokenizer_init=True, kv_cache_space_gb=0.01)
    document = PROMPTS[0]["prompt_token_ids"]
    survivor = {"encoder_prompt": {"prompt_token_ids": document}, "decoder_prompt": {"prompt_token_ids": [2, 11]}}
    clean = cached.generate([survivor], PARAMS[0], use_tqdm=False)
    model = cached.llm_engine.model_runner.model
    original = model.forward

    def forward(input_ids, *args, **kwargs):
        if bool((input_ids == POISON).any()):
            raise RuntimeError("poisoned input")
        return original(input_ids, *args, **kwargs)
    monkeypatch.setattr(model, "forward", forward)
    other = {"prompt_token_ids": [r + 1 for r in document]}  # evicts nothing: a different document
    poisoned = {"encoder_prompt": {"prompt_token_ids": document[::-1]},
                "decoder_prompt": {"prompt_token_ids": [2, POISON]}}
    fresh_survivor = {"encoder_prompt": poisoned["encoder_prompt"], "decoder_prompt": survivor["decoder_prompt"]}
    runs_before = cached.llm_engine.model_runner.num_encoder_runs
    outputs = cached.generate([poisoned, fresh_survivor, other], PARAMS[0], use_tqdm=False)
    assert outputs[0].error == "RuntimeError: poisoned input" and outputs[1].error is None
    reference = LLM(model_dir, skip_tokenizer_init=True, kv_cache_space_gb=0.01, enable_encoder_cache=False)
    assert _tokens(outputs[1:]) == _tokens(reference.generate([fresh_survivor, other], PARAMS[0], use_tqdm=False))
    # the failed step ran the shared encoder once, the step again without the failing request once more
    assert cached.llm_engine.model_runner.num_encoder_runs - runs_before >= 2
    assert clean[0].error is None and _pool_is_empty(cached)
