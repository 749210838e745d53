"""Marian, M2M100/NLLB and Pegasus against HF transformers: the position tables, one flattened prefill step over
three requests of mixed lengths with paged self and cross blocks, batched greedy decode steps (encoder not rerun),
and strict weight loading (stored position tables checked, tied names, the untied Marian variants)."""
import pytest
import torch
import transformers
from model_test_utils import (decode_metadata, flat_prefill_inputs, last_token_indices, make_kv_caches,
                              prefill_metadata, random_block_tables)
from mt_reference import VARIANTS, build_hf

from seq2seq_engine.model_loader.loader import load_model
from seq2seq_engine.models.m2m100 import M2M100ForConditionalGeneration
from seq2seq_engine.models.marian import MarianMTModel
from seq2seq_engine.models.pegasus import PegasusForConditionalGeneration
from seq2seq_engine.models.sinusoidal import fairseq_sinusoidal_table, marian_sinusoidal_table

TOL = 1e-4
BLOCK_SIZE = 4
DECODE_STEPS = 7
ENCODER_LENS = (9, 3, 17)
CLASSES = {"marian": MarianMTModel, "m2m100": M2M100ForConditionalGeneration,
           "pegasus": PegasusForConditionalGeneration}


@pytest.mark.parametrize("dim", [36, 39])
def test_tables_equal_transformers(dim):
    marian_hf = transformers.models.marian.modeling_marian.MarianSinusoidalPositionalEmbedding(70, dim)
    assert torch.equal(marian_sinusoidal_table(70, dim), marian_hf.create_weight())
    pegasus_hf = transformers.models.pegasus.modeling_pegasus.PegasusSinusoidalPositionalEmbedding(70, dim)
    assert torch.equal(marian_sinusoidal_table(70, dim), pegasus_hf.create_weight())
    m2m = transformers.models.m2m_100.modeling_m2m_100.M2M100SinusoidalPositionalEmbedding
    assert torch.equal(fairseq_sinusoidal_table(72, dim, 1), m2m.get_embedding(72, dim, 1))


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def case(request, tmp_path_factory):
    hf = build_hf(request.param)
    model_dir = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(model_dir)
    ours, _ = load_model(model_dir, torch.float32, "cpu")
    assert type(ours) is CLASSES[VARIANTS[request.param][0]]
    return request.param, ours, hf


def _encoder_inputs(hf, seed=1):
    """Token ids that avoid the special ids (pad would take a zero position vector in M2M100)."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, hf.config.vocab_size - 1, (n,), generator=generator) for n in ENCODER_LENS]


def _decoder_prompts(hf):
    start = hf.config.decoder_start_token_id
    return [[start], [start, 17, 33, 5, 90], [start, 8]]


@torch.no_grad()
def _hf_logits(hf, encoder_input, decoder_ids):
    return hf(input_ids=encoder_input[None], attention_mask=torch.ones(1, len(encoder_input), dtype=torch.long),
              decoder_input_ids=torch.tensor([decoder_ids])).logits[0]


@torch.no_grad()
def _hf_generate(hf, encoder_input, decoder_prompt, max_new_tokens):
    out = hf.generate(input_ids=encoder_input[None], attention_mask=torch.ones(1, len(encoder_input),
                                                                               dtype=torch.long),
                      decoder_input_ids=torch.tensor([decoder_prompt]), do_sample=False, num_beams=1,
                      max_new_tokens=max_new_tokens, eos_token_id=None, forced_bos_token_id=None,
                      forced_eos_token_id=None, no_repeat_ngram_size=0, min_length=0, bad_words_ids=None)
    return out[0, -max_new_tokens:].tolist()


@torch.no_grad()
def test_batched_prefill_then_greedy_decode(case):
    _, ours, hf = case
    encoder_inputs = _encoder_inputs(hf)
    prompts = _decoder_prompts(hf)
    seq_lens = [len(p) + DECODE_STEPS + 1 for p in prompts]
    num_blocks = sum(-(-n // BLOCK_SIZE) for n in seq_lens + list(ENCODER_LENS)) + 3
    tables = random_block_tables(seq_lens + list(ENCODER_LENS), BLOCK_SIZE, num_blocks, seed=2)
    self_tables, cross_tables = tables[:3], tables[3:]
    caches = make_kv_caches(*ours.kv_cache_spec()[:1], num_blocks, BLOCK_SIZE, *ours.kv_cache_spec()[1:],
                            fill="random")

    metadata = prefill_metadata([len(p) for p in prompts], BLOCK_SIZE, self_tables, encoder_lens=ENCODER_LENS,
                                cross_block_tables=cross_tables)
    input_ids, positions = flat_prefill_inputs(prompts)
    logits = ours.compute_logits(ours(input_ids, positions, caches, metadata,
                                      encoder_input_ids=torch.cat(encoder_inputs),
                                      encoder_positions=torch.cat([torch.arange(n) for n in ENCODER_LENS])))
    start = 0
    for encoder_input, prompt in zip(encoder_inputs, prompts):
        torch.testing.assert_close(logits[start:start + len(prompt)], _hf_logits(hf, encoder_input, prompt),
                                   rtol=0, atol=TOL)
        start += len(prompt)

    step_logits = [logits[last_token_indices([len(p) for p in prompts])]]
    tokens = [p + [int(t)] for p, t in zip(prompts, step_logits[0].argmax(-1))]
    for _ in range(DECODE_STEPS):
        lens = [len(t) for t in tokens]
        metadata = decode_metadata(lens, self_tables, BLOCK_SIZE, encoder_lens=ENCODER_LENS,
                                   cross_block_tables=cross_tables)
        hidden = ours(torch.tensor([t[-1] for t in tokens]), torch.tensor([n - 1 for n in lens]), caches, metadata)
        step_logits.append(ours.compute_logits(hidden))
        tokens = [t + [int(n)] for t, n in zip(tokens, step_logits[-1].argmax(-1))]

    for i, (encoder_input, prompt) in enumerate(zip(encoder_inputs, prompts)):
        assert tokens[i][len(prompt):] == _hf_generate(hf, encoder_input, prompt, DECODE_STEPS + 1), f"request {i}"
        expected = _hf_logits(hf, encoder_input, tokens[i][:-1])[len(prompt) - 1:]
        torch.testing.assert_close(torch.stack([s[i] for s in step_logits]), expected, rtol=0, atol=TOL)


# ------------------------------------------------------------------------------------------- weight loading
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_load_weights_is_strict(variant):
    hf = build_hf(variant)
    cls = CLASSES[VARIANTS[variant][0]]
    state = dict(hf.state_dict())
    dropped = next(k for k in state if k.endswith("layers.1.encoder_attn.v_proj.weight"))
    with pytest.raises(ValueError, match="encoder_attn.v_proj.weight"):
        cls(hf.config).load_weights((k, v) for k, v in state.items() if k != dropped)
    with pytest.raises(ValueError, match="surprise.weight"):
        cls(hf.config).load_weights(list(state.items()) + [("model.encoder.surprise.weight", torch.zeros(2))])
    bad = next(k for k in state if k.endswith("layers.0.fc1.weight"))
    with pytest.raises(ValueError, match="fc1.weight"):
        cls(hf.config).load_weights((k, v[:-1] if k == bad else v) for k, v in state.items())


@pytest.mark.parametrize("variant", ["marian", "pegasus"])
def test_stored_position_tables_are_checked_not_loaded(variant):
    """Pegasus checkpoints (and old Marian ones) store the sinusoid table: equal ones pass, others are refused."""
    hf = build_hf(variant)
    cls = CLASSES[variant]
    table = hf.model.encoder.embed_positions.weight.detach().clone()
    state = {k: v for k, v in hf.state_dict().items() if "embed_positions" not in k}
    state["model.encoder.embed_positions.weight"] = table
    state["model.decoder.embed_positions.weight"] = table
    cls(hf.config).load_weights(state.items())
    state["model.decoder.embed_positions.weight"] = table + 0.01
    with pytest.raises(ValueError, match="model.decoder.embed_positions.weight.*not the sinusoidal position table"):
        cls(hf.config).load_weights(state.items())


def test_marian_separate_target_vocabulary_is_refused():
    config = build_hf("marian-unshared").config
    config.decoder_vocab_size = config.vocab_size + 5
    with pytest.raises(ValueError, match="decoder_vocab_size 155 != vocab_size 150"):
        MarianMTModel(config)


def test_marian_unshared_ties_lm_head_to_the_decoder_embeddings():
    hf = build_hf("marian-unshared")
    ours = MarianMTModel(hf.config)
    ours.load_weights((k, v) for k, v in hf.state_dict().items() if k != "lm_head.weight")
    assert ours.model.shared is None and ours.lm_head is None
    assert torch.equal(ours.tied_lm_head_weight(), hf.model.decoder.embed_tokens.weight)
    assert not torch.equal(ours.model.encoder.embed_tokens.weight, ours.model.decoder.embed_tokens.weight)
