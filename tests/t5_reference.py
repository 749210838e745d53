"""Tiny random T5-family checkpoints (T5 v1.0, T5 v1.1, mT5, UMT5) saved with `save_pretrained`, in unusual shapes:
odd head sizes, num_heads * d_kv != d_model, few buckets, a short max_distance, more decoder than encoder layers;
one (flan-t5) keeps the released models' d_model == num_heads * d_kv, where cross-attention reads the encoder
states themselves."""
from typing import Tuple

import safetensors.torch
import torch
import transformers

VOCAB = 96
EOS = 2            # the id generate_reference.hf_beam_generate stops on
COMMON = dict(vocab_size=VOCAB, num_layers=2, num_decoder_layers=3, decoder_start_token_id=0, pad_token_id=0,
              eos_token_id=EOS, initializer_factor=1.5, relative_attention_max_distance=20)

VARIANTS = {
    # v1.0: ReLU, head tied to the embeddings with the d_model ** -0.5 output scale; 5 heads x 12 = 60 != 40
    "t5": (transformers.T5Config, transformers.T5ForConditionalGeneration,
           dict(d_model=40, d_kv=12, d_ff=56, num_heads=5, relative_attention_num_buckets=8)),
    # v1.1 / Flan-T5: gated-GELU, own lm_head, no output scale; 3 heads x 20 = 60 != 48, 6 buckets
    "t5-v1.1": (transformers.T5Config, transformers.T5ForConditionalGeneration,
                dict(d_model=48, d_kv=20, d_ff=40, num_heads=3, relative_attention_num_buckets=6,
                     feed_forward_proj="gated-gelu", tie_word_embeddings=False)),
    "mt5": (transformers.MT5Config, transformers.MT5ForConditionalGeneration,
            dict(d_model=32, d_kv=12, d_ff=48, num_heads=4, relative_attention_num_buckets=10,
                 feed_forward_proj="gated-gelu", tie_word_embeddings=False)),
    # Flan-T5's geometry: 3 heads x 16 = 48 = d_model, so cross-attention attends to the encoder states
    "flan-t5": (transformers.T5Config, transformers.T5ForConditionalGeneration,
                dict(d_model=48, d_kv=16, d_ff=40, num_heads=3, relative_attention_num_buckets=6,
                     feed_forward_proj="gated-gelu", tie_word_embeddings=False)),
    # UMT5: one bias table per block
    "umt5": (transformers.UMT5Config, transformers.UMT5ForConditionalGeneration,
             dict(d_model=40, d_kv=12, d_ff=48, num_heads=4, relative_attention_num_buckets=8,
                  feed_forward_proj="gated-gelu", tie_word_embeddings=False)),
}


def build_tiny_t5(variant: str, tmp_path, vocab_size: int = VOCAB) -> Tuple[str, torch.nn.Module]:
    """(model directory, HF model loaded back from it). The bias tables get a wide spread so that positions
    matter; untied variants get an lm_head.weight of their own in the checkpoint (transformers builds the head
    tied and keeps a differing checkpoint head untied on load). That head is small (std 0.1, logits of a few
    units): with std 0.5, HF's own float32 logprobs moved from float64's by up to 2.2e-4, more than the 1e-4 the
    tests hold us to, so the tests compared rounding orders rather than computations (docs/decisions.md §41)."""
    config_class, model_class, shape = VARIANTS[variant]
    torch.manual_seed(0)
    model = model_class(config_class(**{**COMMON, "vocab_size": vocab_size}, **shape)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "relative_attention_bias" in name:
                param.normal_(0.0, 1.0)
    model_dir = str(tmp_path / variant)
    model.save_pretrained(model_dir)
    if shape.get("tie_word_embeddings") is False:
        path = f"{model_dir}/model.safetensors"
        weights = safetensors.torch.load_file(path)
        weights["lm_head.weight"] = torch.randn(vocab_size, shape["d_model"]) * 0.1
        safetensors.torch.save_file(weights, path, metadata={"format": "pt"})
    return model_dir, model_class.from_pretrained(model_dir).eval()
