"""prompt_logits_hooks get the raw logits of their decoder-prompt positions once (vs HF, tiny Llama and BART)."""
import pytest
from hf_reference import build_tiny_model
from prompt_scoring_utils import hf_decoder_logits, random_tokens, small_llm

from seq2seq_engine import BeamSearchParams, SamplingParams, TokensPrompt
from seq2seq_engine.inputs.data import ExplicitEncoderDecoderPrompt

TOL = 1e-4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return {arch: build_tiny_model(arch, tmp_path_factory.mktemp(arch)) for arch in ("llama", "bart")}


class Recorder:
    def __init__(self):
        self.rows = []

    def __call__(self, logits):
        self.rows.append(logits.detach().float().clone())


def _check(recorders, positions, reference):
    for recorder, position in zip(recorders, positions):
        assert len(recorder.rows) == 1, f"the hook at {position} ran {len(recorder.rows)} times"
        assert (recorder.rows[0] - reference[position]).abs().max().item() < TOL


@pytest.mark.parametrize("chunked", [False, True])
def test_hooks_get_the_raw_logits_of_their_positions_once(chunked, tiny):
    model_dir, hf_model = tiny["llama"]
    extra = dict(enable_chunked_prefill=True, max_num_batched_tokens=16) if chunked else {}
    llm = small_llm(model_dir, **extra)
    prompts = [random_tokens(n, seed) for seed, n in enumerate((40, 7, 23))]
    positions = [[0, 15, 16, 39], [6], [3, 22]]  # 16-token chunks split the first prompt at 16 and 32
    recorders = [[Recorder() for _ in p] for p in positions]
    # Logits processors and prompt_logprobs beside the hooks: the hooks still see the raw logits.
    params = [SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, repetition_penalty=1.5,
                             prompt_logprobs=1 if i == 2 else None,
                             prompt_logits_hooks=list(zip(p, r)))
              for i, (p, r) in enumerate(zip(positions, recorders))]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    plain = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                         SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, repetition_penalty=1.5),
                         use_tqdm=False)
    for prompt, position, recorder, output, alone in zip(prompts, positions, recorders, outputs, plain):
        _check(recorder, position, hf_decoder_logits(hf_model, prompt))
        assert output.outputs[0].token_ids == alone.outputs[0].token_ids
    assert outputs[2].prompt_logprobs is not None and outputs[0].prompt_logprobs is None
    assert not llm.llm_engine.model_runner.prompt_logprobs._num_hooked  # released with the finished sequences


def test_hooks_run_once_under_preemption_by_recompute(tiny):
    model_dir, hf_model = tiny["llama"]
    llm = small_llm(model_dir, num_gpu_blocks_override=30, preemption_mode="recompute")
    prompts = [random_tokens(n, 300 + n) for n in (3, 17, 5, 30, 9, 1, 24, 12)]
    recorders = [Recorder() for _ in prompts]
    params = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, prompt_logits_hooks=[(0, r)])
              for r in recorders]
    llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    assert llm.llm_engine.scheduler.num_cumulative_preemption > 0
    for prompt, recorder in zip(prompts, recorders):
        _check([recorder], [0], hf_decoder_logits(hf_model, prompt))


def test_bart_decoder_prompt_hooks_with_best_of_and_beam_search(tiny):
    model_dir, hf_model = tiny["bart"]
    encoder = random_tokens(12, 7)
    prompt = ExplicitEncoderDecoderPrompt(encoder_prompt=TokensPrompt(prompt_token_ids=encoder),
                                          decoder_prompt=TokensPrompt(prompt_token_ids=random_tokens(3, 8)))
    llm = small_llm(model_dir)
    sampled, beams = [Recorder(), Recorder()], [Recorder(), Recorder()]
    out = llm.generate(prompt, SamplingParams(n=3, best_of=3, temperature=1.0, seed=1, max_tokens=4,
                                              prompt_logits_hooks=[(0, sampled[0]), (3, sampled[1])]),
                       use_tqdm=False)[0]
    llm.beam_search(prompt, BeamSearchParams(beam_width=3, max_tokens=4,
                                             prompt_logits_hooks=[(0, beams[0]), (3, beams[1])]), use_tqdm=False)
    reference = hf_decoder_logits(hf_model, out.prompt_token_ids, encoder)
    assert len(out.prompt_token_ids) == 4
    _check(sampled, [0, 3], reference)
    _check(beams, [0, 3], reference)


def test_bad_hooks_are_refused(tiny):
    llm = small_llm(tiny["llama"][0])
    with pytest.raises(ValueError, match="positions 0 to 4"):
        llm.generate(TokensPrompt(prompt_token_ids=random_tokens(5, 0)),
                     SamplingParams(max_tokens=2, prompt_logits_hooks=[(5, Recorder())]), use_tqdm=False)
    for bad in ([(-1, Recorder())], [(0, "not callable")], [Recorder()], (0, Recorder())):
        with pytest.raises(ValueError, match="prompt_logits_hooks"):
            SamplingParams(prompt_logits_hooks=bad)
    assert not llm.llm_engine.has_unfinished_requests()
