"""The adapter slot of every row a step runs, per kind of row: the decoder's tokens in the runner's flat order, and
the encoder's rows of the prefills that run their encoder."""
from __future__ import annotations

from typing import Dict, Mapping, Sequence

import numpy as np

from seq2seq_engine.kernels.lora_ops import LoRARuns
from seq2seq_engine.lora.layers import RowSlots
from seq2seq_engine.lora.targets import DECODER_ROWS, ENCODER_ROWS

NO_SLOT = -1


def step_rows(metadata_list: Sequence, runs_encoder: Sequence[bool], slots: Mapping[int, int]) -> Dict[str, RowSlots]:
    """Row kind -> the runs of slots of this step's rows. `metadata_list`: the step's SequenceGroupMetadata (prefills
    first, as the runner flattens them); `runs_encoder`: for each prefill with an encoder, whether it runs it now;
    `slots`: adapter id -> slot (ids absent: no adapter)."""
    decoder, encoder = [], []
    prefill_index = 0
    for group in metadata_list:
        slot = slots.get(group.lora_int_id, NO_SLOT) if group.lora_int_id else NO_SLOT
        rows = group.token_chunk_size if group.is_prompt else len(group.seq_data)
        decoder.append((slot, rows))
        if group.is_prompt and group.encoder_len > 0:
            if runs_encoder[prefill_index]:
                encoder.append((slot, group.encoder_len))
            prefill_index += 1
    return {DECODER_ROWS: _runs(decoder), ENCODER_ROWS: _runs(encoder)}


def uniform_rows(slot: int) -> Dict[str, RowSlots]:
    """Every row of both kinds on one slot (a pass that serves one adapter, as the word-alignment pass)."""
    return {DECODER_ROWS: RowSlots(uniform=slot), ENCODER_ROWS: RowSlots(uniform=slot)}


def _runs(spans) -> RowSlots:
    slots = np.concatenate([np.full(rows, slot, dtype=np.int32) for slot, rows in spans]) if spans \
        else np.zeros(0, dtype=np.int32)
    return RowSlots(LoRARuns.from_slots(slots))
