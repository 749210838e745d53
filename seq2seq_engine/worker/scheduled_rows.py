"""One pass over a step's metadata: each scheduled sequence's row in the persistent batch, its token counts, and
the sequences sampled from it with their parameters (every later part of input preparation reads these lists)."""
from __future__ import annotations

import dataclasses
import operator
from typing import Any, Dict, List, Optional

import numpy as np

from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.sequence import SequenceData, SequenceGroupMetadata
from seq2seq_engine.worker.input_batch import InputBatch


@dataclasses.dataclass
class Scheduled:
    """Per-sequence facts of one step, in batch order (prefills first)."""

    rows: List[int] = dataclasses.field(default_factory=list)
    num_computed: List[int] = dataclasses.field(default_factory=list)
    num_scheduled: List[int] = dataclasses.field(default_factory=list)
    # How many sequences sample from each scheduled one's last position (0 for a prompt chunk).
    num_samples: List[int] = dataclasses.field(default_factory=list)
    cross_tables: List[List[int]] = dataclasses.field(default_factory=list)
    encoder_lens: List[int] = dataclasses.field(default_factory=list)
    # per encoder/decoder prefill: whether this step runs its encoder (else its cross table is read)
    runs_encoder: List[bool] = dataclasses.field(default_factory=list)
    num_prefills: int = 0
    # One entry per sampled sequence, in sampling order:
    sampled_seq_ids: List[int] = dataclasses.field(default_factory=list)
    sample_params: List[SamplingParams] = dataclasses.field(default_factory=list)
    sample_generators: List[Optional[Any]] = dataclasses.field(default_factory=list)
    sample_data: List[SequenceData] = dataclasses.field(default_factory=list)
    beam_rows: List[int] = dataclasses.field(default_factory=list)   # sampled rows of beam-search requests
    num_beam_candidates: int = 0
    # What later parts of input preparation derive from the lists above (e.g. padded cross tables), kept with them:
    # a step that reuses the previous step's lists (RowCollector) reuses these too.
    derived: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def add_samples(self, group: SequenceGroupMetadata) -> None:
        """Every sequence of `group` samples one token from its row this step."""
        count = len(group.seq_data)
        if group.num_beam_candidates:
            first = len(self.sampled_seq_ids)
            self.beam_rows.extend(range(first, first + count))
            self.num_beam_candidates = max(self.num_beam_candidates, group.num_beam_candidates)
        self.sampled_seq_ids.extend(group.seq_data)
        self.sample_data.extend(group.seq_data.values())
        self.sample_params.extend([group.sampling_params] * count)
        self.sample_generators.extend([group.generator] * count)


def collect(metadata_list: List[SequenceGroupMetadata], input_batch: InputBatch) -> Scheduled:
    """The step's rows: decoding sequences each run one token from their own row (synced by appending what changed
    since their last step); sequences that share a prompt (n/best_of) run it once and each samples from its last
    position."""
    scheduled = Scheduled()
    rows, num_computed, num_scheduled, num_samples = (scheduled.rows, scheduled.num_computed,
                                                      scheduled.num_scheduled, scheduled.num_samples)
    sync, sync_decode = input_batch.sync, input_batch.sync_decode
    claimed_tables = set()  # first cross block of each table whose encoder runs this step
    for group in metadata_list:
        encoder_len = group.encoder_len
        if not group.is_prompt:
            for seq_id, seq_data in group.seq_data.items():
                rows.append(sync_decode(seq_id, seq_data, group.block_tables[seq_id]))
                num_computed.append(seq_data.get_num_computed_tokens())
                num_scheduled.append(1)
                num_samples.append(1)
                if encoder_len > 0:
                    scheduled.cross_tables.append(group.cross_block_table)
                    scheduled.encoder_lens.append(encoder_len)
            scheduled.add_samples(group)
            continue
        seq_id, seq_data = next(iter(group.seq_data.items()))
        rows.append(sync(seq_id, seq_data, group.block_tables[seq_id]))
        num_computed.append(seq_data.get_num_computed_tokens())
        num_scheduled.append(group.token_chunk_size)
        num_samples.append(len(group.seq_data) if group.do_sample else 0)
        if group.do_sample:
            scheduled.add_samples(group)
        scheduled.num_prefills += 1
        if encoder_len > 0:
            scheduled.cross_tables.append(group.cross_block_table)
            scheduled.encoder_lens.append(encoder_len)
            # Requests sharing a cross table not yet computed: the first one in the step runs it.
            first_block = group.cross_block_table[0]
            scheduled.runs_encoder.append(not group.cross_computed and first_block not in claimed_tables)
            claimed_tables.add(first_block)
    return scheduled


class RowCollector:
    """`collect` that remembers a step of decodes only, one sequence per request: when the next step schedules the
    same metadata objects in the same order (the scheduler keeps a decoding request's metadata while its tables
    stand), its lists are the previous step's, and only new tokens, blocks and computed counts are read."""

    def __init__(self, input_batch: InputBatch) -> None:
        self.input_batch = input_batch
        self._last_list: Optional[List[SequenceGroupMetadata]] = None
        self._last: Optional[Scheduled] = None
        self._rows = np.zeros(0, dtype=np.int64)
        self._tables: List[List[int]] = []

    def collect(self, metadata_list: List[SequenceGroupMetadata]) -> Scheduled:
        last_list = self._last_list
        if (last_list is not None and len(last_list) == len(metadata_list)
                and all(map(operator.is_, last_list, metadata_list))):
            return self._again()
        scheduled = collect(metadata_list, self.input_batch)
        self._last_list = None
        if not scheduled.num_prefills and len(scheduled.rows) == len(metadata_list) and not scheduled.beam_rows:
            self._last_list, self._last = list(metadata_list), scheduled
            self._rows = np.asarray(scheduled.rows, dtype=np.int64)
            seq_ids = scheduled.sampled_seq_ids
            self._tables = [group.block_tables[seq_id] for group, seq_id in zip(metadata_list, seq_ids)]
        return scheduled

    def forget(self) -> None:
        """Read the next step in full (rows were released or moved)."""
        self._last_list = None

    def _again(self) -> Scheduled:
        last = self._last
        datas = last.sample_data
        self.input_batch.sync_decode_rows(last.sampled_seq_ids, self._rows, datas, self._tables)
        return dataclasses.replace(last, num_computed=[data.get_num_computed_tokens() for data in datas])
