"""Random-weight text models for the generation benchmarks, saved in HF format and converted for CTranslate2.

Shapes: BART-base, Marian-base (opus-mt, the model of CTranslate2's own translation benchmark), Flan-T5-base and
SmolLM2-135M (a Llama). The same saved weights feed every engine: this engine and HF read the HF directory,
CTranslate2 the directory its own converter makes from it.
"""
from __future__ import annotations

import json
import os

import torch
import transformers

# special token ids of each random model: the tokenizer written for CTranslate2's converter names them alike
SPECIAL_IDS = {"bart": dict(bos=0, pad=1, eos=2, unk=3), "llama": dict(bos=0, pad=1, eos=2, unk=3),
               "marian": dict(bos=None, pad=58100, eos=0, unk=1), "t5": dict(bos=None, pad=0, eos=1, unk=2)}
# config.json fields CTranslate2 4.8.5's converter reads and transformers-5 configs lack
CT2_CONFIG_FIELDS = {"bart": dict(normalize_before=False, add_final_layer_norm=False)}


def _config(kind: str, init_std: float, tie: bool):
    if kind == "bart":
        return transformers.BartConfig(d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
                                       decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072,
                                       vocab_size=50265, max_position_embeddings=1024, forced_bos_token_id=None,
                                       forced_eos_token_id=None, init_std=init_std, tie_word_embeddings=tie)
    if kind == "marian":  # Helsinki-NLP/opus-mt-en-de's shape
        return transformers.MarianConfig(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                                         decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                                         vocab_size=58101, decoder_vocab_size=58101, max_position_embeddings=512,
                                         activation_function="swish", scale_embedding=True, pad_token_id=58100,
                                         decoder_start_token_id=58100, eos_token_id=0, forced_eos_token_id=None,
                                         init_std=init_std, tie_word_embeddings=tie)
    if kind == "t5":  # google/flan-t5-base's shape
        return transformers.T5Config(d_model=768, d_kv=64, d_ff=2048, num_layers=12, num_decoder_layers=12,
                                     num_heads=12, feed_forward_proj="gated-gelu", vocab_size=32128, pad_token_id=0,
                                     eos_token_id=1, decoder_start_token_id=0, initializer_factor=init_std / 0.02,
                                     tie_word_embeddings=tie)
    return transformers.LlamaConfig(hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                                    num_key_value_heads=3, intermediate_size=1536, vocab_size=49152,
                                    tie_word_embeddings=tie, max_position_embeddings=8192, rope_theta=100000.0,
                                    rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=2, pad_token_id=1,
                                    initializer_range=init_std)


def _marian_pad_row(model) -> None:
    """Marian's decoder starts from the `<pad>` row, which trained models keep at zero and never generate (their
    generation config bans it): zero rows here, and a very negative logit bias (CTranslate2 drops the token)."""
    with torch.no_grad():
        pad = model.config.pad_token_id
        for module in (model.model.shared, model.model.encoder.embed_tokens, model.model.decoder.embed_tokens,
                       model.lm_head):
            module.weight[pad].zero_()
        model.final_logits_bias[0, pad] = -1e4


def random_model(kind: str, seed: int, init_std: float, tie: bool, out_dir: str) -> str:
    """A model of shape `kind` (bart, marian, t5 or llama) with random weights (fixed seed), saved in HF format.
    Tied to the embeddings, a random LM head's argmax is the input token itself (the residual stream dominates),
    so every output repeats one token; an untied one (same matmul shapes) gives varied outputs."""
    torch.manual_seed(seed)
    config = _config(kind, init_std, tie)
    model_class = {"bart": transformers.BartForConditionalGeneration, "marian": transformers.MarianMTModel,
                   "t5": transformers.T5ForConditionalGeneration}.get(kind, transformers.LlamaForCausalLM)
    model = model_class(config)
    if kind == "marian":
        _marian_pad_row(model)
    if kind == "t5" and not tie:  # transformers 5 ties T5 heads whatever the config says; Flan-T5's has its own
        model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.lm_head.weight) * init_std / 0.02)
    model_dir = os.path.join(out_dir, kind)
    model.eval().save_pretrained(model_dir)
    return model_dir


def word_level_tokenizer(kind: str, vocab_size: int, out_dir: str) -> None:
    """A tokenizer with one token "t<id>" per id (Marian's pad named "<pad>", as its converter expects): CTranslate2's
    converter needs one, and ids map to themselves."""
    from tokenizers import Tokenizer, models
    ids = SPECIAL_IDS[kind]
    tokens = [f"t{i}" for i in range(vocab_size)]
    tokens[ids["pad"]] = "<pad>" if kind == "marian" else tokens[ids["pad"]]
    special = {f"{name}_token": tokens[i] for name, i in ids.items() if i is not None}
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token=special["unk_token"]))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **special)
    tokenizer.save_pretrained(out_dir)


def convert_ct2(model_dir: str, out_dir: str) -> str:
    """CTranslate2's own converter on a staging copy of the HF directory (links to the weights, a config that
    CT2 4.8.5 can read for transformers-5 BART, a word-level tokenizer where the model has none)."""
    import ctranslate2
    stage = os.path.join(out_dir, "stage")
    os.makedirs(stage, exist_ok=True)
    for name in os.listdir(model_dir):
        os.symlink(os.path.join(model_dir, name), os.path.join(stage, name))
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    kind = {"bart": "bart", "marian": "marian", "t5": "t5"}.get(config["model_type"], "llama")
    if kind in CT2_CONFIG_FIELDS:
        os.remove(os.path.join(stage, "config.json"))
        with open(os.path.join(stage, "config.json"), "w") as f:
            json.dump({**config, **CT2_CONFIG_FIELDS[kind]}, f)
    if not os.path.exists(os.path.join(model_dir, "tokenizer.json")):
        word_level_tokenizer(kind, config["vocab_size"], stage)
    target = os.path.join(out_dir, "ct2")
    ctranslate2.converters.TransformersConverter(stage).convert(target, quantization=None, force=True)
    return target
