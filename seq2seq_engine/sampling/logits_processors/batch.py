"""LogitsProcessorBatch: every logits processor of one step's sampled rows, built once from their SamplingParams and
token histories, then applied to any float [N, V] tensor in one call (raw logits for greedy/sampling, log-softmax
rows for beam search, as HF does).

Order, as HF's `_get_logits_processor` where HF has the processor:
  1. repetition_penalty over the decoder prompt + outputs (HF: positive logits divided, negative multiplied);
  2. presence / frequency penalties over the outputs (OpenAI/vLLM: subtracted);
  3. no_repeat_ngram_size and bad words -> -inf;
  4. forced BOS (decoder length 1), forced EOS (one token left before max_tokens or max_model_len);
  5. suppress_tokens, begin_suppress_tokens (first generated token) -> -inf;
  6. logit_bias added; 7. allowed_token_ids: every other token -> -inf;
  8. the request's own `logits_processors` callables, per row;
  9. the min_tokens ban (EOS and stop_token_ids -> -inf), last, so that nothing lifts it. A forced token that the
     ban covers is not forced (the row would have no finite logit left).
Everything is a handful of indexed tensor operations over (row, token) pairs collected once per step; no loop over
the vocabulary or over tokens.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from seq2seq_engine.sampling.logits_processors import collect
from seq2seq_engine.sampling.logits_processors.history import TokenHistories
from seq2seq_engine.sampling.metadata import to_device
from seq2seq_engine.sampling_params import SamplingParams

Pairs = Tuple[np.ndarray, np.ndarray]


def reads_history(params: SamplingParams) -> bool:
    """Whether rows with these params read their earlier tokens' values (penalties, n-gram and bad-word bans, user
    callables), not only how many there are."""
    return (params.repetition_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0
            or params.no_repeat_ngram_size > 0 or bool(params.bad_words_ids) or bool(params._bad_words_token_ids)
            or bool(params.logits_processors))


def always_processed(params: SamplingParams) -> bool:
    """Whether rows with these params have something to process at every length (all but the min_tokens ban): what
    reads earlier tokens, and what reads only their count (forced and suppressed tokens, logit bias, allowed ids)."""
    return (reads_history(params) or params.forced_bos_token_id is not None or params.forced_eos_token_id is not None
            or bool(params.suppress_tokens) or bool(params.begin_suppress_tokens) or bool(params.logit_bias)
            or params.allowed_token_ids is not None)


@dataclasses.dataclass
class LogitsProcessorBatch:
    """The processing of one step's N rows; `__call__(logits)` applies it in place and returns the tensor."""

    repetition: Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]] = None       # rows, tokens, penalty per pair
    presence_frequency: Optional[Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = None  # + presence, freq
    bans_before_forcing: Optional[Pairs] = None
    forced: Optional[Pairs] = None                                               # rows, forced token per row
    bans_after_forcing: Optional[Pairs] = None
    logit_bias: Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]] = None
    allowed: Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]] = None          # masked rows, allowed pairs
    callables: List[Tuple[int, List[int], List[Callable]]] = dataclasses.field(default_factory=list)
    min_tokens_bans: Optional[Pairs] = None

    @classmethod
    def build(cls, params: Sequence[SamplingParams], histories: TokenHistories, eos_token_id: Optional[int],
              max_model_len: Optional[int] = None) -> Optional["LogitsProcessorBatch"]:
        """None when no row has anything to process (then nothing else is built)."""
        output_lens = histories.output_lens
        groups = collect.active_groups(params, output_lens, always_processed)
        if not groups:
            return None
        batch = cls(
            repetition=collect.repetition(groups, histories),
            presence_frequency=collect.presence_frequency(groups, histories),
            bans_before_forcing=collect.concat_pairs(collect.ngram_bans(groups, histories),
                                                     collect.bad_word_bans(groups, histories, eos_token_id)),
            forced=collect.forced(groups, histories, max_model_len, eos_token_id),
            bans_after_forcing=collect.suppress_bans(groups, histories),
            logit_bias=collect.logit_bias(groups), allowed=collect.allowed(groups),
            callables=sorted((int(i), histories.output_token_ids[i], p.logits_processors)
                             for p, rows in groups if p.logits_processors for i in rows),
            min_tokens_bans=collect.min_tokens_bans(groups, output_lens, eos_token_id))
        return None if batch.is_empty() else batch

    def is_empty(self) -> bool:
        return not self.callables and all(getattr(self, f.name) is None for f in dataclasses.fields(self)
                                          if f.name != "callables")

    @torch.no_grad()
    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if not logits.is_contiguous():
            return logits.copy_(self(logits.contiguous()))
        # (row, token) pairs address the flat view: index_select / index_copy_ / index_fill_ / index_add_ on
        # it are single cheap kernels (2-D advanced indexing costs far more per call on CPU).
        flat, vocab, device = logits.view(-1), logits.shape[1], logits.device
        if self.repetition is not None:
            rows, tokens, penalty = self.repetition
            index, penalty = _index(rows, tokens, vocab, device), _values(penalty, logits)
            x = flat.index_select(0, index)
            # A repeated (row, token) pair writes the same value again, so each token is penalised once.
            flat.index_copy_(0, index, torch.where(x < 0, x * penalty, x / penalty))
        if self.presence_frequency is not None:
            rows, tokens, presence, frequency = self.presence_frequency
            index = _index(rows, tokens, vocab, device)
            flat.index_copy_(0, index, flat.index_select(0, index) - _values(presence, logits))  # once per token
            flat.index_add_(0, index, -_values(frequency, logits))                             # per occurrence
        _ban(flat, self.bans_before_forcing, vocab)
        if self.forced is not None:
            rows, tokens = self.forced
            logits.index_fill_(0, to_device(torch.from_numpy(rows), device), float("-inf"))
            flat.index_fill_(0, _index(rows, tokens, vocab, device), 0.0)
        _ban(flat, self.bans_after_forcing, vocab)
        if self.logit_bias is not None:
            rows, tokens, bias = self.logit_bias
            flat.index_add_(0, _index(rows, tokens, vocab, device), _values(bias, logits))
        if self.allowed is not None:
            masked_rows, rows, tokens = self.allowed
            index = _index(rows, tokens, vocab, device)
            kept = flat.index_select(0, index)
            logits.index_fill_(0, to_device(torch.from_numpy(masked_rows), device), float("-inf"))
            flat.index_copy_(0, index, kept)
        for row, output_token_ids, processors in self.callables:
            for processor in processors:
                logits[row] = processor(output_token_ids, logits[row])
        if self.min_tokens_bans is not None:
            rows, tokens = self.min_tokens_bans
            inside = tokens < vocab     # stop_token_ids are not vocab-checked; ids past it cannot occur anyway
            _ban(flat, (rows[inside], tokens[inside]), vocab)
        return logits


def _index(rows: np.ndarray, tokens: np.ndarray, vocab: int, device: torch.device) -> torch.Tensor:
    """Flat positions of (row, token) pairs in a contiguous [N, vocab] tensor."""
    return to_device(torch.from_numpy(rows * vocab + tokens), device)


def _values(values: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    return to_device(torch.from_numpy(values), like.device).to(like.dtype)


def _ban(flat: torch.Tensor, pairs: Optional[Pairs], vocab: int) -> None:
    if pairs is not None and len(pairs[0]):
        flat.index_fill_(0, _index(pairs[0], pairs[1], vocab, flat.device), float("-inf"))
