"""Per-sequence state: the status of a sequence and its token ids with the count already in the KV cache."""
from __future__ import annotations

import enum
from typing import List, Optional


class SequenceStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    SWAPPED = 2
    # Every status from here on is a finished one.
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5
    FINISHED_IGNORED = 6

    @staticmethod
    def is_finished(status: "SequenceStatus") -> bool:
        return status >= FIRST_FINISHED

    @staticmethod
    def get_finished_reason(status: "SequenceStatus") -> Optional[str]:
        return _FINISH_REASONS.get(status)


# The first finished status: `status >= FIRST_FINISHED` is is_finished, compared inline on per-step paths.
FIRST_FINISHED = SequenceStatus.FINISHED_STOPPED
_FINISH_REASONS = {
    SequenceStatus.FINISHED_STOPPED: "stop",
    SequenceStatus.FINISHED_LENGTH_CAPPED: "length",
    SequenceStatus.FINISHED_ABORTED: "abort",
    SequenceStatus.FINISHED_IGNORED: "length",
}


# The token id held, under asynchronous scheduling, where a token sampled by a step still running will go
# (engine/async_scheduling.py): never a real id, so a step that read it instead of the fed token fails loudly.
PLACEHOLDER_TOKEN_ID = -1


class SequenceStage(enum.Enum):
    PREFILL = enum.auto()
    DECODE = enum.auto()


class SequenceData:
    """Token ids of one sequence and how many of them already have K/V in the cache."""

    def __init__(self, prompt_token_ids: List[int], output_token_ids: Optional[List[int]] = None) -> None:
        self.prompt_token_ids: List[int] = list(prompt_token_ids)
        self.output_token_ids: List[int] = list(output_token_ids or [])
        self.cumulative_logprob = 0.0
        self._num_computed_tokens = 0
        self.stage = SequenceStage.PREFILL

    def append_token_id(self, token_id: int, logprob: float) -> None:
        self.output_token_ids.append(token_id)
        self.cumulative_logprob += logprob

    def append_placeholder(self) -> None:
        """The last token's K/V is being computed and the token it samples is not known yet: count the last token
        computed and hold PLACEHOLDER_TOKEN_ID for the next."""
        self.update_num_computed_tokens(1)
        self.output_token_ids.append(PLACEHOLDER_TOKEN_ID)

    def drop_placeholder(self) -> bool:
        """Undo `append_placeholder` (the sampled token is about to be appended as a synchronous step would);
        False, changing nothing, when the sequence holds no placeholder."""
        if not self.output_token_ids or self.output_token_ids[-1] != PLACEHOLDER_TOKEN_ID:
            return False
        self.output_token_ids.pop()
        self._num_computed_tokens -= 1
        return True

    def get_len(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def get_prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    def get_output_len(self) -> int:
        return len(self.output_token_ids)

    def get_token_ids(self) -> List[int]:
        return self.prompt_token_ids + self.output_token_ids

    def get_last_token_id(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    def get_num_computed_tokens(self) -> int:
        return self._num_computed_tokens

    def update_num_computed_tokens(self, num_new_computed_tokens: int) -> None:
        self._num_computed_tokens += num_new_computed_tokens
        length = len(self.prompt_token_ids) + len(self.output_token_ids)
        if self._num_computed_tokens > length:
            raise AssertionError(f"computed {self._num_computed_tokens} tokens of a {length}-token sequence")
        if self._num_computed_tokens == length:
            self.stage = SequenceStage.DECODE

    def reset_state_for_recompute(self) -> None:
        """Forget the cache: the whole sequence (prompt and outputs so far) is prefilled again."""
        self._num_computed_tokens = 0
        self.stage = SequenceStage.PREFILL

    def get_num_uncomputed_tokens(self) -> int:
        return self.get_len() - self._num_computed_tokens

    def copy(self) -> "SequenceData":
        clone = SequenceData(self.prompt_token_ids, self.output_token_ids)
        clone.cumulative_logprob = self.cumulative_logprob
        clone._num_computed_tokens = self._num_computed_tokens
        clone.stage = self.stage
        return clone

    def __repr__(self) -> str:
        return (f"SequenceData(prompt_len={self.get_prompt_len()}, output_len={self.get_output_len()}, "
                f"num_computed_tokens={self._num_computed_tokens})")
