"""Decides, after each new token, whether a sequence is finished (vLLM's stop rules)."""
from __future__ import annotations

from typing import List, Optional, Tuple

from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.sequence import Sequence, SequenceStatus


class StopChecker:
    """Sets seq.status (FINISHED_STOPPED / FINISHED_LENGTH_CAPPED) and seq.stop_reason after a new token.

    In order: length caps always apply (the sequence reaching max_model_len tokens, prompt included, or
    max_tokens output tokens); before min_tokens output tokens nothing else stops the sequence; then EOS (unless
    ignore_eos; stop_reason None), a stop token id (stop_reason = the id), a stop string (stop_reason = the
    string). A stop (EOS, stop token or stop string) wins over a length cap reached by the same token.
    """

    def __init__(self, max_model_len: int, eos_token_id: Optional[int] = None) -> None:
        self.max_model_len = max_model_len
        self.eos_token_id = eos_token_id

    def maybe_stop_sequence(self, seq: Sequence, new_char_count: int, sampling_params: SamplingParams) -> None:
        if seq.get_output_len() >= sampling_params.min_tokens and self._check_stop(seq, new_char_count,
                                                                                   sampling_params):
            return
        if seq.get_len() >= self.max_model_len:
            seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED
        elif sampling_params.max_tokens is not None and seq.get_output_len() >= sampling_params.max_tokens:
            seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED

    def _check_stop(self, seq: Sequence, new_char_count: int, params: SamplingParams) -> bool:
        last_token_id = seq.get_last_token_id()
        eos_token_id = self.eos_token_id if self.eos_token_id is not None else seq.eos_token_id
        if not params.ignore_eos and eos_token_id is not None and last_token_id == eos_token_id:
            # The EOS token's text (when special tokens are not skipped) is not part of the output.
            self._drop_new_text(seq, new_char_count, params)
            seq.status = SequenceStatus.FINISHED_STOPPED
            seq.stop_reason = None
            return True
        if last_token_id in params.stop_token_ids:
            self._drop_new_text(seq, new_char_count, params)
            seq.status = SequenceStatus.FINISHED_STOPPED
            seq.stop_reason = last_token_id
            return True
        if not params.stop:
            return False
        found = self.check_stop_strings(seq.output_text, new_char_count, params.stop,
                                        params.include_stop_str_in_output)
        if found is not None:
            stop_str, truncate_to = found
            seq.output_text = seq.output_text[:truncate_to]
            seq.status = SequenceStatus.FINISHED_STOPPED
            seq.stop_reason = stop_str
            return True
        return False

    @staticmethod
    def _drop_new_text(seq: Sequence, new_char_count: int, params: SamplingParams) -> None:
        if new_char_count and not params.include_stop_str_in_output:
            seq.output_text = seq.output_text[:-new_char_count]

    @staticmethod
    def check_stop_strings(output_text: str, new_char_count: int, stop: List[str],
                           include_in_output: bool) -> Optional[Tuple[str, int]]:
        """The stop string that occurs first among those overlapping the last new_char_count characters, and
        the length to cut output_text to (before it, or after it with include_in_output); None if none does.

        Only the new text and the max-stop-length - 1 characters before it are searched: earlier text was
        searched when it arrived (or came before min_tokens, where stop strings do not count).
        """
        if not new_char_count or not stop:
            return None
        text_len = len(output_text)
        new_start = text_len - new_char_count
        best: Optional[Tuple[int, str]] = None
        for stop_str in stop:
            index = output_text.find(stop_str, max(new_start - len(stop_str) + 1, 0))
            if index == -1:
                continue
            if best is None or index < best[0]:  # ties: the first in the list, as in vLLM
                best = (index, stop_str)
        if best is None:
            return None
        index, stop_str = best
        return stop_str, index + len(stop_str) if include_in_output else index
