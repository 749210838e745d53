"""Prompt logprobs and prompt-logits hooks in the model runner: which positions of a step's prefill chunks score a
decoder-prompt token (position p scores prompt token p + 1) or feed a hook, and the raw logits at those positions."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence as Seq, Tuple

import numpy as np
import torch

from seq2seq_engine.sampling.sampler import PromptLogprobsOutput
from seq2seq_engine.sequence import SequenceGroupMetadata

# Positions whose logits are materialised at once: bounds the [rows, vocab] float32 buffer of a long prompt.
_ROWS_PER_PASS = 1024


@dataclasses.dataclass
class PromptLogprobPlan:
    """A step's prompt-logprob work: per chunk, the request and the prompt tokens it scores; per scored token,
    its position in the step's flat batch and its id."""

    request_ids: List[str]
    first_token_indices: List[int]
    num_tokens: List[int]
    num_topk: List[int]
    flat_indices: torch.Tensor       # [T] int64
    target_token_ids: torch.Tensor   # [T] int64
    # SamplingParams.prompt_logits_hooks due this step: (position in the flat batch, fn).
    hooks: List[Tuple[int, Callable[[Any], None]]] = dataclasses.field(default_factory=list)

    def to(self, device: torch.device) -> None:
        self.flat_indices = self.flat_indices.to(device, non_blocking=True)
        self.target_token_ids = self.target_token_ids.to(device, non_blocking=True)


class PromptLogprobTracker:
    """Remembers, per prompt-running sequence, how many prompt positions were already scored (and up to where its
    hooks ran): a prompt prefilled again after preemption by recompute (also one preempted between chunks) is not
    scored, nor hooked, a second time."""

    def __init__(self) -> None:
        self._num_scored: Dict[int, int] = {}
        self._num_hooked: Dict[int, int] = {}

    def release(self, seq_ids: Iterable[int]) -> None:
        for seq_id in seq_ids:
            self._num_scored.pop(seq_id, None)
            self._num_hooked.pop(seq_id, None)

    def plan(self, prefills: Seq[SequenceGroupMetadata], num_computed: Seq[int],
             chunk_starts: Seq[int]) -> Optional[PromptLogprobPlan]:
        """The scoring work of the step's prefill chunks (prefills[i] starts at flat position chunk_starts[i]
        with num_computed[i] tokens already cached); None when no request asks for prompt logprobs or hooks."""
        chunks, flat_indices, targets, hooks = [], [np.zeros(0, dtype=np.int64)], [], []
        for group, computed, flat_start in zip(prefills, num_computed, chunk_starts):
            params = group.sampling_params
            if params is None or (params.prompt_logprobs is None and not params.prompt_logits_hooks):
                continue
            # A shared prompt (n/best_of) runs through its first sequence only (see ModelRunner._collect).
            seq_id, seq_data = next(iter(group.seq_data.items()))
            prompt = seq_data.prompt_token_ids
            computed, offset = int(computed), int(flat_start) - int(computed)
            if params.prompt_logits_hooks:
                hooks.extend(self._due_hooks(seq_id, params.prompt_logits_hooks, computed,
                                             min(computed + group.token_chunk_size, len(prompt)), offset))
            if params.prompt_logprobs is None:
                continue
            # The last prompt position predicts the first output token, not a prompt token; positions past the
            # prompt (a recomputed sequence's outputs) score nothing here.
            first = max(computed, self._num_scored.get(seq_id, 0))
            end = min(computed + group.token_chunk_size, len(prompt) - 1)
            if end <= first:
                continue
            self._num_scored[seq_id] = end
            chunks.append((group.request_id, first + 1, end - first, params.prompt_logprobs))
            flat_indices.append(np.arange(first + offset, end + offset, dtype=np.int64))
            targets.extend(prompt[first + 1:end + 1])
        if not chunks and not hooks:
            return None
        columns = [list(column) for column in zip(*chunks)] if chunks else [[], [], [], []]
        return PromptLogprobPlan(*columns, torch.from_numpy(np.concatenate(flat_indices)),
                                 torch.tensor(targets, dtype=torch.long), hooks)

    def _due_hooks(self, seq_id: int, hooks: Seq[Tuple[int, Callable[[Any], None]]], computed: int, end: int,
                   offset: int) -> List[Tuple[int, Callable[[Any], None]]]:
        """The hooks whose positions this chunk [computed, end) prefills for the first time, at flat positions."""
        first = max(computed, self._num_hooked.get(seq_id, 0))
        self._num_hooked[seq_id] = max(end, self._num_hooked.get(seq_id, 0))
        return [(position + offset, fn) for position, fn in hooks if first <= position < end]


def run_prompt_logits_hooks(plan: PromptLogprobPlan, hidden_states: torch.Tensor,
                            compute_logits: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Call each due hook with the raw logits row [vocab] at its position."""
    if not plan.hooks:
        return
    index = torch.tensor([position for position, _ in plan.hooks], dtype=torch.long, device=hidden_states.device)
    logits = compute_logits(hidden_states[index])
    for row, (_, fn) in zip(logits, plan.hooks):
        fn(row)


def compute_prompt_logprobs(plan: PromptLogprobPlan, hidden_states: torch.Tensor,
                            compute_logits: Callable[[torch.Tensor], torch.Tensor]) -> Optional[PromptLogprobsOutput]:
    """Runs the plan's hooks, then log_softmax of the raw logits (no logits processors, as vLLM) at the planned
    positions: each scored token's logprob and, when any chunk asks for k > 0, the top max(k) (logprob, token id)
    pairs; None when the plan has only hooks."""
    run_prompt_logits_hooks(plan, hidden_states, compute_logits)
    if not plan.request_ids:
        return None
    max_topk = max(plan.num_topk)
    token_logprobs: List[torch.Tensor] = []
    topk_logprobs: List[torch.Tensor] = []
    topk_token_ids: List[torch.Tensor] = []
    for start in range(0, len(plan.flat_indices), _ROWS_PER_PASS):
        rows = slice(start, start + _ROWS_PER_PASS)
        logprobs = torch.log_softmax(compute_logits(hidden_states[plan.flat_indices[rows]]).float(), dim=-1)
        token_logprobs.append(logprobs.gather(1, plan.target_token_ids[rows].unsqueeze(1)).squeeze(1))
        if max_topk:
            values, ids = logprobs.topk(min(max_topk, logprobs.shape[1]), dim=-1)
            topk_logprobs.append(values)
            topk_token_ids.append(ids)
    return PromptLogprobsOutput(
        request_ids=plan.request_ids, first_token_indices=plan.first_token_indices, num_tokens=plan.num_tokens,
        num_topk=plan.num_topk, token_ids=plan.target_token_ids, token_logprobs=torch.cat(token_logprobs),
        topk_logprobs=torch.cat(topk_logprobs) if max_topk else None,
        topk_token_ids=torch.cat(topk_token_ids) if max_topk else None)
