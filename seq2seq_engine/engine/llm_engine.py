"""LLMEngine: add_request / step / abort_request over the scheduler, cache engine and model runner."""
from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import time
from typing import Any, Dict, Iterable, List, Optional, Union

import torch

from seq2seq_engine.beam_search_params import BeamSearchParams
from seq2seq_engine.config import EngineConfig, cache_torch_dtype, torch_dtype
from seq2seq_engine.core.scheduler import Scheduler
from seq2seq_engine.core.scheduler_outputs import SchedulerOutputs
from seq2seq_engine.engine.arg_utils import EngineArgs, with_compute_dtype
from seq2seq_engine.engine.async_scheduling import AsyncScheduling, LaunchedStep
from seq2seq_engine.engine.beam_output import make_beam_state
from seq2seq_engine.engine.input_processor import InputProcessor
from seq2seq_engine.engine.output_processor import OutputProcessor
from seq2seq_engine.engine.port_methods import EnginePortMethods
from seq2seq_engine.engine.step_isolation import execute_isolating_failures
from seq2seq_engine.engine.stop_checker import StopChecker
from seq2seq_engine.generation_defaults import GenerationDefaults
from seq2seq_engine.logger import configure_package_logger
from seq2seq_engine.lora.manager import LoRAManager
from seq2seq_engine.lora_request import LoRARequest, as_lora_request
from seq2seq_engine.model_loader.config_file import load_config
from seq2seq_engine.model_loader.loader import load_model
from seq2seq_engine.model_loader.resolver import resolve_model_path
from seq2seq_engine.models.kernel_table import startup_line
from seq2seq_engine.outputs import RequestOutput
from seq2seq_engine.platforms import current_platform
from seq2seq_engine.platforms.cpu_memory import release_free_memory, tune_malloc
from seq2seq_engine.platforms.cuda import require_fp8_cache_support
from seq2seq_engine.platforms.startup_gc import collect_startup_garbage
from seq2seq_engine.sampling.metadata import make_generator
from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.sequence import Sequence, SequenceGroup
from seq2seq_engine.tokenization.detokenizer import Detokenizer
from seq2seq_engine.tokenization.tokenizer import get_tokenizer
from seq2seq_engine.worker.cache_engine import CacheEngine, cache_block_bytes, num_blocks_for_bytes, profile_cuda_blocks
from seq2seq_engine.worker.model_runner import ModelRunner
from seq2seq_engine.worker.token_feed import TokenFeed

logger = logging.getLogger(__name__)

_GIB = 1 << 30
# On the CPU, free blocks keeping cached content (cross tables, prefix blocks) are capped at this much KV memory, so
# the pages a pool has written stay bounded by the work in flight, not by how much work went through (decisions §29).
CPU_CACHED_KV_BYTES = 512 << 20


class LLMEngine(EnginePortMethods):
    """One model, one device: requests in, RequestOutputs out, a step at a time. It is the EnginePort
    (engine_port.py) features hold: its facts and capabilities beyond the request loop are in port_methods.py."""

    def __init__(self, config: EngineConfig, model: torch.nn.Module, tokenizer: Any,
                 gpu_memory_utilization: float = 0.9,
                 generation_defaults: Optional[GenerationDefaults] = None) -> None:
        configure_package_logger()
        self.model_config = config.model_config
        self.device = torch.device(config.device_config.resolved)
        self.platform = current_platform(self.device.type)
        logger.info(startup_line(self.platform))
        if self.device.type == "cpu":
            release_free_memory()  # what loading the model freed
            tune_malloc()
        torch.manual_seed(self.model_config.seed)
        self.tokenizer = tokenizer
        self.kv_cache_dtype = cache_torch_dtype(config.kv_cache_dtype)
        if self.kv_cache_dtype == torch.float8_e4m3fn:
            require_fp8_cache_support(self.device)
        cache_config = self._sized_cache_config(config, model, gpu_memory_utilization)
        self.cache_config = cache_config
        self.scheduler_config = config.scheduler_config
        num_layers, num_kv_heads, head_size = model.kv_cache_spec()
        # Adapters wrap the model's linears before its first step, so every step runs the same layers.
        self.lora_manager = (LoRAManager(model, config.lora_config, torch_dtype(self.model_config.dtype), self.device)
                             if config.lora_config is not None else None)
        self.cache_engine = CacheEngine(num_layers, num_kv_heads, head_size, cache_config.block_size,
                                        cache_config.num_gpu_blocks, cache_config.num_cpu_blocks,
                                        self.kv_cache_dtype, self.device)
        self.scheduler = Scheduler(config.scheduler_config, cache_config)
        self.model_runner = ModelRunner(model, self.device, config.scheduler_config.max_num_seqs,
                                        self.model_config.max_model_len, cache_config.block_size,
                                        self.model_config.eos_token_id, self.model_config.max_encoder_len,
                                        self.model_config.enforce_eager, lora_manager=self.lora_manager)
        detokenizer = Detokenizer(tokenizer) if tokenizer is not None else None
        self._seq_ids = itertools.count()
        # Request defaults from the model's generation_config.json (HF's defaults when there is none).
        self.generation_defaults = generation_defaults or GenerationDefaults()
        self.input_processor = InputProcessor(self.model_config, self.scheduler_config, tokenizer,
                                              self.generation_defaults)
        self.output_processor = OutputProcessor(
            self.scheduler, StopChecker(self.model_config.max_model_len, self.model_config.eos_token_id),
            detokenizer, lambda: next(self._seq_ids))
        self._finish_scan_pending = False   # an earlier step stopped before freeing its finished requests
        self.async_scheduler = (
            AsyncScheduling(self._launch_step, self._finish_step, self.scheduler.can_schedule_ahead,
                            lambda *tokens: self.model_runner.write_tokens(*tokens), self.model_config.max_model_len)
            if config.scheduler_config.async_scheduling else None)
        collect_startup_garbage()

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> "LLMEngine":
        # Only a directory needs config.json here; a .gguf file or a short name goes on to the resolver.
        if os.path.isdir(args.model) and not os.path.isfile(os.path.join(args.model, "config.json")):
            raise FileNotFoundError(f"model {args.model!r} is not a model directory (no config.json there)")
        # A CTranslate2 directory, a llama GGUF file or a short name ("whisper-base", "smollm2-135m") resolves to a
        # converted HF directory.
        model_dir = resolve_model_path(args.model)
        hf_config = load_config(model_dir)
        weight_dtype = torch_dtype(args.dtype)
        args = with_compute_dtype(args)
        config = args.create_engine_config(hf_config)
        device = torch.device(config.device_config.resolved)
        model, _ = load_model(model_dir, torch_dtype(args.dtype), device, config.model_config.quantization,
                              linear_weight_dtype=weight_dtype, prepared=True)
        tokenizer = None if args.skip_tokenizer_init else get_tokenizer(model_dir)
        return cls(config, model, tokenizer, args.gpu_memory_utilization,
                   GenerationDefaults.from_model_dir(model_dir))

    def _sized_cache_config(self, config: EngineConfig, model, gpu_memory_utilization: float):
        cache_config = config.cache_config
        num_layers, num_kv_heads, head_size = model.kv_cache_spec()
        block_bytes = cache_block_bytes(num_layers, num_kv_heads, head_size, cache_config.block_size,
                                        self.kv_cache_dtype)
        num_gpu_blocks = cache_config.num_gpu_blocks
        if num_gpu_blocks is None and self.device.type == "cuda":
            num_gpu_blocks = profile_cuda_blocks(block_bytes, gpu_memory_utilization, self.device)
        elif num_gpu_blocks is None:
            num_gpu_blocks = num_blocks_for_bytes(cache_config.kv_cache_space_gb * _GIB, block_bytes)
        num_cpu_blocks = cache_config.num_cpu_blocks
        if num_cpu_blocks is None:
            num_cpu_blocks = num_blocks_for_bytes(cache_config.swap_space_gb * _GIB, block_bytes)
        if num_gpu_blocks <= 0:
            raise ValueError(f"the KV cache holds no block: one block needs {block_bytes} bytes; raise "
                             f"kv_cache_space_gb (now {cache_config.kv_cache_space_gb})")
        max_cached = cache_config.max_cached_blocks
        if max_cached is None and self.device.type == "cpu":
            max_cached = num_blocks_for_bytes(CPU_CACHED_KV_BYTES, block_bytes)
        return dataclasses.replace(cache_config, num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=num_cpu_blocks,
                                   max_cached_blocks=max_cached)

    # ----------------------------------------------------------------- requests
    def add_request(self, request_id: str, prompt: Any,
                    params: Optional[Union[SamplingParams, BeamSearchParams, Dict[str, Any]]] = None,
                    arrival_time: Optional[float] = None, priority: int = 0,
                    lora_request: Optional[LoRARequest] = None) -> None:
        """Queue one request (with `lora_request`, under that LoRA adapter, read now if it is new). BeamSearchParams
        make it a beam search; SamplingParams with best_of > 1 give it best_of sequences sharing the prompt's
        blocks, of which the n most likely are returned. `params=None` takes the model's generation_config.json
        defaults (beam search if it sets num_beams > 1); a dict takes those defaults with the dict's fields
        overridden (e.g. {"max_tokens": 64, "beam_width": 1})."""
        lora_request = self._checked_adapter(lora_request)
        request = self.input_processor.process(prompt, params)
        inputs, params, beam_params = request.inputs, request.params, request.beam_params
        eos, block_size = self.model_config.eos_token_id, self.cache_config.block_size
        decoder_seqs = [Sequence(next(self._seq_ids), inputs.decoder, block_size, eos) for _ in range(params.best_of)]
        encoder_seq = (Sequence(next(self._seq_ids), inputs.encoder, block_size)
                       if inputs.encoder is not None else None)
        group = SequenceGroup(request_id, decoder_seqs, arrival_time or time.monotonic(), params, encoder_seq,
                              inputs, priority)
        group.lora_request = lora_request
        if lora_request is not None:
            group.lora_cache_tag = self.lora_manager.cache_tag(lora_request.lora_int_id)
        if beam_params is not None:
            group.beam_search = make_beam_state(beam_params, len(inputs.decoder.prompt_token_ids),
                                                self.model_config.max_model_len, eos)
        if params.seed is not None:
            group.generator = make_generator(params.seed, self.device)
        self.scheduler.add_seq_group(group)

    def _checked_adapter(self, lora_request: Any) -> Optional[LoRARequest]:
        lora_request = as_lora_request(lora_request)
        if lora_request is not None:
            if self.lora_manager is None:
                raise ValueError("lora_request needs an engine built with enable_lora=True")
            self.lora_manager.add_adapter(lora_request)
        return lora_request

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """vLLM's name: read an adapter now (LoRAAdapterError, a ValueError, if it cannot be served)."""
        return self._checked_adapter(lora_request) is not None

    def remove_lora(self, lora_int_id: int) -> bool:
        """Forget an adapter no request holds; False if it is unknown or in use."""
        queues = (self.scheduler.waiting, self.scheduler.running, self.scheduler.swapped)
        if self.lora_manager is None or any(g.lora_int_id == lora_int_id for queue in queues for g in queue):
            return False
        return self.lora_manager.remove_adapter(lora_int_id)

    def list_loras(self) -> List[LoRARequest]:
        """The adapters registered, in the order they were added."""
        return list(self.lora_manager.requests.values()) if self.lora_manager is not None else []

    def abort_request(self, request_id: Union[str, Iterable[str]]) -> None:
        request_ids = [request_id] if isinstance(request_id, str) else list(request_id)
        seq_ids = [seq.seq_id for queue in (self.scheduler.waiting, self.scheduler.running, self.scheduler.swapped)
                   for group in queue if group.request_id in request_ids for seq in group.get_seqs()]
        if self.async_scheduler is not None:
            self.async_scheduler.forget(seq_ids)
        self.scheduler.abort_seq_group(request_ids)
        self.model_runner.release_seqs(seq_ids)

    def reset_prefix_cache(self) -> bool:
        """vLLM's name: forget every cached block (prefix and encoder caches), so later requests compute everything
        again (benchmarks that repeat their work use it). False, changing nothing, while requests are unfinished."""
        return self.scheduler.reset_prefix_cache()

    def has_unfinished_requests(self) -> bool:
        pending = self.async_scheduler is not None and self.async_scheduler.has_pending
        return self.scheduler.has_unfinished_seqs() or pending

    def get_num_unfinished_requests(self) -> int:
        return self.scheduler.get_num_unfinished_seq_groups()

    # ----------------------------------------------------------------- the loop
    def step(self, finished_only: bool = False) -> List[RequestOutput]:
        """Schedule, move cache blocks, run the model, apply the samples; outputs of the scheduled requests (with
        `finished_only`, of those that finished this step, refused or failed ones included: all an offline caller
        reads, without building an output per running request per step). With async_scheduling, a step that runs
        ahead reports its outputs at the next call (engine/async_scheduling.py)."""
        if self.async_scheduler is not None:
            return self.async_scheduler.step(finished_only)
        return self._finish_step(self._launch_step(), finished_only)

    def _launch_step(self, feed: Optional[TokenFeed] = None) -> LaunchedStep:
        """Schedule and run a step (`feed`: its input tokens still on the device); its outputs are not applied."""
        metadata_list, scheduler_outputs = self.scheduler.schedule()
        self.cache_engine.swap_out(scheduler_outputs.blocks_to_swap_out)
        self.cache_engine.swap_in(scheduler_outputs.blocks_to_swap_in)
        self.cache_engine.copy(scheduler_outputs.blocks_to_copy)
        sampled_seq_ids, sampler_output, failed_groups = [], None, []
        if metadata_list:
            (sampled_seq_ids, sampler_output), failed = execute_isolating_failures(
                lambda batch: self.model_runner.execute_model(batch, self.cache_engine.device_cache, feed),
                metadata_list)
            if failed:
                scheduler_outputs, failed_groups = self._drop_failed(scheduler_outputs, failed)
            self._mark_prefills_computed(scheduler_outputs)
        return LaunchedStep(scheduler_outputs, sampled_seq_ids, sampler_output, failed_groups)

    def _finish_step(self, launched: LaunchedStep, finished_only: bool) -> List[RequestOutput]:
        """Apply a launched step's samples: append, stop, free the finished; the outputs `step` returns."""
        scheduler_outputs = launched.scheduler_outputs
        # A request finishes only when one of its sequences does (or is dropped): without any, nothing is freed,
        # unless an earlier step stopped before freeing (an exception in output processing).
        scan_pending, self._finish_scan_pending = self._finish_scan_pending, True
        finished_seq_ids = self.output_processor.process(scheduler_outputs, launched.sampled_seq_ids,
                                                         launched.sampler_output)
        if finished_seq_ids or scan_pending:
            self.scheduler.free_finished_seq_groups()
        self._finish_scan_pending = False
        self.model_runner.release_seqs(finished_seq_ids)
        for group in scheduler_outputs.ignored_seq_groups:
            logger.warning("request %s ignored: %s", group.request_id, group.ignored_reason)
            self.model_runner.release_seqs(seq.seq_id for seq in group.get_seqs())
        refused = scheduler_outputs.ignored_seq_groups + launched.failed_groups
        if finished_only and not finished_seq_ids:
            return [RequestOutput.from_seq_group(group) for group in refused if group.is_finished()]
        groups = [s.seq_group for s in scheduler_outputs.scheduled_seq_groups] + refused
        if finished_only:
            groups = [group for group in groups if group.is_finished()]
        return [RequestOutput.from_seq_group(group) for group in groups]

    def _mark_prefills_computed(self, scheduler_outputs: SchedulerOutputs) -> None:
        """The step wrote its prefills' cross tables and prompt blocks: the caches may hand them out now (before
        the outputs are applied, which frees the requests that finish in their first step)."""
        block_manager = self.scheduler.block_manager
        for scheduled in scheduler_outputs.scheduled_seq_groups:
            if not scheduled.is_prompt:
                break  # prefills come first
            computed = scheduled.seq_group.first_seq.data.get_num_computed_tokens()
            block_manager.mark_computed(scheduled.seq_group, computed + scheduled.token_chunk_size)

    def _drop_failed(self, scheduler_outputs: SchedulerOutputs, failed: Dict[str, str]):
        """(the step's outputs without the failed requests, those requests): each aborted, its blocks returned,
        its reason kept for its output."""
        failed_groups = [s.seq_group for s in scheduler_outputs.scheduled_seq_groups
                         if s.seq_group.request_id in failed]
        for group in failed_groups:
            group.error = failed[group.request_id]
            logger.error("request %s failed and was aborted: %s", group.request_id, group.error)
        self.abort_request(list(failed))
        kept = [s for s in scheduler_outputs.scheduled_seq_groups if s.seq_group.request_id not in failed]
        return dataclasses.replace(scheduler_outputs, scheduled_seq_groups=kept), failed_groups
