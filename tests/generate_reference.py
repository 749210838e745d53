"""HF `generate` as the reference of engine parity tests: one prompt at a time with explicit special tokens (greedy
or beam search), tiny models made to emit EOS often, and mixed-length BART / Llama prompts."""
from typing import List, Optional, Tuple

import torch

from seq2seq_engine import TokensPrompt
from seq2seq_engine.inputs.data import ExplicitEncoderDecoderPrompt

EOS = 2


def make_eos_likely(arch, model):
    """Bake a push towards EOS into the weights, so that stopping (and min_tokens) matter."""
    with torch.no_grad():
        if arch == "bart":
            model.final_logits_bias[0, EOS] += 4.0
        else:
            model.lm_head.weight[EOS] *= 4.0


def bart_requests(config, generator):
    """8 (engine prompt, encoder ids, decoder prompt): default decoder prompt [2, 0], explicit [2] (a forced BOS
    applies) and longer explicit ones; encoders of 5 to 33 tokens."""
    requests = []
    for i in range(8):
        encoder = torch.randint(4, config.vocab_size, (5 + 4 * i,), generator=generator).tolist()
        extra = torch.randint(4, config.vocab_size, (i % 3 + 1,), generator=generator).tolist()
        decoder = [[2, 0], [2], [2] + extra][i % 3]
        prompt = TokensPrompt(prompt_token_ids=encoder)
        if decoder != [2, 0]:
            prompt = ExplicitEncoderDecoderPrompt(encoder_prompt=prompt,
                                                  decoder_prompt=TokensPrompt(prompt_token_ids=decoder))
        requests.append((prompt, encoder, decoder))
    return requests


def llama_requests(config, generator):
    """8 (engine prompt, None, prompt) of 1 to 20 tokens (three of length 1: a forced BOS applies)."""
    lengths = [1, 6, 1, 13, 3, 1, 9, 20]
    return [(TokensPrompt(prompt_token_ids=p), None, p)
            for p in (torch.randint(4, config.vocab_size, (n,), generator=generator).tolist() for n in lengths)]


@torch.no_grad()
def hf_beam_generate(model, encoder: Optional[List[int]], decoder_prompt: List[int],
                     **kwargs) -> List[Tuple[List[int], Optional[float]]]:
    """HF generate for one prompt: each returned sequence's generated tokens (padding dropped) and, for beam search,
    its sequences_scores, best first. `kwargs` go to generate (they win over the model's generation config, even a
    None: e.g. forced_eos_token_id=None)."""
    kwargs = dict(do_sample=False, eos_token_id=EOS, pad_token_id=1, bos_token_id=0, return_dict_in_generate=True,
                  output_scores=True, decoder_start_token_id=getattr(model.config, "decoder_start_token_id", None),
                  **kwargs)
    ids = torch.tensor([decoder_prompt])
    if encoder is not None:
        out = model.generate(input_ids=torch.tensor([encoder]), decoder_input_ids=ids, **kwargs)
    else:
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
    start = len(decoder_prompt)
    if kwargs.get("num_beams", 1) == 1:
        return [(out.sequences[0, start:].tolist(), None)]
    lengths = (out.beam_indices != -1).sum(dim=1).tolist()
    return [(out.sequences[b, start:start + n].tolist(), float(out.sequences_scores[b]))
            for b, n in enumerate(lengths)]


def hf_greedy_generate(model, encoder: Optional[List[int]], decoder_prompt: List[int], **kwargs) -> List[int]:
    """HF greedy generate for one prompt: the generated tokens."""
    return hf_beam_generate(model, encoder, decoder_prompt, num_beams=1, **kwargs)[0][0]
