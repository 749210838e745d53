"""Tokens sampled by the step before, still on the device, written into the inputs of a step launched before they
reached the host (asynchronous scheduling)."""
from __future__ import annotations

import dataclasses
from typing import Dict, List

import torch


@dataclasses.dataclass(frozen=True)
class TokenFeed:
    """The previous step's sampled token ids (on the device) and each sequence's row among them."""

    token_ids: torch.Tensor
    row_of_seq: Dict[int, int]

    def write_inputs(self, input_ids: torch.Tensor, sampled_seq_ids: List[int]) -> None:
        """Write each fed sequence's pending token into its input: in a step of decodes only, flat position i is
        the input of sampled sequence i. Sequences not fed keep the token the host wrote (a CUDA graph's padding
        rows, after them all, too)."""
        if input_ids.shape[0] < len(sampled_seq_ids):
            raise AssertionError(f"a fed step has {input_ids.shape[0]} input tokens for {len(sampled_seq_ids)} "
                                 "sequences")
        row_of_seq = self.row_of_seq
        positions = [position for position, seq_id in enumerate(sampled_seq_ids) if seq_id in row_of_seq]
        rows = [row_of_seq[sampled_seq_ids[position]] for position in positions]
        if not rows:
            return
        if rows == positions and positions[-1] == len(positions) - 1:
            # the same sequences in the same order, from the first: one slice, no gather
            input_ids[:len(rows)].copy_(self.token_ids[:len(rows)])
            return
        device = self.token_ids.device
        input_ids[torch.tensor(positions, dtype=torch.long, device=input_ids.device)] = (
            self.token_ids[torch.tensor(rows, dtype=torch.long, device=device)])
