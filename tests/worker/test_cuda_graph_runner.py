"""Decode steps through the graph path: on the CPU the padded static inputs run eagerly (run_eagerly) and must give
HF's greedy tokens and the eager runner's beams; `enforce_eager` from LLM and every command line to the runner; on
CUDA (skipped here) graphs must give the tokens enforce_eager gives."""
import logging

import pytest
import torch
from hf_reference import build_tiny_model, hf_greedy

from seq2seq_engine import LLM, BeamSearchParams, SamplingParams, TokensPrompt
from seq2seq_engine.entrypoints import text_cli, transcribe_cli
from seq2seq_engine.entrypoints.cli import build_parser
from seq2seq_engine.entrypoints.openai import serve_cli
from seq2seq_engine.worker.model_runner import ModelRunner

_GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def _prompts(count, seed, lengths=(4, 13)):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 256, (int(torch.randint(*lengths, (1,), generator=generator)),),
                          generator=generator).tolist() for _ in range(count)]


def _graph_runner(llm, capture):
    engine = llm.llm_engine
    return ModelRunner(engine.model_runner.model, engine.device, engine.scheduler_config.max_num_seqs,
                       engine.model_config.max_model_len, engine.cache_config.block_size,
                       engine.model_config.eos_token_id, engine.model_config.max_encoder_len, graph_capture=capture)


class _Recorder:
    """A capture that runs the padded step as it is and counts its captures."""

    def __init__(self):
        self.count = 0

    def __call__(self, step):
        self.count += 1
        return step


def _run_with(llm, runner, fn):
    engine = llm.llm_engine
    eager, engine.model_runner = engine.model_runner, runner
    try:
        return fn()
    finally:
        engine.model_runner = eager


@pytest.fixture(scope="module")
def bart(tmp_path_factory):
    model_dir, hf_model = build_tiny_model("bart", tmp_path_factory.mktemp("graph_bart"))
    return LLM(model_dir, kv_cache_space_gb=0.01, block_size=8, skip_tokenizer_init=True, max_num_seqs=12), hf_model


@pytest.mark.parametrize("count, seed", [(3, 0), (6, 1), (1, 2)])
def test_padded_decode_steps_give_hf_greedy_tokens_bart(bart, count, seed):
    llm, hf_model = bart
    recorder = _Recorder()
    runner = _graph_runner(llm, recorder)
    prompts = _prompts(count, seed)
    outputs = _run_with(llm, runner, lambda: llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts], _GREEDY, use_tqdm=False))
    for prompt, output in zip(prompts, outputs):
        expected, _ = hf_greedy(hf_model, torch.tensor(prompt), [2, 0], 10)
        assert output.outputs[0].token_ids == expected
    used = set(runner.decode_graphs._steps)
    assert used and max(used) >= count and all(size in (1, 2, 4, 8, 16) for size in used)
    assert recorder.count == len(used) and not runner.decode_graphs.disabled


def test_padded_beam_search_equals_eager_beams(bart):
    llm, _ = bart
    prompts = [TokensPrompt(prompt_token_ids=p) for p in _prompts(2, 3)]
    params = BeamSearchParams(beam_width=3, max_tokens=8, ignore_eos=True)
    eager = llm.beam_search(prompts, params, use_tqdm=False)
    runner = _graph_runner(llm, _Recorder())
    padded = _run_with(llm, runner, lambda: llm.beam_search(prompts, params, use_tqdm=False))
    for want, got in zip(eager, padded):
        assert [c.token_ids for c in got.outputs] == [c.token_ids for c in want.outputs]
        for a, b in zip(got.outputs, want.outputs):
            assert a.cumulative_logprob == pytest.approx(b.cumulative_logprob, abs=1e-4)
    assert 8 in runner.decode_graphs._steps    # 2 requests x 3 beams: 6 rows in the bucket of 8


def test_failed_capture_falls_back_to_eager_with_a_warning(bart, caplog):
    llm, hf_model = bart

    def failing(step):
        raise RuntimeError("operation not permitted when stream is capturing")

    runner = _graph_runner(llm, failing)
    prompts = _prompts(2, 4)
    with caplog.at_level(logging.WARNING, logger="seq2seq_engine"):
        outputs = _run_with(llm, runner, lambda: llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], _GREEDY, use_tqdm=False))
    for prompt, output in zip(prompts, outputs):
        assert output.outputs[0].token_ids == hf_greedy(hf_model, torch.tensor(prompt), [2, 0], 10)[0]
    assert runner.decode_graphs.disabled and "could not be captured" in caplog.text


def test_padded_decode_steps_give_hf_greedy_tokens_llama(tmp_path):
    model_dir, hf_model = build_tiny_model("llama", tmp_path)
    llm = LLM(model_dir, kv_cache_space_gb=0.01, block_size=8, skip_tokenizer_init=True, max_num_seqs=4)
    runner = _graph_runner(llm, _Recorder())
    assert runner.decode_graphs.cross_table_width == 0
    prompts = _prompts(3, 5)
    outputs = _run_with(llm, runner, lambda: llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts], _GREEDY, use_tqdm=False))
    for prompt, output in zip(prompts, outputs):
        assert output.outputs[0].token_ids == hf_greedy(hf_model, None, prompt, 10)[0]
    assert 4 in runner.decode_graphs._steps


def test_enforce_eager_reaches_the_runner(bart, tmp_path):
    llm, _ = bart
    assert llm.llm_engine.model_runner.enforce_eager is False
    assert llm.llm_engine.model_runner.decode_graphs is None          # graphs are CUDA only
    model_dir, _ = build_tiny_model("bart", tmp_path)
    eager = LLM(model_dir, kv_cache_space_gb=0.01, skip_tokenizer_init=True, enforce_eager=True)
    assert eager.llm_engine.model_config.enforce_eager is True
    assert eager.llm_engine.model_runner.enforce_eager is True and eager.llm_engine.model_runner.decode_graphs is None
    with pytest.raises(TypeError, match="enforce_eager"):
        LLM(model_dir, kv_cache_space_gb=0.01, skip_tokenizer_init=True, enforce_eager="yes")


@pytest.mark.parametrize("argv, module", [
    (["generate", "--model", "m", "--input", "x.jsonl"], text_cli),
    (["transcribe", "a.wav", "--model", "m"], transcribe_cli),
    (["serve", "m"], serve_cli)])
def test_enforce_eager_flag_on_every_command(argv, module):
    parser = build_parser()
    assert module.engine_kwargs(parser.parse_args(argv))["enforce_eager"] is False
    assert module.engine_kwargs(parser.parse_args(argv + ["--enforce-eager"]))["enforce_eager"] is True


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("arch", ["bart", "llama"])
def test_cuda_graph_tokens_equal_enforce_eager_tokens(arch, tmp_path):
    model_dir, _ = build_tiny_model(arch, tmp_path)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in _prompts(11, 6)]
    results = {}
    for enforce_eager in (False, True):
        llm = LLM(model_dir, device="cuda", kv_cache_space_gb=0.05, block_size=16, skip_tokenizer_init=True,
                  max_num_seqs=16, enforce_eager=enforce_eager, num_gpu_blocks_override=256)
        results[enforce_eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, _GREEDY, use_tqdm=False)]
        graphs = llm.llm_engine.model_runner.decode_graphs
        if not enforce_eager:
            assert graphs is not None and not graphs.disabled and 16 in graphs._steps
        else:
            assert graphs is None
    assert results[False] == results[True]


def _tensors(model_input):
    """(name, tensor) of every tensor a step hands the model and the sampler."""
    names = ("input_ids", "positions", "selected_token_indices", "encoder_input_ids", "encoder_positions")
    found = [(name, getattr(model_input, name)) for name in names]
    metadata = model_input.attn_metadata
    for part in (metadata.self_attn, metadata.encoder, metadata.cross, model_input.prompt_logprobs):
        for name, value in (vars(part) if part is not None else {}).items():
            found.append((name, value))
    return [(name, value) for name, value in found if isinstance(value, torch.Tensor)]


def test_every_step_tensor_reaches_the_device(bart):
    """A runner on the meta device: every tensor a prefill and a decode step hand on must have been moved."""
    llm, _ = bart
    engine = llm.llm_engine
    runner = ModelRunner(engine.model_runner.model, torch.device("meta"), engine.scheduler_config.max_num_seqs,
                         engine.model_config.max_model_len, engine.cache_config.block_size)
    for index, prompt in enumerate(_prompts(3, 7)):
        engine.add_request(f"meta-{index}", TokensPrompt(prompt_token_ids=prompt),
                           SamplingParams(max_tokens=4, prompt_logprobs=1))
    prefill, _ = engine.scheduler.schedule()
    prefill_input = runner.prepare_inputs(prefill)
    engine.abort_request([f"meta-{index}" for index in range(3)])
    engine.add_request("meta-3", TokensPrompt(prompt_token_ids=_prompts(1, 8)[0]), SamplingParams(max_tokens=4))
    engine.step()
    decode, _ = engine.scheduler.schedule()
    decode_input = runner.prepare_inputs(decode)
    engine.abort_request("meta-3")
    assert prefill_input.attn_metadata.num_prefills == 3 and decode_input.attn_metadata.num_prefills == 0
    assert prefill_input.prompt_logprobs is not None and prefill_input.encoder_input_ids is not None
    for name, tensor in _tensors(prefill_input) + _tensors(decode_input):
        assert tensor.device.type == "meta", name
    assert len(_tensors(prefill_input)) >= 8 and len(_tensors(decode_input)) >= 7


def test_fed_tokens_reach_the_padded_graph_inputs(tmp_path):
    """Asynchronous scheduling through the graph path: each step's pending tokens are written into the static
    inputs, so the tokens equal the synchronous eager run's."""
    model_dir, _ = build_tiny_model("bart", tmp_path)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in _prompts(5, 3)]
    params = [SamplingParams(temperature=0.0, max_tokens=4 + 2 * i, ignore_eos=True) for i in range(5)]
    kwargs = dict(kv_cache_space_gb=0.01, block_size=8, skip_tokenizer_init=True, max_num_seqs=12)
    expected = [o.outputs[0].token_ids for o in LLM(model_dir, **kwargs).generate(prompts, params, use_tqdm=False)]
    llm = LLM(model_dir, async_scheduling=True, **kwargs)
    runner = _graph_runner(llm, _Recorder())
    outputs = _run_with(llm, runner, lambda: llm.generate(prompts, params, use_tqdm=False))
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert llm.llm_engine.async_scheduler.steps_ahead > 0 and runner.decode_graphs._steps
