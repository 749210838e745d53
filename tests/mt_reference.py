"""Tiny random Marian, M2M100 and Pegasus checkpoints (odd shapes: head size 12 or 13, odd d_model) saved with
`save_pretrained`, and offline sentencepiece tokenizers for them (Marian: source/target.spm + vocab.json with
`>>xx<<` codes; M2M100: spm + vocab.json, its language codes follow the vocabulary)."""
import json
import os
import shutil
from typing import Dict, Optional, Tuple

import torch
import transformers

_LAYERS = dict(encoder_layers=2, decoder_layers=2, encoder_ffn_dim=80, decoder_ffn_dim=56, init_std=0.2,
               max_position_embeddings=64)
MARIAN_LANGUAGE_TOKENS = (">>fr<<", ">>de<<")


def _marian(vocab_size: int, **overrides) -> transformers.PreTrainedModel:
    config = dict(vocab_size=vocab_size, d_model=36, encoder_attention_heads=3, decoder_attention_heads=3,
                  pad_token_id=vocab_size - 1, decoder_start_token_id=vocab_size - 1, eos_token_id=2,
                  forced_eos_token_id=None, scale_embedding=True, activation_function="swish", **_LAYERS)
    config.update(overrides)
    return transformers.MarianMTModel(transformers.MarianConfig(**config))


def _m2m100(vocab_size: int, **overrides) -> transformers.PreTrainedModel:
    config = dict(vocab_size=vocab_size, d_model=48, encoder_attention_heads=4, decoder_attention_heads=4,
                  pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, scale_embedding=True,
                  activation_function="relu", **_LAYERS)
    config.update(overrides)
    return transformers.M2M100ForConditionalGeneration(transformers.M2M100Config(**config))


def _pegasus(vocab_size: int, **overrides) -> transformers.PreTrainedModel:
    config = dict(vocab_size=vocab_size, d_model=39, encoder_attention_heads=3, decoder_attention_heads=3,
                  pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, forced_eos_token_id=None,
                  scale_embedding=True, activation_function="gelu", **_LAYERS)
    config.update(overrides)
    return transformers.PegasusForConditionalGeneration(transformers.PegasusConfig(**config))


FAMILIES = {"marian": _marian, "m2m100": _m2m100, "pegasus": _pegasus}
VARIANTS: Dict[str, Tuple[str, dict]] = {
    "marian": ("marian", {}),
    "marian-unshared": ("marian", dict(share_encoder_decoder_embeddings=False, d_model=39)),
    "marian-untied": ("marian", dict(tie_word_embeddings=False)),
    "m2m100": ("m2m100", {}),
    "m2m100-odd": ("m2m100", dict(d_model=39, encoder_attention_heads=3, decoder_attention_heads=3,
                                  activation_function="gelu")),
    "pegasus": ("pegasus", {}),
}


def build_hf(variant: str, vocab_size: int = 150, seed: int = 0, eos_likely: bool = False
             ) -> transformers.PreTrainedModel:
    """A random model of `variant` (eval mode) with a non-zero final_logits_bias where it has one; with
    `eos_likely` a push towards EOS baked into the weights (so that beams end early)."""
    family, overrides = VARIANTS[variant]
    torch.manual_seed(seed)
    model = FAMILIES[family](vocab_size, **overrides).eval()
    with torch.no_grad():
        eos = model.config.eos_token_id
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.normal_(0.0, 0.5)
            model.final_logits_bias[0, eos] += 4.0 if eos_likely else 0.0
        elif eos_likely:
            model.get_output_embeddings().weight[eos] *= 4.0
    return model


def save_model(variant: str, model_dir: str, tokenizer=None, vocab_size: Optional[int] = None,
               generation: Optional[dict] = None, eos_likely: bool = False) -> Tuple[str, transformers.PreTrainedModel]:
    """`build_hf(variant)` saved (with `tokenizer` and `generation` settings when given) under `model_dir`."""
    if vocab_size is None:
        vocab_size = 150 if tokenizer is None else tokenizer_vocab_size(tokenizer)
    model = build_hf(variant, vocab_size, eos_likely=eos_likely)
    if generation:
        model.generation_config.update(**generation)
    model.save_pretrained(model_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(model_dir)
    return model_dir, model


def tokenizer_vocab_size(tokenizer) -> int:
    """1 + the largest id the tokenizer can produce (M2M100's language ids are not in get_vocab())."""
    ids = list(tokenizer.get_vocab().values()) + list(getattr(tokenizer, "lang_code_to_id", {}).values())
    return 1 + max(ids + list(tokenizer.all_special_ids))


def marian_tokenizer(spm_model_file: str, folder: str) -> transformers.PreTrainedTokenizer:
    """MarianTokenizer over the test spm (as source and target) with `>>fr<<`/`>>de<<` at the end of its vocab."""
    import sentencepiece
    os.makedirs(folder, exist_ok=True)
    processor = sentencepiece.SentencePieceProcessor(model_file=spm_model_file)
    vocab = {processor.id_to_piece(i): i for i in range(processor.get_piece_size())}
    for token in MARIAN_LANGUAGE_TOKENS:
        vocab[token] = len(vocab)
    vocab["<marian_pad>"] = len(vocab)   # Marian puts pad last (= decoder_start_token_id)
    for name in ("source.spm", "target.spm"):
        shutil.copy(spm_model_file, os.path.join(folder, name))
    with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as handle:
        json.dump(vocab, handle)
    return transformers.MarianTokenizer(os.path.join(folder, "source.spm"), os.path.join(folder, "target.spm"),
                                        os.path.join(folder, "vocab.json"), unk_token="<unk>", eos_token="</s>",
                                        pad_token="<marian_pad>")


def m2m100_tokenizer(spm_model_file: str, folder: str) -> transformers.PreTrainedTokenizer:
    """M2M100Tokenizer over the test spm; its language tokens (`__fr__`, ...) get ids after the spm pieces."""
    import sentencepiece
    os.makedirs(folder, exist_ok=True)
    processor = sentencepiece.SentencePieceProcessor(model_file=spm_model_file)
    with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as handle:
        json.dump({processor.id_to_piece(i): i for i in range(processor.get_piece_size())}, handle)
    return transformers.M2M100Tokenizer(vocab_file=os.path.join(folder, "vocab.json"), spm_file=spm_model_file,
                                        src_lang="en", tgt_lang="fr")
