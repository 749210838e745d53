"""Builders shared by the block manager tests: sequences, groups, managers and small helpers."""
from __future__ import annotations

import itertools
from typing import Optional

from seq2seq_engine.core.block_manager import BlockSpaceManager
from seq2seq_engine.inputs.data import SingletonInputs
from seq2seq_engine.sequence import Sequence, SequenceGroup, SequenceStatus

BLOCK_SIZE = 4
NUM_GPU = 16
NUM_CPU = 16

_ids = itertools.count(1000)


def new_seq_id() -> int:
    """A sequence id no other test sequence has (for forks)."""
    return next(_ids)


def make_seq(length: int, seq_id: Optional[int] = None) -> Sequence:
    seq_id = new_seq_id() if seq_id is None else seq_id
    return Sequence(seq_id, SingletonInputs(prompt_token_ids=list(range(1, length + 1))), BLOCK_SIZE)


def make_group(request_id: str, dec_len: int, enc_len: Optional[int] = None, num_seqs: int = 1) -> SequenceGroup:
    seqs = [make_seq(dec_len) for _ in range(num_seqs)]
    encoder = make_seq(enc_len) if enc_len is not None else None
    return SequenceGroup(request_id, seqs, arrival_time=0.0, encoder_seq=encoder)


def make_manager(num_gpu: int = NUM_GPU, num_cpu: int = NUM_CPU, watermark: float = 0.0) -> BlockSpaceManager:
    return BlockSpaceManager(BLOCK_SIZE, num_gpu, num_cpu, watermark=watermark)


def allocate_running(bm: BlockSpaceManager, group: SequenceGroup) -> None:
    bm.allocate(group)
    for seq in group.get_seqs(SequenceStatus.WAITING):
        seq.status = SequenceStatus.RUNNING


def grow(seq: Sequence, tok: int = 7) -> None:
    seq.append_token_id(tok, {tok: -0.5})


def blocks_of(bm: BlockSpaceManager, seq: Sequence):
    return bm.block_tables[seq.seq_id]
