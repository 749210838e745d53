"""A model step that fails: find the requests that make it fail and run the rest, so one request never fails a batch.

When the batched step raises, each request's part of it runs alone to find the ones that fail by themselves; the
step then runs again without them. Random number generators (torch's global one and each seeded request's) are put
back after every trial run, so the others sample exactly what they would have sampled in one clean step; their KV
writes in the trials are the same values the final run writes again. Where no request fails alone, the batch's own
error is raised: there is nobody to blame, and the engine's owner decides (the server fails what was in flight).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from seq2seq_engine.sequence import SequenceGroupMetadata

logger = logging.getLogger(__name__)

StepResult = Tuple[List[int], Any]


def describe(error: BaseException) -> str:
    """The error as a request's failure reason."""
    return f"{type(error).__name__}: {error}"


class _RandomState:
    """The global torch RNG and the step's per-request generators, saved once and restored after each trial."""

    def __init__(self, generators: Sequence[Optional[torch.Generator]]) -> None:
        self._global = torch.get_rng_state()
        self._generators = [(g, g.get_state()) for g in {id(g): g for g in generators if g is not None}.values()]

    def restore(self) -> None:
        torch.set_rng_state(self._global)
        for generator, state in self._generators:
            generator.set_state(state)


def execute_isolating_failures(execute: Callable[[List[SequenceGroupMetadata]], StepResult],
                               metadata_list: List[SequenceGroupMetadata]) -> Tuple[StepResult, Dict[str, str]]:
    """`execute(metadata_list)`'s result and {} when it succeeds; otherwise the result of the step without the
    requests that fail alone, and {request_id: reason} of those."""
    state = _RandomState([metadata.generator for metadata in metadata_list])
    try:
        return execute(metadata_list), {}
    except Exception as batch_error:
        if len(metadata_list) == 1:
            logger.exception("request %s failed its step", metadata_list[0].request_id)
            return ([], None), {metadata_list[0].request_id: describe(batch_error)}
        failed = _failing_alone(execute, metadata_list, state)
        if not failed:
            raise
        logger.error("a step failed; running it again without the requests that fail alone: %s", failed)
    state.restore()
    remaining = [metadata for metadata in metadata_list if metadata.request_id not in failed]
    return (execute(remaining) if remaining else ([], None)), failed


def _failing_alone(execute: Callable[[List[SequenceGroupMetadata]], StepResult],
                   metadata_list: List[SequenceGroupMetadata], state: _RandomState) -> Dict[str, str]:
    failed: Dict[str, str] = {}
    for metadata in metadata_list:
        state.restore()
        try:
            execute([metadata])
        except Exception as error:
            failed[metadata.request_id] = describe(error)
    return failed
