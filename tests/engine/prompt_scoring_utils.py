"""Helpers shared by the prompt-logprob and prompt-logits-hook tests: random prompts, a small engine, HF's logits."""
import torch

from seq2seq_engine import LLM


def random_tokens(n, seed, vocab=256):
    return torch.randint(4, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def small_llm(model_dir, **kwargs):
    return LLM(model_dir, skip_tokenizer_init=True, dtype="float32", block_size=4,
               kv_cache_space_gb=kwargs.pop("kv_cache_space_gb", 0.05), **kwargs)


@torch.no_grad()
def hf_decoder_logits(hf_model, decoder_tokens, encoder_tokens=None):
    """HF's float32 logits over a whole decoder sequence: row p scores token p + 1."""
    if encoder_tokens is None:
        return hf_model(input_ids=torch.tensor([decoder_tokens])).logits[0].float()
    return hf_model(input_ids=torch.tensor([encoder_tokens]), decoder_input_ids=torch.tensor([decoder_tokens])
                    ).logits[0].float()
