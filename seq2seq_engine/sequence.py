"""Sequences and sequence groups: a request's decoder sequences beside its static encoder sequence."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

from seq2seq_engine.inputs.data import EncoderDecoderInputs, SingletonInputs
from seq2seq_engine.sampling.beam_search import BeamSearchState
from seq2seq_engine.sampling_params import SamplingParams
# SequenceData and SequenceStatus are re-exported: most callers import them from here.
from seq2seq_engine.sequence_data import FIRST_FINISHED, SequenceData, SequenceStage, SequenceStatus


class Sequence:
    """One token sequence: a decoder sequence that grows, or a request's static encoder sequence."""

    def __init__(self, seq_id: int, inputs: SingletonInputs, block_size: int,
                 eos_token_id: Optional[int] = None) -> None:
        self.seq_id = seq_id
        self.inputs = inputs
        self.block_size = block_size
        self.eos_token_id = eos_token_id
        self.data = SequenceData(list(inputs.prompt_token_ids))
        self.status = SequenceStatus.WAITING
        self.stop_reason: Optional[Any] = None
        self.output_text = ""
        self.output_logprobs: List[Dict[int, float]] = []
        # Incremental detokenizer state.
        self.tokens: Optional[List[str]] = None
        self.prefix_offset = 0
        self.read_offset = 0
        # Chained content hashes of the sequence's first full blocks (core/content_keys.py), extended as needed.
        self.block_hashes: List[bytes] = []

    @property
    def prompt(self) -> Optional[str]:
        return self.inputs.prompt

    @property
    def prompt_token_ids(self) -> List[int]:
        return self.data.prompt_token_ids

    @property
    def n_blocks(self) -> int:
        """Blocks needed to hold K/V for every token of the sequence."""
        return -(-self.data.get_len() // self.block_size)

    def get_len(self) -> int:
        return self.data.get_len()

    def get_token_ids(self) -> List[int]:
        return self.data.get_token_ids()

    def get_output_len(self) -> int:
        return self.data.get_output_len()

    def get_last_token_id(self) -> int:
        return self.data.get_last_token_id()

    def append_token_id(self, token_id: int, logprobs: Dict[int, float]) -> None:
        self.output_logprobs.append(logprobs)
        self.data.append_token_id(token_id, logprobs[token_id])

    def is_finished(self) -> bool:
        return self.status >= FIRST_FINISHED

    def is_prefill(self) -> bool:
        return self.data.stage is SequenceStage.PREFILL

    def reset_state_for_recompute(self) -> None:
        self.data.reset_state_for_recompute()

    def fork(self, new_seq_id: int) -> "Sequence":
        child = Sequence(new_seq_id, self.inputs, self.block_size, self.eos_token_id)
        child.data = self.data.copy()
        child.status = self.status
        child.output_text = self.output_text
        child.output_logprobs = list(self.output_logprobs)
        child.tokens = list(self.tokens) if self.tokens is not None else None
        child.prefix_offset, child.read_offset = self.prefix_offset, self.read_offset
        return child

    def __repr__(self) -> str:
        return f"Sequence(seq_id={self.seq_id}, status={self.status.name}, num_blocks={self.n_blocks})"


class SequenceGroup:
    """A request: its decoder sequences (one, or several for n/best_of/beams) and, for an
    encoder/decoder model, one static encoder sequence whose K/V live in the request's cross blocks."""

    def __init__(self, request_id: str, seqs: List[Sequence], arrival_time: float,
                 sampling_params: Optional[SamplingParams] = None, encoder_seq: Optional[Sequence] = None,
                 inputs: Optional[EncoderDecoderInputs] = None, priority: int = 0) -> None:
        if not seqs:
            raise ValueError("a sequence group needs at least one decoder sequence")
        if encoder_seq is not None and encoder_seq.get_len() == 0:
            raise ValueError("an encoder sequence needs at least one token")
        self.request_id = request_id
        self.seqs_dict: Dict[int, Sequence] = {seq.seq_id: seq for seq in seqs}
        self.arrival_time = arrival_time
        self.sampling_params = sampling_params
        self.encoder_seq = encoder_seq
        self.inputs = inputs
        self.priority = priority
        # The LoRA adapter the request runs with (a LoRARequest, seq2seq_engine/lora_request.py), or None.
        self.lora_request: Optional[Any] = None
        # What the KV caches key the request's content by under its adapter (0: none; lora/manager.py: cache_tag).
        self.lora_cache_tag = 0
        # The encoder input's content key (core/content_keys.py), computed when a cache first needs it.
        self.encoder_key: Optional[bytes] = None
        self.ignored_reason: Optional[str] = None
        # why the request failed inside a step and was aborted (engine/step_isolation.py), else None
        self.error: Optional[str] = None
        # A torch.Generator for a request with a seed, so its samples do not depend on the rest of the batch.
        self.generator: Optional[Any] = None
        # Set for a beam-search request: its spec and finished hypotheses (seq2seq_engine/sampling/beam_search.py).
        self.beam_search: Optional[BeamSearchState] = None
        # With prompt_logprobs: one entry per decoder-prompt token, None for the first (nothing predicts it), then
        # {token_id: logprob} dicts, filled chunk by chunk as the prompt is prefilled.
        self.prompt_logprobs: Optional[List[Optional[Dict[int, float]]]] = (
            [None] if sampling_params is not None and sampling_params.prompt_logprobs is not None else None)

    @property
    def encoder_len(self) -> int:
        """Tokens of the encoder sequence, 0 for a decoder-only request: `encoder_len > 0` is the test of
        whether the request has an encoder (an encoder sequence is never empty)."""
        return self.encoder_seq.get_len() if self.encoder_seq is not None else 0

    @property
    def lora_int_id(self) -> int:
        """The id of the request's adapter, 0 without one."""
        return self.lora_request.lora_int_id if self.lora_request is not None else 0

    @property
    def num_cross_blocks(self) -> int:
        """Cross-attention blocks holding the encoder output's K/V; 0 for a decoder-only request."""
        return self.encoder_seq.n_blocks if self.encoder_seq is not None else 0

    @property
    def first_seq(self) -> Sequence:
        return next(iter(self.seqs_dict.values()))

    @property
    def prompt(self) -> Optional[str]:
        return self.first_seq.prompt

    @property
    def prompt_token_ids(self) -> List[int]:
        return self.first_seq.prompt_token_ids

    @property
    def encoder_prompt(self) -> Optional[str]:
        return self.encoder_seq.prompt if self.encoder_len > 0 else None

    @property
    def encoder_prompt_token_ids(self) -> Optional[List[int]]:
        return self.encoder_seq.prompt_token_ids if self.encoder_len > 0 else None

    def get_max_num_running_seqs(self) -> int:
        """The most sequences this group will run at once over its lifetime."""
        if self.is_prefill():
            if self.beam_search is not None:
                return max(self.beam_search.spec.beam_width, self.num_unfinished_seqs())
            if self.sampling_params is not None:
                return max(self.sampling_params.best_of, self.num_unfinished_seqs())
        return self.num_unfinished_seqs()

    def get_seqs(self, status: Optional[SequenceStatus] = None) -> List[Sequence]:
        if status is None:
            return list(self.seqs_dict.values())
        return [seq for seq in self.seqs_dict.values() if seq.status == status]

    def get_unfinished_seqs(self) -> List[Sequence]:
        return [seq for seq in self.seqs_dict.values() if seq.status < FIRST_FINISHED]

    def num_seqs(self, status: Optional[SequenceStatus] = None) -> int:
        return len(self.get_seqs(status))

    def num_unfinished_seqs(self) -> int:
        return len(self.get_unfinished_seqs())

    def find(self, seq_id: int) -> Sequence:
        return self.seqs_dict[seq_id]

    def add(self, seq: Sequence) -> None:
        if seq.seq_id in self.seqs_dict:
            raise ValueError(f"sequence {seq.seq_id} already exists in request {self.request_id}")
        self.seqs_dict[seq.seq_id] = seq

    def remove(self, seq_id: int) -> None:
        del self.seqs_dict[seq_id]

    def is_finished(self) -> bool:
        return all(seq.status >= FIRST_FINISHED for seq in self.seqs_dict.values())

    def is_prefill(self) -> bool:
        """Whether the first unfinished sequence (the first one when all are finished) is still prefilling."""
        for seq in self.seqs_dict.values():
            if seq.status < FIRST_FINISHED:
                return seq.data.stage is SequenceStage.PREFILL
        return self.first_seq.is_prefill()

    def get_num_uncomputed_tokens(self) -> int:
        """Decoder tokens still to run through the model; the encoder is counted separately."""
        return sum(seq.data.get_num_uncomputed_tokens() for seq in self.get_unfinished_seqs())

    def update_num_computed_tokens(self, num_new_computed_tokens: int) -> None:
        for seq in self.seqs_dict.values():
            if seq.status < FIRST_FINISHED:
                seq.data.update_num_computed_tokens(num_new_computed_tokens)

    def __repr__(self) -> str:
        return (f"SequenceGroup(request_id={self.request_id}, num_seqs={len(self.seqs_dict)}, "
                f"encoder_len={self.encoder_len})")


@dataclasses.dataclass
class SequenceGroupMetadata:
    """What the model runner needs of one scheduled request for one step."""

    request_id: str
    is_prompt: bool
    seq_data: Dict[int, SequenceData]
    sampling_params: Optional[SamplingParams]
    block_tables: Dict[int, List[int]]
    do_sample: bool = True
    token_chunk_size: Optional[int] = None
    encoder_seq_data: Optional[SequenceData] = None
    cross_block_table: Optional[List[int]] = None
    multi_modal_data: Optional[Dict[str, Any]] = None
    # A prefill whose cross table already holds its encoder output (a computed cache entry): no encoder run.
    cross_computed: bool = False
    generator: Optional[Any] = None
    # > 0 for a beam-search request: how many top (token, log-prob) candidates each of its rows returns.
    num_beam_candidates: int = 0
    # The id of the request's LoRA adapter, 0 without one.
    lora_int_id: int = 0

    def __post_init__(self) -> None:
        if self.token_chunk_size is None:
            only = next(iter(self.seq_data.values()))
            self.token_chunk_size = only.get_len() if self.is_prompt else 1
        if (self.encoder_seq_data is None) != (self.cross_block_table is None):
            raise ValueError("encoder_seq_data and cross_block_table come together or not at all")

    @property
    def encoder_len(self) -> int:
        """Tokens of the request's encoder sequence; 0 for a decoder-only request."""
        return self.encoder_seq_data.get_len() if self.encoder_seq_data is not None else 0
