"""Model runner: a step's metadata to vectorised model inputs and attention metadata, the model, the sampler."""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence as Seq, Tuple

import numpy as np
import torch

from seq2seq_engine.attention.bias import (BlockDiagonalCausalFromBottomRightMask, BlockDiagonalCausalMask,
                                           BlockDiagonalMask)
from seq2seq_engine.attention.metadata import (AttentionMetadata, CrossAttentionMetadata, EncoderAttentionMetadata,
                                               SelfAttentionMetadata)
from seq2seq_engine.sampling.logits_processors import LogitsProcessorBatch, TokenHistories, needs_logits_processing
from seq2seq_engine.sampling.metadata import SamplingMetadata
from seq2seq_engine.sampling.sampler import Sampler, SamplerOutput
from seq2seq_engine.sequence import SequenceGroupMetadata
from seq2seq_engine.worker.input_batch import FlatInputs, InputBatch, prepare_flat_inputs
from seq2seq_engine.worker.prompt_logprobs import PromptLogprobPlan, PromptLogprobTracker, compute_prompt_logprobs


@dataclasses.dataclass(frozen=True)
class ModelInput:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_metadata: AttentionMetadata
    selected_token_indices: torch.Tensor          # positions in the flat batch whose logits are sampled
    sampled_seq_ids: List[int]                    # the sequence each selected position belongs to
    sampling_metadata: Optional[SamplingMetadata]
    # Penalties, bans, forced tokens, user callables and the min_tokens ban of the sampled rows (None: nothing)
    logits_processors: Optional[LogitsProcessorBatch] = None
    # Beam-search rows: (indices of sampled rows, candidates each returns), or None when the step has none.
    beam_rows: Optional[Tuple[List[int], int]] = None
    encoder_input_ids: Optional[torch.Tensor] = None
    encoder_positions: Optional[torch.Tensor] = None
    encoder_features: Optional[torch.Tensor] = None
    # Prefill positions that score prompt tokens or feed prompt_logits_hooks (None: no such request).
    prompt_logprobs: Optional[PromptLogprobPlan] = None


@dataclasses.dataclass
class _Scheduled:
    """Per-sequence facts of one step, in batch order (prefills first)."""

    rows: List[int] = dataclasses.field(default_factory=list)
    num_computed: List[int] = dataclasses.field(default_factory=list)
    num_scheduled: List[int] = dataclasses.field(default_factory=list)
    sample_seq_ids: List[List[int]] = dataclasses.field(default_factory=list)  # sequences sampled from each
    do_sample: List[bool] = dataclasses.field(default_factory=list)
    cross_tables: List[List[int]] = dataclasses.field(default_factory=list)
    encoder_lens: List[int] = dataclasses.field(default_factory=list)
    num_prefills: int = 0


def _padded_table(tables: Seq[Seq[int]]) -> torch.Tensor:
    width = max(len(table) for table in tables)
    padded = np.zeros((len(tables), width), dtype=np.int32)
    for i, table in enumerate(tables):
        padded[i, :len(table)] = table
    return torch.from_numpy(padded)


def _slots_of_prefixes(tables: Seq[Seq[int]], lengths: Seq[int], block_size: int) -> np.ndarray:
    """Slots of positions 0..length-1 of each table, concatenated (for writing whole encoder outputs)."""
    padded = _padded_table(tables).numpy()
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    positions = np.arange(int(lengths.sum()), dtype=np.int64) - starts
    rows = np.repeat(np.arange(len(tables)), lengths)
    return padded[rows, positions // block_size].astype(np.int64) * block_size + positions % block_size


class ModelRunner:
    def __init__(self, model: torch.nn.Module, device: torch.device, max_num_seqs: int, max_model_len: int,
                 block_size: int, eos_token_id: Optional[int] = None) -> None:
        self.model = model
        self.eos_token_id = eos_token_id
        self.device = torch.device(device)
        self.block_size = block_size
        self.input_batch = InputBatch(max_num_seqs, max_model_len, block_size)
        self.sampler = Sampler()
        self.prompt_logprobs = PromptLogprobTracker()

    def release_seqs(self, seq_ids) -> None:
        seq_ids = list(seq_ids)
        self.input_batch.release(seq_ids)
        self.prompt_logprobs.release(seq_ids)

    def _collect(self, metadata_list: List[SequenceGroupMetadata]) -> _Scheduled:
        scheduled = _Scheduled()
        for group in metadata_list:
            items = list(group.seq_data.items())
            # Sequences that share a prompt (n/best_of) run it once; each samples from its last position.
            for seq_id, seq_data in (items[:1] if group.is_prompt else items):
                scheduled.rows.append(self.input_batch.sync(seq_id, seq_data, group.block_tables[seq_id]))
                scheduled.num_computed.append(seq_data.get_num_computed_tokens())
                scheduled.num_scheduled.append(group.token_chunk_size if group.is_prompt else 1)
                scheduled.sample_seq_ids.append([i for i, _ in items] if group.is_prompt else [seq_id])
                scheduled.do_sample.append(group.do_sample)
                scheduled.num_prefills += int(group.is_prompt)
                if group.encoder_len > 0:
                    scheduled.cross_tables.append(group.cross_block_table)
                    scheduled.encoder_lens.append(group.encoder_len)
        return scheduled

    def _self_metadata(self, flat: FlatInputs, scheduled: _Scheduled) -> SelfAttentionMetadata:
        num_prefills = scheduled.num_prefills
        query_lens = scheduled.num_scheduled[:num_prefills]
        seq_lens = flat.seq_lens[:num_prefills].tolist()
        prefill_bias, prefill_block_tables = None, None
        if num_prefills and any(scheduled.num_computed[:num_prefills]):
            prefill_bias = BlockDiagonalCausalFromBottomRightMask.from_seqlens(q_seqlen=query_lens,
                                                                               kv_seqlen=seq_lens)
            rows = scheduled.rows[:num_prefills]
            prefill_block_tables = torch.from_numpy(self.input_batch.block_table[rows])
        elif num_prefills:
            prefill_bias = BlockDiagonalCausalMask.from_seqlens(query_lens)
        decode_seq_lens, decode_block_tables, max_decode_len = None, None, 0
        if len(scheduled.rows) > num_prefills:
            decode_lens = flat.seq_lens[num_prefills:]
            max_decode_len = int(decode_lens.max())
            num_blocks = -(-max_decode_len // self.block_size)
            decode_rows = scheduled.rows[num_prefills:]
            decode_block_tables = torch.from_numpy(self.input_batch.block_table[decode_rows, :num_blocks])
            decode_seq_lens = torch.from_numpy(decode_lens.astype(np.int32))
        return SelfAttentionMetadata(
            slot_mapping=torch.from_numpy(flat.slot_mapping), prefill_bias=prefill_bias,
            prefill_block_tables=prefill_block_tables, decode_seq_lens=decode_seq_lens,
            decode_block_tables=decode_block_tables, max_decode_seq_len=max_decode_len)

    def _encoder_and_cross_metadata(self, scheduled: _Scheduled):
        if not scheduled.cross_tables:
            return None, None
        num_prefills = scheduled.num_prefills
        encoder_lens = scheduled.encoder_lens[:num_prefills]
        encoder_md, prefill_bias, cross_slots = None, None, None
        if num_prefills:
            encoder_md = EncoderAttentionMetadata(bias=BlockDiagonalMask.from_seqlens(encoder_lens))
            prefill_bias = BlockDiagonalMask.from_seqlens(q_seqlen=scheduled.num_scheduled[:num_prefills],
                                                          kv_seqlen=encoder_lens)
            cross_slots = torch.from_numpy(_slots_of_prefixes(scheduled.cross_tables[:num_prefills],
                                                              encoder_lens, self.block_size))
        decode_lens, decode_tables, max_len = None, None, 0
        if len(scheduled.cross_tables) > num_prefills:
            lens = scheduled.encoder_lens[num_prefills:]
            decode_lens = torch.tensor(lens, dtype=torch.int32)
            decode_tables = _padded_table(scheduled.cross_tables[num_prefills:])
            max_len = max(lens)
        cross_md = CrossAttentionMetadata(prefill_bias=prefill_bias, cross_slot_mapping=cross_slots,
                                          decode_encoder_lens=decode_lens, decode_block_tables=decode_tables,
                                          max_decode_encoder_len=max_len)
        return encoder_md, cross_md

    def prepare_inputs(self, metadata_list: List[SequenceGroupMetadata]) -> ModelInput:
        scheduled = self._collect(metadata_list)
        flat = prepare_flat_inputs(np.asarray(scheduled.rows, dtype=np.int64),
                                   np.asarray(scheduled.num_computed, dtype=np.int64),
                                   np.asarray(scheduled.num_scheduled, dtype=np.int64),
                                   self.input_batch.token_ids, self.input_batch.block_table, self.block_size)
        num_prefills = scheduled.num_prefills
        num_prefill_tokens = int(flat.query_start_loc[num_prefills])
        encoder_md, cross_md = self._encoder_and_cross_metadata(scheduled)
        attn_metadata = AttentionMetadata(
            num_prefills=num_prefills, num_prefill_tokens=num_prefill_tokens,
            num_decode_tokens=flat.num_tokens - num_prefill_tokens,
            self_attn=self._self_metadata(flat, scheduled), encoder=encoder_md, cross=cross_md)
        num_samples = [len(ids) if keep else 0 for ids, keep in zip(scheduled.sample_seq_ids, scheduled.do_sample)]
        selected = np.repeat(flat.query_start_loc[1:] - 1, num_samples)
        sampled_seq_ids = [seq_id for ids, keep in zip(scheduled.sample_seq_ids, scheduled.do_sample) if keep
                           for seq_id in ids]
        encoder_input_ids, encoder_positions, encoder_features = (
            self._encoder_inputs(metadata_list) if encoder_md is not None else (None, None, None))
        model_input = ModelInput(
            input_ids=torch.from_numpy(flat.input_ids), positions=torch.from_numpy(flat.positions),
            attn_metadata=attn_metadata, selected_token_indices=torch.from_numpy(selected),
            sampled_seq_ids=sampled_seq_ids,
            sampling_metadata=self._sampling_metadata(metadata_list) if sampled_seq_ids else None,
            logits_processors=self._logits_processors(metadata_list, scheduled) if sampled_seq_ids else None,
            beam_rows=self._beam_rows(metadata_list), encoder_input_ids=encoder_input_ids,
            encoder_positions=encoder_positions, encoder_features=encoder_features,
            prompt_logprobs=self.prompt_logprobs.plan(
                [group for group in metadata_list if group.is_prompt], scheduled.num_computed[:num_prefills],
                flat.query_start_loc[:num_prefills]))
        return self._to_device(model_input)

    def _sampling_metadata(self, metadata_list: List[SequenceGroupMetadata]) -> SamplingMetadata:
        rows = [(group.sampling_params, group.generator)
                for group in metadata_list if group.do_sample for _ in group.seq_data]
        return SamplingMetadata.build(rows, self.device)

    @staticmethod
    def _beam_rows(metadata_list: List[SequenceGroupMetadata]) -> Optional[Tuple[List[int], int]]:
        rows, row, num_candidates = [], 0, 0
        for group in metadata_list:
            if not group.do_sample:
                continue
            if group.num_beam_candidates:
                rows.extend(range(row, row + len(group.seq_data)))
                num_candidates = max(num_candidates, group.num_beam_candidates)
            row += len(group.seq_data)
        return (rows, num_candidates) if rows else None

    def _logits_processors(self, metadata_list: List[SequenceGroupMetadata],
                           scheduled: _Scheduled) -> Optional[LogitsProcessorBatch]:
        """The sampled rows' processing; nothing is built when no row has any (the common case)."""
        params, seqs = [], []
        for group in metadata_list:
            if group.do_sample:
                params.extend([group.sampling_params] * len(group.seq_data))
                seqs.extend(group.seq_data.values())
        if not any(needs_logits_processing(p, seq.get_output_len()) for p, seq in zip(params, seqs)):
            return None
        # The runner's token table already holds every scheduled sequence's tokens (synced in _collect); the
        # sequences sharing a prompt (n/best_of prefill) all read the row of the one that ran it.
        samples_per_row = [len(ids) if keep else 0 for ids, keep in zip(scheduled.sample_seq_ids, scheduled.do_sample)]
        table_rows = np.repeat(np.asarray(scheduled.rows, dtype=np.int64), samples_per_row)
        histories = TokenHistories(
            table=self.input_batch.token_ids, table_rows=table_rows,
            prompt_lens=np.array([seq.get_prompt_len() for seq in seqs], dtype=np.int64),
            seq_lens=np.array([seq.get_len() for seq in seqs], dtype=np.int64),
            output_token_ids=[seq.output_token_ids for seq in seqs])
        return LogitsProcessorBatch.build(params, histories, self.eos_token_id, self.input_batch.max_model_len)

    @staticmethod
    def _encoder_inputs(metadata_list: List[SequenceGroupMetadata]) -> Tuple[Optional[torch.Tensor], ...]:
        """(encoder_input_ids, encoder_positions, encoder_features) of the step's prefills: the features of
        audio requests, else the encoder tokens and their positions."""
        prefills = [group for group in metadata_list if group.is_prompt]
        features = [group.multi_modal_data.get("input_features") for group in prefills
                    if group.multi_modal_data]
        if features:
            return None, None, torch.stack([torch.as_tensor(f) for f in features])
        token_lists = [group.encoder_seq_data.prompt_token_ids for group in prefills]
        return (torch.tensor([t for tokens in token_lists for t in tokens], dtype=torch.long),
                torch.cat([torch.arange(len(tokens)) for tokens in token_lists]), None)

    def _to_device(self, model_input: ModelInput) -> ModelInput:
        if self.device.type == "cpu":
            return model_input
        names = ("input_ids", "positions", "selected_token_indices", "encoder_input_ids", "encoder_positions",
                 "encoder_features")
        moved = {name: getattr(model_input, name).to(self.device, non_blocking=True) for name in names
                 if getattr(model_input, name) is not None}
        _metadata_to_device(model_input.attn_metadata, self.device)
        if model_input.prompt_logprobs is not None:
            model_input.prompt_logprobs.to(self.device)
        return dataclasses.replace(model_input, **moved)

    @torch.inference_mode()
    def execute_model(self, metadata_list: List[SequenceGroupMetadata],
                      kv_caches: List[Tuple[torch.Tensor, torch.Tensor]]) -> Tuple[List[int], Optional[SamplerOutput]]:
        """Run one step; returns the sampled sequences' ids and the sampler's output for them (which also carries
        the step's prompt logprobs, so a prompt chunk that samples nothing may still return an output)."""
        model_input = self.prepare_inputs(metadata_list)
        hidden_states = self.model(model_input.input_ids, model_input.positions, kv_caches,
                                   model_input.attn_metadata, encoder_input_ids=model_input.encoder_input_ids,
                                   encoder_positions=model_input.encoder_positions,
                                   encoder_features=model_input.encoder_features)
        sampler_output = self._sample(model_input, hidden_states) if model_input.sampled_seq_ids else None
        scored = (compute_prompt_logprobs(model_input.prompt_logprobs, hidden_states, self.model.compute_logits)
                  if model_input.prompt_logprobs is not None else None)
        if scored is not None:
            if sampler_output is None:
                sampler_output = SamplerOutput.empty(self.device)
            sampler_output = dataclasses.replace(sampler_output, prompt_logprobs=scored)
        return model_input.sampled_seq_ids, sampler_output

    def _sample(self, model_input: ModelInput, hidden_states: torch.Tensor) -> SamplerOutput:
        """Logits of the sampled positions, beam log-softmax and logits processors, then the sampler."""
        logits = self.model.compute_logits(hidden_states[model_input.selected_token_indices])
        if model_input.beam_rows is not None:
            # Beam rows score log-probs; as in HF's beam search, logits processors then act on the log-probs.
            beam_index = torch.tensor(model_input.beam_rows[0], dtype=torch.long, device=logits.device)
            logits[beam_index] = torch.log_softmax(logits[beam_index], dim=-1)
        if model_input.logits_processors is not None:
            logits = model_input.logits_processors(logits)
        sampler_output = self.sampler(logits, model_input.sampling_metadata)
        if model_input.beam_rows is None:
            return sampler_output
        beam_logprobs, beam_token_ids = logits[beam_index].topk(min(model_input.beam_rows[1], logits.shape[1]))
        return dataclasses.replace(sampler_output, beam_rows=model_input.beam_rows[0], beam_logprobs=beam_logprobs,
                                   beam_token_ids=beam_token_ids)


def _metadata_to_device(attn_metadata: AttentionMetadata, device: torch.device) -> None:
    for part in (attn_metadata.self_attn, attn_metadata.encoder, attn_metadata.cross):
        if part is None:
            continue
        for field in dataclasses.fields(part):
            value = getattr(part, field.name)
            if isinstance(value, torch.Tensor):
                setattr(part, field.name, value.to(device, non_blocking=True))
