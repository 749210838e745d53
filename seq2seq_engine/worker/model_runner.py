"""Model runner: a step's metadata to vectorised model inputs and attention metadata, the model, the sampler."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from seq2seq_engine.attention.metadata import AttentionMetadata
from seq2seq_engine.kernels.native_topk import row_topk
from seq2seq_engine.lora.layers import lora_rows
from seq2seq_engine.lora.manager import LoRAManager
from seq2seq_engine.lora.step_rows import step_rows
from seq2seq_engine.sampling.logits_processors import LogitsProcessorBatch, OutputLists, TokenHistories
from seq2seq_engine.sampling.metadata import SamplingMetadata
from seq2seq_engine.sampling.sampler import Sampler, SamplerOutput
from seq2seq_engine.sequence import SequenceGroupMetadata
from seq2seq_engine.worker.attention_inputs import encoder_and_cross_metadata, self_metadata
from seq2seq_engine.worker.cuda_graphs import (CudaGraphCapture, DecodeGraphs, GraphCapture, graph_batch_sizes,
                                               table_rows)
from seq2seq_engine.worker.host_to_device import pack_to_device
from seq2seq_engine.worker.input_batch import FlatInputs, InputBatch, prepare_flat_inputs
from seq2seq_engine.worker.prompt_logprobs import PromptLogprobPlan, PromptLogprobTracker, compute_prompt_logprobs
from seq2seq_engine.worker.scheduled_rows import RowCollector, Scheduled
from seq2seq_engine.worker.token_feed import TokenFeed


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
    # A decode step replayed as a CUDA graph: its bucket (input_ids and positions hold that many rows, padding last)
    graph_batch_size: Optional[int] = None
    # With LoRA adapters: the runs of adapter slots of the step's encoder and decoder rows (lora/step_rows.py)
    lora_rows: Optional[dict] = None


class ModelRunner:
    """Runs steps of one model. Decode steps on CUDA replay CUDA graphs (cuda_graphs.py) unless enforce_eager or
    LoRA adapters are served (`lora_manager`); `graph_capture` replaces how graphs are captured (run_eagerly: the
    padded graph inputs run on any device)."""

    def __init__(self, model: torch.nn.Module, device: torch.device, max_num_seqs: int, max_model_len: int,
                 block_size: int, eos_token_id: Optional[int] = None, max_encoder_len: int = 0,
                 enforce_eager: bool = False, graph_capture: Optional[GraphCapture] = None,
                 lora_manager: Optional[LoRAManager] = None) -> None:
        self.model = model
        self.lora_manager = lora_manager
        enforce_eager = enforce_eager or lora_manager is not None
        self.eos_token_id = eos_token_id
        self.device = torch.device(device)
        self.block_size = block_size
        self.enforce_eager = enforce_eager
        self.input_batch = InputBatch(max_num_seqs, max_model_len, block_size)
        self.row_collector = RowCollector(self.input_batch)
        self.sampler = Sampler()
        self.prompt_logprobs = PromptLogprobTracker()
        self.num_encoder_runs = 0   # encoder inputs run so far (each once per distinct uncached content)
        self.decode_graphs: Optional[DecodeGraphs] = None
        if not enforce_eager and (graph_capture is not None or self.device.type == "cuda"):
            cross_width = -(-max_encoder_len // block_size) if getattr(model, "is_encoder_decoder", False) else 0
            self.decode_graphs = DecodeGraphs(model, self.device, graph_batch_sizes(max_num_seqs), block_size,
                                              self.input_batch.max_blocks_per_seq, cross_width,
                                              graph_capture or CudaGraphCapture(self.device))

    def release_seqs(self, seq_ids) -> None:
        seq_ids = list(seq_ids)
        if seq_ids:
            self.row_collector.forget()
        self.input_batch.release(seq_ids)
        self.prompt_logprobs.release(seq_ids)

    def write_tokens(self, seq_ids: List[int], positions: List[int], token_ids: List[int]) -> None:
        """Tokens that reached the host after their place was synced (asynchronous scheduling) into the token rows."""
        self.input_batch.write_tokens(seq_ids, positions, token_ids)

    def prepare_inputs(self, metadata_list: List[SequenceGroupMetadata]) -> ModelInput:
        scheduled = self.row_collector.collect(metadata_list)
        flat = prepare_flat_inputs(np.asarray(scheduled.rows, dtype=np.int64),
                                   np.asarray(scheduled.num_computed, dtype=np.int64),
                                   np.asarray(scheduled.num_scheduled, dtype=np.int64),
                                   self.input_batch.token_ids, self.input_batch.block_table, self.block_size)
        selected = np.repeat(flat.query_start_loc[1:] - 1, scheduled.num_samples)
        sampled_seq_ids = scheduled.sampled_seq_ids
        sampling = dict(
            sampled_seq_ids=sampled_seq_ids,
            sampling_metadata=self._sampling_metadata(scheduled) if sampled_seq_ids else None,
            logits_processors=self._logits_processors(scheduled, flat) if sampled_seq_ids else None,
            beam_rows=(scheduled.beam_rows, scheduled.num_beam_candidates) if scheduled.beam_rows else None)
        graph_batch_size = self._graph_batch_size(scheduled)
        if graph_batch_size is not None:
            step = self.decode_graphs.prepare(self._decode_rows(scheduled, flat, selected), graph_batch_size,
                                              len(selected))
            return ModelInput(input_ids=step.input_ids, positions=step.positions, attn_metadata=step.attn_metadata,
                              selected_token_indices=step.selected, graph_batch_size=graph_batch_size, **sampling)
        num_prefills = scheduled.num_prefills
        num_prefill_tokens = int(flat.query_start_loc[num_prefills])
        encoder_md, cross_md = encoder_and_cross_metadata(scheduled, self.block_size)
        attn_metadata = AttentionMetadata(
            num_prefills=num_prefills, num_prefill_tokens=num_prefill_tokens,
            num_decode_tokens=flat.num_tokens - num_prefill_tokens,
            self_attn=self_metadata(flat, scheduled, self.input_batch.block_table, self.block_size),
            encoder=encoder_md, cross=cross_md)
        encoder_input_ids, encoder_positions, encoder_features = (
            self._encoder_inputs(metadata_list[:num_prefills], scheduled.runs_encoder) if encoder_md is not None
            else (None, None, None))
        self.num_encoder_runs += sum(scheduled.runs_encoder)
        model_input = ModelInput(
            input_ids=torch.from_numpy(flat.input_ids), positions=torch.from_numpy(flat.positions),
            attn_metadata=attn_metadata, selected_token_indices=torch.from_numpy(selected),
            encoder_input_ids=encoder_input_ids, encoder_positions=encoder_positions,
            encoder_features=encoder_features, prompt_logprobs=self.prompt_logprobs.plan(
                [group for group in metadata_list if group.is_prompt], scheduled.num_computed[:num_prefills],
                flat.query_start_loc[:num_prefills]), lora_rows=self._lora_rows(metadata_list, scheduled), **sampling)
        return self._to_device(model_input)

    def _sampling_metadata(self, scheduled: Scheduled) -> SamplingMetadata:
        """The sampled rows' parameters as tensors; a step that reuses the previous step's lists reuses them."""
        metadata = scheduled.derived.get("sampling")
        if metadata is None:
            metadata = SamplingMetadata.from_columns(scheduled.sample_params, scheduled.sample_generators, self.device)
            scheduled.derived["sampling"] = metadata
        return metadata

    def _lora_rows(self, metadata_list: List[SequenceGroupMetadata], scheduled: Scheduled) -> Optional[dict]:
        """The step's adapters put in device slots, and the slot runs of its rows; None without LoRA."""
        if self.lora_manager is None:
            return None
        slots = self.lora_manager.activate(group.lora_int_id for group in metadata_list if group.lora_int_id)
        return step_rows(metadata_list, scheduled.runs_encoder, slots)

    def _graph_batch_size(self, scheduled: Scheduled) -> Optional[int]:
        """The graph bucket of a decode step (one new token per sequence, no prefill), or None: run eagerly."""
        if self.decode_graphs is None or scheduled.num_prefills or not scheduled.rows:
            return None
        if self.decode_graphs.cross_table_width:
            # a decoder-only request among encoder/decoder ones, or a cross table wider than the graphs' tables
            if (len(scheduled.cross_tables) != len(scheduled.rows)
                    or max(map(len, scheduled.cross_tables)) > self.decode_graphs.cross_table_width):
                return None
        elif scheduled.cross_tables:
            return None
        return self.decode_graphs.batch_size_for(len(scheduled.rows))

    def _decode_rows(self, scheduled: Scheduled, flat: FlatInputs, selected: np.ndarray) -> Dict[str, np.ndarray]:
        """The real rows of a decode step, one array per static graph input."""
        rows = dict(input_ids=flat.input_ids, positions=flat.positions, slot_mapping=flat.slot_mapping,
                    selected=selected, context_lens=flat.seq_lens,
                    block_tables=self.input_batch.block_table[scheduled.rows])
        if self.decode_graphs.cross_table_width:
            rows["encoder_lens"] = np.asarray(scheduled.encoder_lens)
            rows["cross_block_tables"] = table_rows(scheduled.cross_tables, self.decode_graphs.cross_table_width)
        return rows

    def _logits_processors(self, scheduled: Scheduled, flat: FlatInputs) -> Optional[LogitsProcessorBatch]:
        """The sampled rows' processing; None when no row has any (the common case)."""
        # The runner's token table already holds every scheduled sequence's tokens (synced in collect); the
        # sequences sharing a prompt (n/best_of prefill) all read the row of the one that ran it.
        history_rows = np.repeat(np.asarray(scheduled.rows, dtype=np.int64), scheduled.num_samples)
        seq_lens = np.repeat(flat.seq_lens, scheduled.num_samples)
        histories = TokenHistories(
            table=self.input_batch.token_ids, table_rows=history_rows,
            prompt_lens=self.input_batch.prompt_lens[history_rows], seq_lens=seq_lens,
            output_token_ids=OutputLists(scheduled.sample_data))
        return LogitsProcessorBatch.build(scheduled.sample_params, histories, self.eos_token_id,
                                          self.input_batch.max_model_len)

    @staticmethod
    def _encoder_inputs(prefill_list: List[SequenceGroupMetadata],
                        runs_encoder: List[bool]) -> Tuple[Optional[torch.Tensor], ...]:
        """(encoder_input_ids, encoder_positions, encoder_features) of the step's prefills that run their encoder:
        the features of audio requests, else the encoder tokens and their positions."""
        prefills = [group for group, runs in zip(prefill_list, runs_encoder) if runs]
        features = [group.multi_modal_data.get("input_features") for group in prefills
                    if group.multi_modal_data]
        if features:
            return None, None, torch.stack([torch.as_tensor(f) for f in features])
        token_lists = [group.encoder_seq_data.prompt_token_ids for group in prefills]
        return (torch.tensor([t for tokens in token_lists for t in tokens], dtype=torch.long),
                torch.cat([torch.arange(len(tokens)) for tokens in token_lists]), None)

    def _to_device(self, model_input: ModelInput) -> ModelInput:
        """The step's host tensors (inputs, attention metadata, prompt-logprob indices) on the device, moved by
        one copy."""
        if self.device.type == "cpu":
            return model_input
        names = ("input_ids", "positions", "selected_token_indices", "encoder_input_ids", "encoder_positions",
                 "encoder_features")
        tensors = {name: getattr(model_input, name) for name in names}
        metadata = model_input.attn_metadata
        holders = {"self_attn": metadata.self_attn, "encoder": metadata.encoder, "cross": metadata.cross,
                   "prompt_logprobs": model_input.prompt_logprobs}
        for holder_name, holder in holders.items():
            for field in dataclasses.fields(holder) if holder is not None else ():
                value = getattr(holder, field.name)
                if isinstance(value, torch.Tensor):
                    tensors[f"{holder_name}.{field.name}"] = value
        moved = pack_to_device(tensors, self.device)
        for key in [key for key in moved if "." in key]:
            holder_name, field_name = key.split(".")
            setattr(holders[holder_name], field_name, moved.pop(key))
        return dataclasses.replace(model_input, **moved)

    @torch.inference_mode()
    def execute_model(self, metadata_list: List[SequenceGroupMetadata],
                      kv_caches: List[Tuple[torch.Tensor, torch.Tensor]],
                      feed: Optional[TokenFeed] = None) -> Tuple[List[int], Optional[SamplerOutput]]:
        """Run one step; returns the sampled sequences' ids and the sampler's output for them (which also carries
        the step's prompt logprobs, so a prompt chunk that samples nothing may still return an output). With
        `feed`, a step of decodes only whose input tokens the previous step sampled and the host does not hold yet."""
        model_input = self.prepare_inputs(metadata_list)
        if feed is not None:
            if model_input.attn_metadata.num_prefills:
                raise AssertionError("a step fed by the previous one's samples holds decodes only")
            feed.write_inputs(model_input.input_ids, model_input.sampled_seq_ids)
        if model_input.graph_batch_size is not None:
            hidden_states = self.decode_graphs.run(model_input.graph_batch_size, kv_caches)
        else:
            with lora_rows(model_input.lora_rows or {}):
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
        beam_index = None
        if model_input.beam_rows is not None:
            # Beam rows score log-probs; as in HF's beam search, logits processors then act on the log-probs.
            if model_input.beam_rows[0] == list(range(logits.shape[0])):
                logits = torch.log_softmax(logits, dim=-1)      # every row a beam row, in order: no gather
            else:
                beam_index = torch.tensor(model_input.beam_rows[0], dtype=torch.long, device=logits.device)
                logits[beam_index] = torch.log_softmax(logits[beam_index], dim=-1)
        if model_input.logits_processors is not None:
            logits = model_input.logits_processors(logits)
        sampler_output = self.sampler(logits, model_input.sampling_metadata)
        if model_input.beam_rows is None:
            return sampler_output
        beam_logits = logits if beam_index is None else logits[beam_index]
        beam_logprobs, beam_token_ids = row_topk(beam_logits, min(model_input.beam_rows[1], logits.shape[1]))
        return dataclasses.replace(sampler_output, beam_rows=model_input.beam_rows[0], beam_logprobs=beam_logprobs,
                                   beam_token_ids=beam_token_ids)
