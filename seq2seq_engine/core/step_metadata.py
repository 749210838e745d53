"""Each scheduled request's SequenceGroupMetadata for the runner. A decoding request of one sequence gets the same
metadata object every step while its block tables stand: it holds the live SequenceData and block-number lists,
so nothing in it changes from one decode step to the next."""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional

from seq2seq_engine.core.block_manager import BlockSpaceManager
from seq2seq_engine.core.scheduler_outputs import ScheduledSequenceGroup
from seq2seq_engine.sequence import Sequence, SequenceGroup, SequenceGroupMetadata, SequenceStatus


class _DecodeEntry(NamedTuple):
    """A single-sequence decode's step records and what they were built from (compared by identity)."""

    seq: Sequence
    table: List[int]
    cross: Optional[List[int]]
    scheduled: ScheduledSequenceGroup
    metadata: SequenceGroupMetadata


class StepMetadata:
    """Builds the runner's view of scheduled requests; keeps single-sequence decodes' views between steps."""

    def __init__(self, block_manager: BlockSpaceManager) -> None:
        self.block_manager = block_manager
        self._decodes: Dict[str, _DecodeEntry] = {}

    def single_decode(self, seq_group: SequenceGroup, seq: Sequence) -> _DecodeEntry:
        """The (scheduled, metadata) records of `seq_group` decoding its one running sequence `seq`: those of the
        last step unless the sequence's self table or the request's cross table was replaced (swap, recompute)."""
        block_manager = self.block_manager
        table = block_manager.get_block_table(seq)
        cross = block_manager.get_cross_block_table(seq_group) if seq_group.encoder_seq is not None else None
        entry = self._decodes.get(seq_group.request_id)
        if entry is None or entry.seq is not seq or entry.table is not table or entry.cross is not cross:
            scheduled = ScheduledSequenceGroup(seq_group, 1, False)
            entry = _DecodeEntry(seq, table, cross, scheduled, self.build(scheduled))
            self._decodes[seq_group.request_id] = entry
        return entry

    def forget(self, request_id: str) -> None:
        """Drop a request's kept records (it finished, was aborted or refused)."""
        self._decodes.pop(request_id, None)

    def build(self, scheduled: ScheduledSequenceGroup) -> SequenceGroupMetadata:
        """A new metadata record of a scheduled request."""
        seq_group = scheduled.seq_group
        block_manager = self.block_manager
        running = seq_group.get_seqs(SequenceStatus.RUNNING)
        first = running[0].data
        do_sample = (not scheduled.is_prompt
                     or first.get_num_computed_tokens() + scheduled.token_chunk_size >= first.get_len())
        has_encoder = seq_group.encoder_seq is not None  # an encoder sequence is never empty
        return SequenceGroupMetadata(
            request_id=seq_group.request_id, is_prompt=scheduled.is_prompt,
            seq_data={seq.seq_id: seq.data for seq in running},
            sampling_params=seq_group.sampling_params,
            block_tables={seq.seq_id: block_manager.get_block_table(seq) for seq in running},
            do_sample=do_sample,
            token_chunk_size=scheduled.token_chunk_size,
            encoder_seq_data=seq_group.encoder_seq.data if has_encoder else None,
            cross_block_table=block_manager.get_cross_block_table(seq_group) if has_encoder else None,
            multi_modal_data=seq_group.inputs.multi_modal_data if seq_group.inputs is not None else None,
            cross_computed=scheduled.is_prompt and has_encoder and block_manager.is_cross_computed(seq_group),
            generator=seq_group.generator,
            num_beam_candidates=seq_group.beam_search.spec.num_candidates if seq_group.beam_search else 0,
            lora_int_id=seq_group.lora_int_id)
