"""How many windows a transcription keeps in the engine at once by default: as many as keep their KV cache (cross
blocks for the encoder span, self blocks for each beam's tokens) within a memory budget, between 2 and 16.

Measured on whisper-base (docs/decisions.md §29): each float32 window holds ~41 MB of KV cache, the KV of the windows
in flight is most of a long transcription's memory, and fewer windows cost some speed (CPU time +15% at 8 windows
against 16 or more, +40% at 4). The budget is the larger of KV_BUDGET_BYTES and twice the model's weights as
stored (int8 weights count a quarter of float32 ones), so a large model keeps a useful batch and int8 keeps memory
small.
"""
from __future__ import annotations

from seq2seq_engine.engine_port import EnginePort

KV_BUDGET_BYTES = 256 << 20
WEIGHTS_FACTOR = 2  # the KV in flight may take up to twice the model's weights
MIN_WINDOWS, MAX_WINDOWS = 2, 16
PROMPT_TOKENS = 4  # a window's decoder prompt: <|startoftranscript|>, language, task, <|notimestamps|>


def window_kv_bytes(engine: EnginePort, max_new_tokens: int, beam_width: int) -> int:
    """KV cache bytes of one window decoded to its longest: the encoder span's cross blocks, once per request, and
    the prompt (PROMPT_TOKENS) plus `max_new_tokens` in self blocks for each of `beam_width` beams."""
    return engine.request_kv_bytes(PROMPT_TOKENS + max_new_tokens, beam_width)


def default_windows_in_flight(engine: EnginePort, max_new_tokens: int, beam_width: int) -> int:
    """Windows in flight when the caller did not say: the budget over one window's KV bytes, in [2, 16], and never
    more than the engine's max_num_seqs."""
    budget = max(KV_BUDGET_BYTES, WEIGHTS_FACTOR * engine.weight_bytes())
    fitting = budget // window_kv_bytes(engine, max_new_tokens, beam_width)
    return max(1, min(max(MIN_WINDOWS, fitting), MAX_WINDOWS, engine.max_num_seqs))
