"""Tiny random HF text models of every family CTranslate2's converter handles, saved with a word-level tokenizer and
converted by CTranslate2's own TransformersConverter (the reference for seq2seq_engine.model_loader.ct2.text)."""
import json
import os

import torch
import transformers

VOCAB = 96
# (config class, model class, special tokens by id, config fields for the converter where transformers 5 lacks them)
_FAMILIES = {
    "bart": ("BartConfig", "BartForConditionalGeneration", {0: "<s>", 1: "<pad>", 2: "</s>", 3: "<unk>"},
             {"normalize_before": False, "add_final_layer_norm": False}),
    "mbart": ("MBartConfig", "MBartForConditionalGeneration", {0: "<s>", 1: "<pad>", 2: "</s>", 3: "<unk>"},
              {"normalize_before": True}),
    "m2m100": ("M2M100Config", "M2M100ForConditionalGeneration", {0: "<s>", 1: "<pad>", 2: "</s>", 3: "<unk>"}, {}),
    "pegasus": ("PegasusConfig", "PegasusForConditionalGeneration", {0: "<pad>", 1: "</s>", 2: "<unk>"},
                {"normalize_before": True, "normalize_embedding": False}),
    "marian": ("MarianConfig", "MarianMTModel", {0: "</s>", 1: "<unk>", VOCAB - 1: "<pad>"}, {}),
    "t5": ("T5Config", "T5ForConditionalGeneration", {0: "<pad>", 1: "</s>", 2: "<unk>"}, {}),
    "umt5": ("UMT5Config", "UMT5ForConditionalGeneration", {0: "<pad>", 1: "</s>", 2: "<unk>"}, {}),
}
FAMILIES = tuple(_FAMILIES)


def tokens_of(family):
    """The test vocabulary: the family's special tokens at their ids, SentencePiece-style pieces elsewhere."""
    special = _FAMILIES[family][2]
    return [special.get(i, f"▁w{i}") for i in range(VOCAB)]


def _ids(family):
    special = {token: i for i, token in _FAMILIES[family][2].items()}
    pad, eos = special["<pad>"], special["</s>"]
    start = eos if family in ("bart", "mbart", "m2m100") else pad
    return dict(pad_token_id=pad, eos_token_id=eos, decoder_start_token_id=start,
                bos_token_id=special.get("<s>"))


def tiny_config(family, tie=True):
    config_class = getattr(transformers, _FAMILIES[family][0])
    if family in ("t5", "umt5"):
        # equal layer counts: transformers 5.24's T5 cache breaks with more decoder than encoder layers
        fields = dict(d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2, num_heads=4,
                      feed_forward_proj="gated-gelu", relative_attention_num_buckets=8,
                      relative_attention_max_distance=16)
    else:
        fields = dict(d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
                      decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=56, max_position_embeddings=64,
                      scale_embedding=family != "bart", activation_function="gelu")
    if family in ("bart", "mbart"):
        fields.update(forced_bos_token_id=None, forced_eos_token_id=None)
    return config_class(vocab_size=VOCAB, tie_word_embeddings=tie, **fields, **_ids(family))


def _randomize(model, family, tie):
    """Every parameter random (biases and norms too, so a misplaced tensor changes the outputs); Marian's pad row
    zero and its logit very negative, as in trained Marian models; an untied T5 head of its own (transformers 5
    builds T5 heads tied whatever the config says; a checkpoint head that differs stays untied, as Flan-T5's)."""
    if family in ("t5", "umt5") and not tie:
        model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "embed_positions" in name and family not in ("bart", "mbart"):
                continue  # a sinusoid
            if "norm" in name and name.endswith("weight"):
                param.copy_(1 + 0.2 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.3 if "relative_attention_bias" in name else 0.08)
        if family == "marian":
            model.model.shared.weight[VOCAB - 1].zero_()
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.normal_(0.0, 0.3)
            if family == "marian":
                model.final_logits_bias[0, VOCAB - 1] = -1e4


def write_tokenizer(family, out_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    tokens = tokens_of(family)
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.Metaspace()
    special = {f"{name}_token": name_token for name, name_token in
               (("pad", "<pad>"), ("eos", "</s>"), ("unk", "<unk>"), ("bos", "<s>")) if name_token in tokens}
    transformers.PreTrainedTokenizerFast(tokenizer_object=backend, **special).save_pretrained(out_dir)


def tiny_hf_dir(family, out_dir, tie=True, seed=0):
    """A random HF model of `family` saved with save_pretrained, plus its word-level tokenizer."""
    torch.manual_seed(seed)
    model = getattr(transformers, _FAMILIES[family][1])(tiny_config(family, tie)).eval()
    _randomize(model, family, tie)
    model.save_pretrained(out_dir)
    write_tokenizer(family, out_dir)
    return str(out_dir)


def convert_with_ctranslate2(family, hf_dir, out_dir, quantization=None):
    """CTranslate2's TransformersConverter on `hf_dir` (config.json patched with the fields its loaders read)."""
    import ctranslate2
    extra = _FAMILIES[family][3]
    if extra:
        path = os.path.join(hf_dir, "config.json")
        with open(path) as f:
            config = json.load(f)
        with open(path, "w") as f:
            json.dump({**config, **extra}, f)
    ctranslate2.converters.TransformersConverter(hf_dir).convert(str(out_dir), quantization=quantization, force=True)
    return str(out_dir)
