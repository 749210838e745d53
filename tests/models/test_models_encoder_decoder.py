"""Encoder/decoder models (BART, mBART, Whisper) against HF transformers: one flattened prefill step over 3 requests
(encoder, causal self and rectangular cross block-diagonal masks; self and cross K/V written to randomly assigned
paged blocks), then batched greedy decode steps that read the self and cross blocks (encoder not rerun), a mixed
prefill + decode step, and strict weight loading."""
import pytest
import torch
import transformers
from model_test_utils import (build_metadata, decode_metadata, flat_prefill_inputs, last_token_indices, make_kv_caches,
                              prefill_metadata, random_block_tables)

from seq2seq_engine.model_loader.loader import load_model
from seq2seq_engine.models.bart import BartForConditionalGeneration, MBartForConditionalGeneration
from seq2seq_engine.models.whisper import WhisperForConditionalGeneration

VOCAB = 200
SPECIAL = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2)
DECODE_STEPS = 8            # after the prefill step: 1 + 8 new tokens per request
TOL = 1e-4
ENCODER_LENS = (7, 13, 4)
DECODER_PROMPTS = ([2], [2, 0, 17, 33], [2, 0, 5])

_BART = dict(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=96, max_position_embeddings=64,
             init_std=0.2, decoder_start_token_id=2, forced_bos_token_id=None, forced_eos_token_id=None, **SPECIAL)
_WHISPER = dict(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=96, num_mel_bins=80,
                max_target_positions=48, init_std=0.2, decoder_start_token_id=3, suppress_tokens=[],
                begin_suppress_tokens=[], **SPECIAL)

CASES = {
    "bart": (lambda: transformers.BartForConditionalGeneration(transformers.BartConfig(**_BART)),
             BartForConditionalGeneration),
    "bart-untied-scaled": (lambda: transformers.BartForConditionalGeneration(transformers.BartConfig(
        scale_embedding=True, tie_word_embeddings=False, activation_function="gelu_new", **_BART)),
        BartForConditionalGeneration),
    "mbart": (lambda: transformers.MBartForConditionalGeneration(transformers.MBartConfig(
        scale_embedding=True, activation_function="relu", **_BART)), MBartForConditionalGeneration),
    "whisper": (lambda: transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(
        max_source_positions=50, **_WHISPER)), WhisperForConditionalGeneration),
    # the released models' window: 3000 log-mel frames -> 1500 encoder positions per request
    "whisper-3000-frames": (lambda: transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(
        max_source_positions=1500, **_WHISPER)), WhisperForConditionalGeneration),
}
BART_CASES = ("bart", "bart-untied-scaled", "mbart")


def _build_hf(name):
    torch.manual_seed(0)
    hf = CASES[name][0]().eval()
    if hasattr(hf, "final_logits_bias"):   # zeros at init: make the bias path count
        with torch.no_grad():
            hf.final_logits_bias.normal_(0.0, 0.5)
    return hf


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    """(name, ours, hf): a tiny random checkpoint saved with save_pretrained, loaded through the real loader."""
    hf = _build_hf(request.param)
    model_dir = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(model_dir)
    ours, _ = load_model(model_dir, torch.float32, "cpu")
    assert type(ours) is CASES[request.param][1]
    return request.param, ours, hf


def _is_whisper(hf):
    return isinstance(hf, transformers.WhisperForConditionalGeneration)


def _encoder_inputs(hf, seed=1):
    """One encoder input per request: token ids (BART) or log-mel features [n_mels, 2 * max_source_positions]."""
    generator = torch.Generator().manual_seed(seed)
    if _is_whisper(hf):
        frames = 2 * hf.config.max_source_positions
        return [torch.randn(hf.config.num_mel_bins, frames, generator=generator) for _ in ENCODER_LENS]
    return [torch.randint(3, VOCAB, (n,), generator=generator) for n in ENCODER_LENS]


def _encoder_len(hf, encoder_input):
    return hf.config.max_source_positions if _is_whisper(hf) else len(encoder_input)


def _encoder_kwargs(hf, encoder_inputs):
    """The model's encoder arguments for a step whose prefills have these encoder inputs."""
    if _is_whisper(hf):
        return dict(encoder_features=torch.stack(encoder_inputs))
    return dict(encoder_input_ids=torch.cat(encoder_inputs),
                encoder_positions=torch.cat([torch.arange(len(ids)) for ids in encoder_inputs]))


@torch.no_grad()
def _hf_logits(hf, encoder_input, decoder_ids):
    """HF logits of every decoder position (teacher forcing), one request alone."""
    decoder_input_ids = torch.tensor([decoder_ids])
    if _is_whisper(hf):
        return hf(input_features=encoder_input[None], decoder_input_ids=decoder_input_ids).logits[0]
    return hf(input_ids=encoder_input[None], attention_mask=torch.ones(1, len(encoder_input), dtype=torch.long),
              decoder_input_ids=decoder_input_ids).logits[0]


@torch.no_grad()
def _hf_generate(hf, encoder_input, decoder_prompt, max_new_tokens):
    kwargs = dict(decoder_input_ids=torch.tensor([decoder_prompt]), do_sample=False, num_beams=1,
                  max_new_tokens=max_new_tokens, suppress_tokens=None, begin_suppress_tokens=None,
                  eos_token_id=None)
    if _is_whisper(hf):
        out = hf.generate(input_features=encoder_input[None], forced_decoder_ids=None, **kwargs)
    else:
        out = hf.generate(input_ids=encoder_input[None],
                          attention_mask=torch.ones(1, len(encoder_input), dtype=torch.long),
                          forced_bos_token_id=None, forced_eos_token_id=None, no_repeat_ngram_size=0, min_length=0,
                          **kwargs)
    return out[0, -max_new_tokens:].tolist()   # Whisper's generate returns only the new tokens


def _block_size(hf):
    return 16 if _is_whisper(hf) else 4


def _caches_and_tables(model, hf, seq_lens, encoder_lens, seed=0):
    """Paged caches with finite garbage in unwritten slots; disjoint, shuffled self and cross block tables."""
    block_size = _block_size(hf)
    num_blocks = sum((n + block_size - 1) // block_size for n in list(seq_lens) + list(encoder_lens)) + 5
    tables = random_block_tables(list(seq_lens) + list(encoder_lens), block_size, num_blocks, seed=seed)
    num_layers, num_kv_heads, head_size = model.kv_cache_spec()
    caches = make_kv_caches(num_layers, num_blocks, block_size, num_kv_heads, head_size, fill="random")
    return caches, tables[:len(seq_lens)], tables[len(seq_lens):]


def test_kv_cache_spec_and_interface(case):
    _, ours, hf = case
    assert ours.is_encoder_decoder
    cfg = hf.config
    assert ours.kv_cache_spec() == (cfg.decoder_layers, cfg.decoder_attention_heads,
                                    cfg.d_model // cfg.decoder_attention_heads)


@torch.no_grad()
def test_batched_prefill_then_greedy_decode(case):
    _, ours, hf = case
    encoder_inputs = _encoder_inputs(hf)
    encoder_lens = [_encoder_len(hf, x) for x in encoder_inputs]
    prompts = [list(p) for p in DECODER_PROMPTS]
    block_size = _block_size(hf)
    caches, self_tables, cross_tables = _caches_and_tables(
        ours, hf, [len(p) + DECODE_STEPS + 1 for p in prompts], encoder_lens)

    # (a) one flattened prefill step for all three requests
    metadata = prefill_metadata([len(p) for p in prompts], block_size, self_tables, encoder_lens=encoder_lens,
                                cross_block_tables=cross_tables)
    input_ids, positions = flat_prefill_inputs(prompts)
    hidden = ours(input_ids, positions, caches, metadata, **_encoder_kwargs(hf, encoder_inputs))
    assert hidden.shape == (sum(map(len, prompts)), hf.config.d_model)
    logits = ours.compute_logits(hidden)
    assert logits.dtype == torch.float32 and logits.shape[-1] == VOCAB
    start = 0
    for encoder_input, prompt in zip(encoder_inputs, prompts):
        expected = _hf_logits(hf, encoder_input, prompt)
        torch.testing.assert_close(logits[start:start + len(prompt)], expected, rtol=0, atol=TOL)
        start += len(prompt)

    # (b) batched greedy decode steps through the self and cross blocks; the encoder does not run again
    step_logits = [logits[last_token_indices([len(p) for p in prompts])]]
    tokens = [p + [int(t)] for p, t in zip(prompts, step_logits[0].argmax(-1))]
    for _ in range(DECODE_STEPS):
        seq_lens = [len(t) for t in tokens]
        metadata = decode_metadata(seq_lens, self_tables, block_size, encoder_lens=encoder_lens,
                                   cross_block_tables=cross_tables)
        assert metadata.encoder is None
        hidden = ours(torch.tensor([t[-1] for t in tokens]), torch.tensor([n - 1 for n in seq_lens]), caches,
                      metadata)
        step_logits.append(ours.compute_logits(hidden))
        tokens = [t + [int(n)] for t, n in zip(tokens, step_logits[-1].argmax(-1))]

    for i, (encoder_input, prompt) in enumerate(zip(encoder_inputs, prompts)):
        generated = tokens[i][len(prompt):]
        assert generated == _hf_generate(hf, encoder_input, prompt, DECODE_STEPS + 1), f"request {i}"
        # every step's logits, not just their argmax, match HF's teacher-forced logits
        expected = _hf_logits(hf, encoder_input, tokens[i][:-1])[len(prompt) - 1:]
        torch.testing.assert_close(torch.stack([s[i] for s in step_logits]), expected, rtol=0, atol=TOL)


@pytest.mark.parametrize("name", ["bart", "whisper"])
@torch.no_grad()
def test_mixed_prefill_and_decode_step(name):
    """A new request's prefill (encoder run, cross K/V written) in the same step as two decodes reading their
    cross blocks: the cross layer gets K/V for the prefill only."""
    hf = _build_hf(name)
    ours = CASES[name][1](hf.config)
    ours.load_weights(hf.state_dict().items())   # tied copies present: loaded once, others skipped
    ours.eval()
    encoder_inputs = _encoder_inputs(hf, seed=3)
    encoder_lens = [_encoder_len(hf, x) for x in encoder_inputs]
    prompts = [list(p) for p in DECODER_PROMPTS]
    block_size = _block_size(hf)
    caches, self_tables, cross_tables = _caches_and_tables(ours, hf, [len(p) + 2 for p in prompts],
                                                           encoder_lens, seed=5)
    # step 1: requests 0 and 1 prefill
    metadata = prefill_metadata([len(p) for p in prompts[:2]], block_size, self_tables[:2],
                                encoder_lens=encoder_lens[:2], cross_block_tables=cross_tables[:2])
    input_ids, positions = flat_prefill_inputs(prompts[:2])
    hidden = ours(input_ids, positions, caches, metadata, **_encoder_kwargs(hf, encoder_inputs[:2]))
    first = ours.compute_logits(hidden[last_token_indices([len(p) for p in prompts[:2]])]).argmax(-1)
    tokens = [prompts[0] + [int(first[0])], prompts[1] + [int(first[1])], prompts[2]]
    # step 2: request 2 prefills while requests 0 and 1 decode
    metadata = build_metadata(
        block_size, prefill_seq_lens=[len(tokens[2])], prefill_block_tables=[self_tables[2]],
        encoder_lens=[encoder_lens[2]], cross_block_tables=[cross_tables[2]],
        decode_seq_lens=[len(tokens[0]), len(tokens[1])], decode_block_tables=self_tables[:2],
        decode_encoder_lens=encoder_lens[:2], decode_cross_block_tables=cross_tables[:2])
    input_ids = torch.tensor(tokens[2] + [tokens[0][-1], tokens[1][-1]])
    positions = torch.tensor(list(range(len(tokens[2]))) + [len(tokens[0]) - 1, len(tokens[1]) - 1])
    logits = ours.compute_logits(ours(input_ids, positions, caches, metadata,
                                      **_encoder_kwargs(hf, encoder_inputs[2:])))
    torch.testing.assert_close(logits[:len(tokens[2])], _hf_logits(hf, encoder_inputs[2], tokens[2]),
                               rtol=0, atol=TOL)
    for row, i in enumerate((0, 1)):
        expected = _hf_logits(hf, encoder_inputs[i], tokens[i])[-1]
        torch.testing.assert_close(logits[len(tokens[2]) + row], expected, rtol=0, atol=TOL)


# ------------------------------------------------------------------------------------------- weight loading
@pytest.mark.parametrize("name", ["bart", "mbart", "whisper"])
def test_load_weights_is_strict(name):
    hf = _build_hf(name)
    cls = CASES[name][1]
    state = dict(hf.state_dict())
    tied = "proj_out.weight" if name == "whisper" else "lm_head.weight"

    # full state dict (tied copies included) and the saved form (tied copies absent) both load the same model
    full, saved = cls(hf.config), cls(hf.config)
    full.load_weights(state.items())
    saved.load_weights((k, v) for k, v in state.items()
                       if k != tied and not k.endswith("encoder.embed_tokens.weight")
                       and not (name != "whisper" and k.endswith("decoder.embed_tokens.weight")))
    for (key, a), (_, b) in zip(full.state_dict().items(), saved.state_dict().items()):
        assert torch.equal(a, b), key

    dropped = next(k for k in state if k.endswith("layers.1.encoder_attn.v_proj.weight"))
    with pytest.raises(ValueError, match="encoder_attn.v_proj.weight"):
        cls(hf.config).load_weights((k, v) for k, v in state.items() if k != dropped)
    with pytest.raises(ValueError, match="surprise.weight"):
        cls(hf.config).load_weights(list(state.items()) + [("model.decoder.surprise.weight", torch.zeros(2))])
    bad = next(k for k in state if k.endswith("layers.0.self_attn.k_proj.weight"))
    with pytest.raises(ValueError, match="self_attn.k_proj.weight"):
        cls(hf.config).load_weights((k, v[:-1] if k == bad else v) for k, v in state.items())


def test_whisper_has_no_k_proj_bias():
    hf = _build_hf("whisper")
    state = list(hf.state_dict().items())
    assert not any(k.endswith("k_proj.bias") for k, _ in state)
    with pytest.raises(ValueError, match="k_proj.bias"):
        WhisperForConditionalGeneration(hf.config).load_weights(
            state + [("model.decoder.layers.0.self_attn.k_proj.bias", torch.zeros(hf.config.d_model))])


def test_bart_base_model_checkpoint_names():
    """Checkpoints saved from the base model (names without "model.") load too (e.g. facebook/bart-base)."""
    hf = _build_hf("bart")
    ours = BartForConditionalGeneration(hf.config)
    ours.load_weights((k[len("model."):] if k.startswith("model.") else k, v) for k, v in hf.state_dict().items())
    torch.testing.assert_close(ours.model.shared.weight, hf.model.shared.weight, rtol=0, atol=0)


def test_whisper_rejects_wrong_frame_count():
    hf = _build_hf("whisper")
    ours = WhisperForConditionalGeneration(hf.config)
    ours.load_weights(hf.state_dict().items())
    metadata = prefill_metadata([1], 16, [[0]], encoder_lens=[50], cross_block_tables=[[1, 2, 3, 4]])
    with pytest.raises(ValueError, match="input features"):
        ours(torch.tensor([3]), torch.tensor([0]), None, metadata,
             encoder_features=torch.randn(1, hf.config.num_mel_bins, 99))
