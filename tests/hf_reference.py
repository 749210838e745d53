"""Tiny random-initialised HF checkpoints and a plain greedy loop over HF transformers' forward (the reference)."""
from typing import List, Optional, Tuple

import torch
import transformers


def _configs():
    common = dict(vocab_size=256, pad_token_id=1, bos_token_id=0, eos_token_id=2)
    return {
        "llama": lambda: transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                  num_attention_heads=4, num_key_value_heads=2,
                                                  max_position_embeddings=128, initializer_range=0.2, **common),
        "gpt2": lambda: transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                                initializer_range=0.2, **common),
        "opt": lambda: transformers.OPTConfig(hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                                              num_attention_heads=4, max_position_embeddings=128,
                                              word_embed_proj_dim=64, init_std=0.2, **common),
        "bart": lambda: transformers.BartConfig(d_model=64, encoder_layers=2, decoder_layers=2,
                                                encoder_attention_heads=4, decoder_attention_heads=4,
                                                encoder_ffn_dim=128, decoder_ffn_dim=128,
                                                max_position_embeddings=128, init_std=0.2,
                                                decoder_start_token_id=2, forced_bos_token_id=None, **common),
        "whisper": lambda: transformers.WhisperConfig(d_model=64, encoder_layers=2, decoder_layers=2,
                                                      encoder_attention_heads=4, decoder_attention_heads=4,
                                                      encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=80,
                                                      max_source_positions=50, max_target_positions=64,
                                                      init_std=0.2, decoder_start_token_id=3, vocab_size=256,
                                                      pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                                      suppress_tokens=[], begin_suppress_tokens=[]),
    }


_CLASSES = {"llama": transformers.LlamaForCausalLM, "gpt2": transformers.GPT2LMHeadModel,
            "opt": transformers.OPTForCausalLM, "bart": transformers.BartForConditionalGeneration,
            "whisper": transformers.WhisperForConditionalGeneration}


def build_tiny_model(arch: str, tmp_path, **overrides) -> Tuple[str, torch.nn.Module]:
    torch.manual_seed(0)
    config = _configs()[arch]()
    for name, value in overrides.items():
        setattr(config, name, value)
    model = _CLASSES[arch](config).eval()
    model_dir = str(tmp_path / arch)
    model.save_pretrained(model_dir)
    return model_dir, model


@torch.no_grad()
def hf_greedy(model, encoder_input: Optional[torch.Tensor], decoder_prompt: List[int], num_tokens: int,
              features: bool = False) -> Tuple[List[int], List[float]]:
    """Greedy tokens and their logprobs from full HF forwards (no generate() processors involved)."""
    tokens, logprobs = list(decoder_prompt), []
    encoder_kwargs = {}
    if encoder_input is not None:
        key = "input_features" if features else "input_ids"
        encoder_outputs = model.get_encoder()(**{key: encoder_input.unsqueeze(0)})
        encoder_kwargs = {"encoder_outputs": encoder_outputs}
    for _ in range(num_tokens):
        ids = torch.tensor([tokens])
        if encoder_input is not None:
            logits = model(decoder_input_ids=ids, **encoder_kwargs).logits[0, -1]
        else:
            logits = model(input_ids=ids).logits[0, -1]
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        token = int(torch.argmax(log_probs))
        tokens.append(token)
        logprobs.append(float(log_probs[token]))
    return tokens[len(decoder_prompt):], logprobs


def build_tiny_bart_with_tokenizer(tmp_path, tokenizer, **generation) -> Tuple[str, torch.nn.Module]:
    """A tiny random BART saved with `tokenizer` and a generation_config.json: forced BOS 0 (so HF's first new
    token is the engine's default decoder prompt [2, 0]) plus `generation` (num_beams, max_length, ...)."""
    model_dir, hf_model = build_tiny_model("bart", tmp_path, vocab_size=len(tokenizer))
    tokenizer.save_pretrained(model_dir)
    hf_model.generation_config.update(forced_bos_token_id=0, **generation)
    hf_model.generation_config.save_pretrained(model_dir)
    return model_dir, hf_model


def random_tokens(n: int, seed: int, low: int = 4, vocab_size: int = 256) -> List[int]:
    """`n` token ids in [low, vocab_size) from their own seeded generator (ids below `low` are the special ones)."""
    return torch.randint(low, vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
