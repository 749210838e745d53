"""A reference beam search for one prompt: the loop of transformers' `GenerationMixin._beam_search`, driven through
HF's own helper functions, over any `logprob_fn(tokens) -> [vocab] log-probs` instead of a model."""
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from transformers.generation.utils import GenerationMixin as HF

LogprobFn = Callable[[List[int]], torch.Tensor]


def hf_beam_search(logprob_fn: LogprobFn, prompt: Sequence[int], num_beams: int, max_new_tokens: int,
                   length_penalty: float, early_stopping: Union[bool, str], eos_token_ids: Sequence[int],
                   pad_token_id: int = 1) -> List[Tuple[List[int], float]]:
    """The num_beams finished hypotheses (generated tokens, sequences_scores), best first, as HF returns them."""
    cur_len = prompt_len = len(prompt)
    max_length = prompt_len + max_new_tokens
    eos = torch.tensor(list(eos_token_ids), dtype=torch.long)
    beams_to_keep = max(2, 1 + len(eos_token_ids)) * num_beams
    top_num_beam_mask = torch.arange(beams_to_keep) < num_beams
    running_sequences = torch.full((1, num_beams, max_length), pad_token_id, dtype=torch.long)
    running_sequences[:, :, :cur_len] = torch.tensor(list(prompt))
    sequences = running_sequences.clone()
    running_beam_scores = torch.zeros(1, num_beams)
    running_beam_scores[:, 1:] = -1e9
    beam_scores = torch.full((1, num_beams), -1e9)
    is_sent_finished = torch.zeros(1, num_beams, dtype=torch.bool)
    unsatisfied = torch.ones(1, 1, dtype=torch.bool)
    running_beam_indices = torch.full((1, num_beams, max_new_tokens), -1, dtype=torch.int32)
    beam_indices = running_beam_indices.clone()
    while True:
        log_probs = torch.stack([logprob_fn(running_sequences[0, b, :cur_len].tolist()) for b in range(num_beams)])
        log_probs = (log_probs[None] + running_beam_scores[:, :, None]).reshape(1, -1)
        topk_log_probs, topk_sequences, topk_beam_indices = HF._get_top_k_continuations(
            HF, log_probs, running_sequences, running_beam_indices, cur_len, prompt_len, False, beams_to_keep,
            num_beams, 1)
        # HF's MaxLengthCriteria and EosTokenCriteria on each candidate.
        hits = torch.isin(topk_sequences[:, :, cur_len], eos) | (cur_len + 1 >= max_length)
        running_sequences, running_beam_scores, running_beam_indices = HF._get_running_beams_for_next_iteration(
            HF, topk_log_probs, topk_sequences, topk_beam_indices, hits, num_beams)
        sequences, beam_scores, beam_indices, is_sent_finished = HF._update_finished_beams(
            HF, sequences, topk_sequences, beam_scores, topk_log_probs, beam_indices, topk_beam_indices, unsatisfied,
            is_sent_finished, hits, top_num_beam_mask, num_beams, cur_len, prompt_len, length_penalty,
            early_stopping)
        cur_len += 1
        unsatisfied = HF._check_early_stop_heuristic(unsatisfied, running_beam_scores, beam_scores, is_sent_finished,
                                                     cur_len, max_length, prompt_len, early_stopping, length_penalty)
        if not HF._beam_search_has_unfinished_sequences(unsatisfied, is_sent_finished, hits, early_stopping):
            break
    lengths = (beam_indices[0] != -1).sum(dim=1).tolist()
    return [(sequences[0, b, prompt_len:prompt_len + lengths[b]].tolist(), float(beam_scores[0, b]))
            for b in range(num_beams)]


def random_logprob_fn(vocab_size: int, seed: int, sharpness: float = 3.0,
                      boost: Optional[Dict[int, float]] = None) -> LogprobFn:
    """A fake model: fixed random log-probs for every prefix (float32, like a model's log_softmax); `boost` adds
    to the logits of some tokens (to make a stop token likely)."""
    def logprob_fn(tokens: List[int]) -> torch.Tensor:
        generator = torch.Generator().manual_seed(hash((seed, tuple(tokens))) % (2 ** 62))
        logits = sharpness * torch.randn(vocab_size, generator=generator)
        for token, value in (boost or {}).items():
            logits[token] += value
        return torch.log_softmax(logits, dim=-1)
    return logprob_fn
