"""LLM.beam_search against HF `generate(num_beams=...)` on random-initialised BART and Llama: every prompt's best
hypothesis identical (tokens, cumulative logprob, score), all prompts batched in one engine."""
import pytest
import torch
from generate_reference import hf_beam_generate
from hf_reference import build_tiny_model, hf_greedy

from seq2seq_engine import LLM, BeamSearchParams, SamplingParams, TokensPrompt
from seq2seq_engine.inputs.data import ExplicitEncoderDecoderPrompt

VOCAB = 32          # small, so that EOS (id 2) often ranks among the candidates and ends beams early
NUM_TOKENS = 20
# (beam_width, length_penalty, early_stopping, min_tokens): every pair of values of width x length_penalty x
# early_stopping in {True, False} occurs, plus "never" with both penalties; min_tokens (HF min_length) in half.
CONFIGS = [(2, 0.8, True, 0), (2, 2.0, False, 3), (4, 0.8, False, 2), (4, 2.0, True, 0), (4, 2.0, "never", 3),
           (2, 0.8, "never", 0)]


def _bart_prompts(generator):
    """Engine prompts and the matching HF (input_ids, decoder_input_ids): default and explicit decoder prompts."""
    prompts, hf_inputs = [], []
    for i, n in enumerate([5, 40, 12, 3, 27, 18]):
        encoder = torch.randint(4, VOCAB, (n,), generator=generator).tolist()
        if i % 2:
            prompts.append(TokensPrompt(prompt_token_ids=encoder))
            decoder_prompt = [2, 0]  # the default: decoder_start_token_id, bos
        else:
            decoder = torch.randint(4, VOCAB, (i // 2 + 1,), generator=generator).tolist()
            prompts.append(ExplicitEncoderDecoderPrompt(encoder_prompt=TokensPrompt(prompt_token_ids=encoder),
                                                        decoder_prompt=TokensPrompt(prompt_token_ids=decoder)))
            decoder_prompt = [2] + decoder
        hf_inputs.append((torch.tensor([encoder]), torch.tensor([decoder_prompt])))
    return prompts, hf_inputs


def _llama_prompts(generator):
    prompts = [torch.randint(4, VOCAB, (n,), generator=generator).tolist() for n in [3, 17, 5, 30, 9, 1]]
    return [TokensPrompt(prompt_token_ids=p) for p in prompts], [(torch.tensor([p]), None) for p in prompts]


def _hf_beams(hf_model, hf_input, width, length_penalty, early_stopping, min_tokens):
    """HF's num_beams hypotheses (generated tokens), their sequences_scores, best first."""
    input_ids, decoder_input_ids = hf_input
    encoder = input_ids[0].tolist() if decoder_input_ids is not None else None
    prompt = (decoder_input_ids if decoder_input_ids is not None else input_ids)[0].tolist()
    beams = hf_beam_generate(hf_model, encoder, prompt, num_beams=width, num_return_sequences=width,
                             max_new_tokens=NUM_TOKENS, length_penalty=length_penalty, early_stopping=early_stopping,
                             min_length=len(prompt) + min_tokens, forced_eos_token_id=None)
    return [tokens for tokens, _ in beams], [score for _, score in beams]


@pytest.fixture(scope="module", params=["bart", "llama"])
def case(request, tmp_path_factory):
    arch = request.param
    model_dir, hf_model = build_tiny_model(arch, tmp_path_factory.mktemp(arch), vocab_size=VOCAB)
    generator = torch.Generator().manual_seed(5)
    prompts, hf_inputs = (_bart_prompts if arch == "bart" else _llama_prompts)(generator)
    llm = LLM(model_dir, skip_tokenizer_init=True, dtype="float32", block_size=4, kv_cache_space_gb=0.02)
    return arch, hf_model, llm, prompts, hf_inputs


def test_best_beams_match_hf_generate(case):
    arch, hf_model, llm, prompts, hf_inputs = case
    matched_best = matched_all = total_beams = ended_early = 0
    for width, length_penalty, early_stopping, min_tokens in CONFIGS:
        params = BeamSearchParams(beam_width=width, max_tokens=NUM_TOKENS, length_penalty=length_penalty,
                                  early_stopping=early_stopping, min_tokens=min_tokens)
        outputs = llm.beam_search(prompts, params, use_tqdm=False)
        for output, hf_input in zip(outputs, hf_inputs):
            hf_tokens, hf_scores = _hf_beams(hf_model, hf_input, width, length_penalty, early_stopping, min_tokens)
            ours = output.outputs
            assert len(ours) == width and output.finished
            assert ours[0].token_ids == hf_tokens[0], (arch, width, length_penalty, early_stopping, min_tokens)
            assert ours[0].beam_score == pytest.approx(hf_scores[0], abs=1e-4)
            generated = len(ours[0].token_ids)
            assert ours[0].cumulative_logprob == pytest.approx(hf_scores[0] * generated ** length_penalty, abs=1e-3)
            assert all(len(c.token_ids) >= min_tokens + 1 for c in ours)
            matched_best += 1
            matched_all += sum(c.token_ids == t for c, t in zip(ours, hf_tokens))
            total_beams += width
            ended_early += sum(c.finish_reason == "stop" and len(c.token_ids) < NUM_TOKENS for c in ours)
    print(f"\n{arch}: best beams identical {matched_best}/{len(CONFIGS) * len(prompts)}, "
          f"all beams identical {matched_all}/{total_beams}, beams ended by EOS {ended_early}")
    assert matched_all >= 0.9 * total_beams
    assert ended_early > 0, "no beam ended with EOS: the finished-hypothesis rules went untested"
    manager = llm.llm_engine.scheduler.block_manager
    assert manager.get_num_free_gpu_blocks() == llm.llm_engine.cache_config.num_gpu_blocks
    assert not manager.block_tables and not manager.cross_block_tables


def test_beam_requests_batched_with_greedy_requests(case):
    """Beam and greedy requests share engine steps; each comes out as when run alone."""
    arch, hf_model, llm, prompts, hf_inputs = case
    params = BeamSearchParams(beam_width=3, max_tokens=NUM_TOKENS, length_penalty=1.2)
    alone = llm.beam_search(prompts, params, use_tqdm=False)
    engine = llm.llm_engine
    greedy = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"beam-{i}", prompt, params)
        engine.add_request(f"greedy-{i}", prompt, greedy)
    finished = {}
    while engine.has_unfinished_requests():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    for i, (output, (input_ids, decoder_input_ids)) in enumerate(zip(alone, hf_inputs)):
        assert [c.token_ids for c in finished[f"beam-{i}"].outputs] == [c.token_ids for c in output.outputs]
        if decoder_input_ids is not None:
            reference = hf_greedy(hf_model, input_ids[0], decoder_input_ids[0].tolist(), NUM_TOKENS)[0]
        else:
            reference = hf_greedy(hf_model, None, input_ids[0].tolist(), NUM_TOKENS)[0]
        assert finished[f"greedy-{i}"].outputs[0].token_ids == reference
