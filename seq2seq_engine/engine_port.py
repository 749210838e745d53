"""EnginePort: all that transcription, the server, Ray jobs and the command lines may ask of the engine (LLMEngine)."""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, List, Optional, Protocol, Sequence, Union, runtime_checkable

import torch

from seq2seq_engine.config import ModelConfig
from seq2seq_engine.generation_defaults import GenerationDefaults
from seq2seq_engine.outputs import RequestOutput


@dataclasses.dataclass(frozen=True)
class AlignmentRequest:
    """One finished window to run teacher-forced (Whisper's word-timestamp alignment): its log-mel `features` (the
    tensor its requests carried, so the encoder cache finds their cross K/V), the decoder input `token_ids`, and the
    rows whose next token's probability is wanted: rows `first_scored_row` .. + `num_scored` - 1, each the
    probability of the token that follows it in `token_ids`, softmax over the ids below `vocab_limit`."""

    features: torch.Tensor
    token_ids: Sequence[int]
    first_scored_row: int
    num_scored: int
    vocab_limit: int
    lora_int_id: int = 0      # the adapter the window's requests ran with (0: none); the pass runs with it too


@dataclasses.dataclass(frozen=True)
class AlignmentResult:
    """The alignment heads' scaled cross-attention scores [heads, len(token_ids), encoder rows] (float32, softmax
    not applied; row i is the query at input position i), the scored rows' token probabilities [num_scored], and
    whether the window's cross K/V came from the engine's encoder cache (else its encoder ran again)."""

    scores: torch.Tensor
    token_probs: torch.Tensor
    cross_kv_cached: bool


@dataclasses.dataclass(frozen=True)
class EngineStats:
    """The engine between two steps, as the server's metrics read it: the queues' lengths, the GPU block pool, and
    cumulative counts since start-up (a cache switched off has None for its counts)."""

    running: int
    waiting: int
    swapped: int
    total_gpu_blocks: int
    free_gpu_blocks: int
    preemptions: int
    encoder_runs: int                              # encoder passes the model runner made
    prefix_queried_tokens: Optional[int] = None    # prefix cache: tokens looked up, and those found
    prefix_hit_tokens: Optional[int] = None
    encoder_cache_queries: Optional[int] = None    # encoder cache: encoder inputs looked up, and those found
    encoder_cache_hits: Optional[int] = None


@runtime_checkable
class EnginePort(Protocol):
    """One model's engine as its features see it (vLLM's EngineClient): requests in, outputs out a step at a time,
    the model's facts, and the few capabilities that read the engine's state. Call it from the one thread that steps
    the engine. LLMEngine implements it (engine/llm_engine.py and engine/port_methods.py)."""

    # ------------------------------------------------------------ model facts, fixed at start-up
    tokenizer: Any                            # None when the engine runs with skip_tokenizer_init
    model_config: ModelConfig                 # the model's record (context lengths, vocabulary, hf_config)
    generation_defaults: GenerationDefaults   # the model's generation_config.json defaults
    device: torch.device
    kv_cache_dtype: torch.dtype

    @property
    def hf_config(self) -> Any:
        """The model's transformers config."""

    @property
    def model_path(self) -> str:
        """The model's directory (its generation_config.json and tokenizer files)."""

    @property
    def num_mel_bins(self) -> Optional[int]:
        """Mel bins of the audio encoder's input features; None for a model that takes no audio."""

    @property
    def max_encoder_len(self) -> int:
        """Longest encoder sequence (a Whisper window's frames); 0 for a decoder-only model."""

    @property
    def max_model_len(self) -> int:
        """Longest decoder sequence (prompt and generated tokens)."""

    @property
    def max_num_seqs(self) -> int:
        """Most sequences one step runs (all of a request's samples run in one step)."""

    @property
    def max_beam_width(self) -> int:
        """Widest beam search a request may ask for."""

    @property
    def block_size(self) -> int:
        """Tokens per KV cache block."""

    def request_kv_bytes(self, decoder_tokens: int, num_seqs: int) -> int:
        """KV cache bytes of one request at its longest: its encoder span's cross blocks once, and `num_seqs`
        sequences of `decoder_tokens` (at most max_model_len) in self blocks."""

    def weight_bytes(self) -> int:
        """Bytes of the model's weights and buffers as stored."""

    # ------------------------------------------------------------ requests
    def add_request(self, request_id: str, prompt: Any, params: Any = None, arrival_time: Optional[float] = None,
                    priority: int = 0, lora_request: Optional[Any] = None) -> None:
        """Queue one request, with a LoRA adapter (a LoRARequest) or none (ValueError or TypeError when its prompt,
        parameters or adapter are refused)."""

    def abort_request(self, request_id: Union[str, Iterable[str]]) -> None:
        """Drop requests by id and free their blocks; unknown ids are ignored."""

    def step(self, finished_only: bool = False) -> List[RequestOutput]:
        """Run one step; the outputs of the requests it scheduled (with `finished_only`, those that finished)."""

    def has_unfinished_requests(self) -> bool:
        """Whether any request is waiting, running or swapped out."""

    def unfinished_request_ids(self) -> List[str]:
        """The ids of the requests waiting, running and swapped out."""

    # ------------------------------------------------------------ LoRA adapters (an engine built with enable_lora)
    def add_lora(self, lora_request: Any) -> bool:
        """Read a LoRARequest's adapter now (LoRAAdapterError, a ValueError, naming what cannot be served)."""

    def remove_lora(self, lora_int_id: int) -> bool:
        """Forget an adapter no request holds; False when it is unknown or in use."""

    def list_loras(self) -> List[Any]:
        """The LoRARequests registered, in the order they were added."""

    # ------------------------------------------------------------ capabilities
    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (prefix and encoder caches); False, changing nothing, while requests are
        unfinished."""

    def align(self, requests: Sequence[AlignmentRequest]) -> List[AlignmentResult]:
        """Run finished Whisper windows teacher-forced through the model, together (their cross K/V read from the
        encoder cache, or the encoder run again when evicted): the alignment heads' scores and the asked token
        probabilities of each. Between steps only; ValueError for a model without an audio encoder."""

    def stats(self) -> EngineStats:
        """The queues, block pool and cumulative counts now."""
