"""Decoder-only models (Llama, GPT-2, OPT) against HF transformers: batched prefill logits over a block-diagonal
causal mask with a randomly assigned paged cache, then batched greedy decoding through the paged cache."""
import pytest
import torch
import transformers
from model_test_utils import (build_metadata, decode_metadata, flat_prefill_inputs, last_token_indices, make_kv_caches,
                              prefill_metadata, random_block_tables)

from seq2seq_engine.model_loader.loader import load_model

VOCAB = 160
SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
BLOCK_SIZE = 4
PROMPT_LENS = (5, 11, 17)
NEW_TOKENS = 8
TOL = 1e-4

_LLAMA = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=128, initializer_range=0.2, **SPECIAL)
_OPT = dict(vocab_size=VOCAB, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=128, word_embed_proj_dim=64, init_std=0.2, **SPECIAL)

CASES = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(rope_theta=500.0, **_LLAMA)),
    "llama3-rope-tied-bias": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=16),
        tie_word_embeddings=True, attention_bias=True, mlp_bias=True, **_LLAMA)),
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128, initializer_range=0.2, **SPECIAL)),
    "opt": lambda: transformers.OPTForCausalLM(transformers.OPTConfig(**_OPT)),
    "opt-proj": lambda: transformers.OPTForCausalLM(transformers.OPTConfig(**{**_OPT, "word_embed_proj_dim": 32})),
    "opt-post-norm": lambda: transformers.OPTForCausalLM(transformers.OPTConfig(do_layer_norm_before=False,
                                                                                **_OPT)),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def models(request, tmp_path_factory):
    """(ours, hf) for one tiny random checkpoint, saved and loaded through the real loader."""
    torch.manual_seed(0)
    hf = CASES[request.param]().eval()
    model_dir = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(model_dir)
    ours, _ = load_model(model_dir, torch.float32, "cpu")
    return ours, hf


def _prompts(seed=1):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=generator).tolist() for n in PROMPT_LENS]


def _caches(model, num_blocks):
    num_layers, num_kv_heads, head_size = model.kv_cache_spec()
    return make_kv_caches(num_layers, num_blocks, BLOCK_SIZE, num_kv_heads, head_size, fill="random")


@torch.no_grad()
def _hf_logits(hf, prompt):
    return hf(torch.tensor([prompt])).logits[0].float()


@torch.no_grad()
def test_prefill_logits_match_hf(models):
    ours, hf = models
    prompts = _prompts()
    tables = random_block_tables(PROMPT_LENS, BLOCK_SIZE, num_blocks=16, seed=3)
    caches = _caches(ours, 16)
    input_ids, positions = flat_prefill_inputs(prompts)
    md = prefill_metadata(PROMPT_LENS, BLOCK_SIZE, tables)
    logits = ours.compute_logits(ours(input_ids, positions, caches, md))
    assert logits.dtype == torch.float32 and logits.shape == (sum(PROMPT_LENS), VOCAB)
    expected = torch.cat([_hf_logits(hf, p) for p in prompts])
    assert (logits - expected).abs().max().item() < TOL
    # Without caches (a profiling run) the prefill result is the same.
    no_cache = ours.compute_logits(ours(input_ids, positions, [None] * len(caches), md))
    assert (no_cache - logits).abs().max().item() < 1e-5


@torch.no_grad()
def test_greedy_decode_matches_hf_generate(models):
    ours, hf = models
    prompts = _prompts(seed=2)
    max_lens = [n + NEW_TOKENS for n in PROMPT_LENS]
    num_blocks = sum((n + BLOCK_SIZE - 1) // BLOCK_SIZE for n in max_lens) + 5
    tables = random_block_tables(max_lens, BLOCK_SIZE, num_blocks, seed=4)
    caches = _caches(ours, num_blocks)

    input_ids, positions = flat_prefill_inputs(prompts)
    hidden = ours(input_ids, positions, caches, prefill_metadata(PROMPT_LENS, BLOCK_SIZE, tables))
    next_tokens = ours.compute_logits(hidden[last_token_indices(PROMPT_LENS)]).argmax(-1)
    generated = [[t] for t in next_tokens.tolist()]
    seq_lens = list(PROMPT_LENS)
    for _ in range(NEW_TOKENS - 1):
        seq_lens = [n + 1 for n in seq_lens]
        positions = torch.tensor([n - 1 for n in seq_lens])
        hidden = ours(next_tokens, positions, caches, decode_metadata(seq_lens, tables, BLOCK_SIZE))
        next_tokens = ours.compute_logits(hidden).argmax(-1)
        for out, token in zip(generated, next_tokens.tolist()):
            out.append(token)

    config = transformers.GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=0,
                                           pad_token_id=SPECIAL["pad_token_id"], eos_token_id=None)
    for prompt, ours_tokens in zip(prompts, generated):
        ids = torch.tensor([prompt])
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)[0, len(prompt):]
        assert ours_tokens == out.tolist()


@torch.no_grad()
def test_chunked_prefill_mixed_with_decode(models):
    """Step 1 prefills prompt 0 and the first chunk of prompt 1; step 2 decodes prompt 0 while prefilling the
    rest of prompt 1 over its cached chunk (bottom-right causal mask, context read from the paged cache)."""
    ours, hf = models
    prompt_a, prompt_b = _prompts(seed=5)[1:]
    chunk = 6
    tables = random_block_tables([len(prompt_a) + 1, len(prompt_b)], BLOCK_SIZE, num_blocks=16, seed=6)
    caches = _caches(ours, 16)
    input_ids, positions = flat_prefill_inputs([prompt_a, prompt_b[:chunk]])
    md = prefill_metadata([len(prompt_a), chunk], BLOCK_SIZE, tables)
    logits = ours.compute_logits(ours(input_ids, positions, caches, md))
    ref_a, ref_b = _hf_logits(hf, prompt_a), _hf_logits(hf, prompt_b)
    assert (logits - torch.cat([ref_a, ref_b[:chunk]])).abs().max().item() < TOL

    next_a = int(logits[len(prompt_a) - 1].argmax())
    rest_ids, rest_pos = flat_prefill_inputs([prompt_b], context_lens=[chunk])
    input_ids = torch.cat([rest_ids, torch.tensor([next_a])])
    positions = torch.cat([rest_pos, torch.tensor([len(prompt_a)])])
    md = build_metadata(BLOCK_SIZE, prefill_seq_lens=[len(prompt_b)], prefill_block_tables=[tables[1]],
                        prefill_context_lens=[chunk], decode_seq_lens=[len(prompt_a) + 1],
                        decode_block_tables=[tables[0]])
    logits = ours.compute_logits(ours(input_ids, positions, caches, md))
    ref_a_next = _hf_logits(hf, prompt_a + [next_a])[-1:]
    assert (logits - torch.cat([ref_b[chunk:], ref_a_next])).abs().max().item() < TOL


def test_kv_cache_spec_and_interface(models):
    ours, hf = models
    num_layers, num_kv_heads, head_size = ours.kv_cache_spec()
    assert num_layers == hf.config.num_hidden_layers
    expected_kv = getattr(hf.config, "num_key_value_heads", None) or hf.config.num_attention_heads
    assert num_kv_heads == expected_kv and head_size == 16
    assert type(ours).is_encoder_decoder is False
