"""The T5 family step by step against HF transformers' full logits: one flattened prefill of three requests, batched
paged decode steps (the position bias of every query against every cached position), a step mixing a prefill with
two decodes, and strict weight loading."""
import pytest
import torch
from model_test_utils import (build_metadata, decode_metadata, flat_prefill_inputs, last_token_indices, make_kv_caches,
                              prefill_metadata, random_block_tables)
from t5_reference import VARIANTS, VOCAB, build_tiny_t5

from seq2seq_engine.model_loader.loader import load_model
from seq2seq_engine.models.t5 import T5ForConditionalGeneration

BLOCK_SIZE = 4
TOL = 1e-4
ENCODER_LENS = (7, 26, 4)
DECODER_PROMPTS = ([0], [0, 17, 33], [0, 5])
DECODE_STEPS = 8


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def case(request, tmp_path_factory):
    model_dir, hf = build_tiny_t5(request.param, tmp_path_factory.mktemp(request.param))
    ours, _ = load_model(model_dir, torch.float32, "cpu")
    generator = torch.Generator().manual_seed(7)
    encoders = [torch.randint(3, VOCAB, (n,), generator=generator) for n in ENCODER_LENS]
    return ours, hf, encoders


@torch.no_grad()
def _hf_logits(hf, encoder, decoder_ids):
    return hf(input_ids=encoder[None], decoder_input_ids=torch.tensor([decoder_ids])).logits[0]


def _caches_and_tables(ours, seq_lens, seed):
    num_blocks = sum(-(-n // BLOCK_SIZE) for n in list(seq_lens) + list(ENCODER_LENS)) + 5
    tables = random_block_tables(list(seq_lens) + list(ENCODER_LENS), BLOCK_SIZE, num_blocks, seed=seed)
    num_layers, num_heads, head_size = ours.kv_cache_spec()
    caches = make_kv_caches(num_layers, num_blocks, BLOCK_SIZE, num_heads, head_size, fill="random")
    return caches, tables[:len(seq_lens)], tables[len(seq_lens):]


def _encoder_kwargs(encoders):
    return dict(encoder_input_ids=torch.cat(encoders))


@torch.no_grad()
def test_batched_prefill_then_paged_decode_logits(case):
    ours, hf, encoders = case
    prompts = [list(p) for p in DECODER_PROMPTS]
    caches, self_tables, cross_tables = _caches_and_tables(ours, [len(p) + DECODE_STEPS + 1 for p in prompts], 0)
    metadata = prefill_metadata([len(p) for p in prompts], BLOCK_SIZE, self_tables, encoder_lens=list(ENCODER_LENS),
                                cross_block_tables=cross_tables)
    input_ids, positions = flat_prefill_inputs(prompts)
    logits = ours.compute_logits(ours(input_ids, positions, caches, metadata, **_encoder_kwargs(encoders)))
    start = 0
    for encoder, prompt in zip(encoders, prompts):
        torch.testing.assert_close(logits[start:start + len(prompt)], _hf_logits(hf, encoder, prompt), rtol=0,
                                   atol=TOL)
        start += len(prompt)
    step_logits = [logits[last_token_indices([len(p) for p in prompts])]]
    tokens = [p + [int(t)] for p, t in zip(prompts, step_logits[0].argmax(-1))]
    for _ in range(DECODE_STEPS):
        seq_lens = [len(t) for t in tokens]
        metadata = decode_metadata(seq_lens, self_tables, BLOCK_SIZE, encoder_lens=list(ENCODER_LENS),
                                   cross_block_tables=cross_tables)
        hidden = ours(torch.tensor([t[-1] for t in tokens]), torch.tensor([n - 1 for n in seq_lens]), caches,
                      metadata)
        step_logits.append(ours.compute_logits(hidden))
        tokens = [t + [int(n)] for t, n in zip(tokens, step_logits[-1].argmax(-1))]
    for i, (encoder, prompt) in enumerate(zip(encoders, prompts)):
        expected = _hf_logits(hf, encoder, tokens[i][:-1])[len(prompt) - 1:]
        torch.testing.assert_close(torch.stack([s[i] for s in step_logits]), expected, rtol=0, atol=TOL)


@torch.no_grad()
def test_prefill_and_decodes_in_one_step(case):
    ours, hf, encoders = case
    prompts = [list(p) for p in DECODER_PROMPTS]
    caches, self_tables, cross_tables = _caches_and_tables(ours, [len(p) + 2 for p in prompts], 5)
    metadata = prefill_metadata([len(p) for p in prompts[:2]], BLOCK_SIZE, self_tables[:2],
                                encoder_lens=list(ENCODER_LENS[:2]), cross_block_tables=cross_tables[:2])
    input_ids, positions = flat_prefill_inputs(prompts[:2])
    hidden = ours(input_ids, positions, caches, metadata, **_encoder_kwargs(encoders[:2]))
    first = ours.compute_logits(hidden[last_token_indices([len(p) for p in prompts[:2]])]).argmax(-1)
    tokens = [prompts[0] + [int(first[0])], prompts[1] + [int(first[1])], prompts[2]]
    metadata = build_metadata(
        BLOCK_SIZE, prefill_seq_lens=[len(tokens[2])], prefill_block_tables=[self_tables[2]],
        encoder_lens=[ENCODER_LENS[2]], cross_block_tables=[cross_tables[2]],
        decode_seq_lens=[len(tokens[0]), len(tokens[1])], decode_block_tables=self_tables[:2],
        decode_encoder_lens=list(ENCODER_LENS[:2]), decode_cross_block_tables=cross_tables[:2])
    input_ids = torch.tensor(tokens[2] + [tokens[0][-1], tokens[1][-1]])
    positions = torch.tensor(list(range(len(tokens[2]))) + [len(tokens[0]) - 1, len(tokens[1]) - 1])
    logits = ours.compute_logits(ours(input_ids, positions, caches, metadata, **_encoder_kwargs(encoders[2:])))
    torch.testing.assert_close(logits[:len(tokens[2])], _hf_logits(hf, encoders[2], tokens[2]), rtol=0, atol=TOL)
    for row, i in enumerate((0, 1)):
        expected = _hf_logits(hf, encoders[i], tokens[i])[-1]
        torch.testing.assert_close(logits[len(tokens[2]) + row], expected, rtol=0, atol=TOL)


def test_load_weights_is_strict(case):
    ours, hf, _ = case
    state = dict(hf.state_dict())          # with the tied copies (encoder/decoder.embed_tokens)
    full = type(ours)(hf.config)
    full.load_weights(state.items())
    for key, value in ours.state_dict().items():
        assert torch.equal(full.state_dict()[key], value), key
    dropped = "decoder.block.1.layer.1.EncDecAttention.v.weight"
    with pytest.raises(ValueError, match="missing tensors: decoder.block.1.layer.1.EncDecAttention.v.weight"):
        type(ours)(hf.config).load_weights((k, v) for k, v in state.items() if k != dropped)
    with pytest.raises(ValueError, match="surprise.weight"):
        type(ours)(hf.config).load_weights(list(state.items()) + [("decoder.surprise.weight", torch.zeros(2))])
    bad = "encoder.block.0.layer.0.SelfAttention.k.weight"
    with pytest.raises(ValueError, match="SelfAttention.k.weight"):
        type(ours)(hf.config).load_weights((k, v[:-1] if k == bad else v) for k, v in state.items())


def test_cross_attention_refuses_a_position_bias(case):
    ours, _, _ = case
    layer = ours.decoder.block[0].layer[1].EncDecAttention
    metadata = prefill_metadata([1], BLOCK_SIZE, [[0]], encoder_lens=[2], cross_block_tables=[[1]])
    width = layer.inner_dim
    with pytest.raises(ValueError, match="not cross-attention"):
        layer.attn(torch.zeros(1, width), torch.zeros(2, width), torch.zeros(2, width), None, metadata,
                   position_bias=lambda relative: relative)
    assert isinstance(ours, T5ForConditionalGeneration)
