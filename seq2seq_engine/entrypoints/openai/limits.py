"""The bounds on every HTTP request field: named constants the checks read, and LIMITS, README's "Input limits" rows."""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple, Union

from seq2seq_engine.entrypoints.live_cli import MAX_QUEUED_BLOCKS
from seq2seq_engine.entrypoints.openai.realtime.protocol import MAX_MESSAGE_BYTES, MAX_NAME_CHARS
from seq2seq_engine.transcription.live.options import MAX_PROMPT_CHARS, LiveOptions

# The largest vocabulary of a common model (Gemma 3's 262144 tokens): a token-id set longer than it repeats ids.
MAX_VOCABULARY_IDS = 262_144

# JSON routes (/v1/completions, /v1/chat/completions, /tokenize, /detokenize) and the audio form.
MAX_MODEL_CHARS = 4096  # a served name defaults to the MODEL path, and Linux paths are under 4096 bytes
MAX_USER_CHARS = 1024  # OpenAI's end-user id: clients send a hash or a UUID
# Text over this many characters per token of the model's context cannot fit it (English runs about 4 characters
# a token); refusing it before tokenizing bounds the work one request can cost.
PROMPT_CHARS_PER_TOKEN = 16
MAX_PROMPTS = 2048  # prompts in one /v1/completions request (each is an engine request): OpenAI's array-input limit
MAX_MESSAGES = 2048  # OpenAI's own limit on `messages`
MAX_CONTENT_PARTS = 1024  # text parts of one message
MAX_MESSAGE_NAME_CHARS = 256  # OpenAI's own limit is 64
MAX_STOP_STRINGS = 64  # OpenAI takes 4; each is matched against every new token's text
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 1024
MAX_BAD_WORDS = 1024  # each is tokenized twice when the request is admitted
MAX_BAD_WORD_CHARS = 1024
MAX_DETOKENIZE_TOKENS = 131_072  # the longest common context (128K tokens); decoded on the event loop
# The runtime LoRA routes (/v1/load_lora_adapter, /v1/unload_lora_adapter): an adapter's name is sent back as `model`;
# its path is a directory path (Linux paths are under 4096 bytes).
MAX_LORA_NAME_CHARS = MAX_MODEL_CHARS
MAX_LORA_PATH_CHARS = 4096

# The audio form (/v1/audio/transcriptions and /translations). Files, fields and the part size are what the server
# has always taken (starlette's 1 MiB part default).
MAX_FORM_FILES = 1
MAX_FORM_FIELDS = 100
MAX_FORM_FIELD_BYTES = 1024 * 1024
# A part's headers (its name, file name and type), bounded by python-multipart itself (DEFAULT_MAX_HEADER_SIZE and
# DEFAULT_MAX_HEADER_COUNT) as a malformed body.
MAX_PART_HEADER_LINE_BYTES = 4224
MAX_PART_HEADERS = 8
MAX_LANGUAGE_CHARS = 64  # the longest Whisper language name has 14
# prompt, hotwords and prefix go into Whisper's decoder prompt, which keeps at most 223 tokens (about 900
# characters of English): 32768 characters cover it about 36 times over.
MAX_AUDIO_PROMPT_CHARS = MAX_PROMPT_CHARS
MAX_TEMPERATURES = 32  # fallback temperatures, each a retry of a failed window (openai-whisper's default has 6)
MAX_CLIP_TIMESTAMPS = 1024  # numbers (512 spans): each span is decoded as at least one 30 s window
MAX_VAD_PARAMETERS_CHARS = 4096  # a JSON object of VadOptions' fields, all of them, takes about 300
MAX_TIMESTAMP_GRANULARITIES = 2  # segment and word

# The server's and the engine's settings behind a bound (their defaults; the flag changes them).
DEFAULT_MAX_UPLOAD_MB = 25
DEFAULT_MAX_AUDIO_SECONDS = 10_800
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_BEAM_WIDTH = 16
DEFAULT_MAX_LOGPROBS = 20
DEFAULT_MAX_REALTIME_SESSIONS = 64
# A live transcription's bounds (realtime sockets and the live command line): audio held and not yet decoding, and
# final decodes running at once; past them its input is not read (the client's socket or pipe holds it back).
LIVE_MAX_BUFFERED_S = LiveOptions().max_buffered_s
LIVE_MAX_DECODES_IN_FLIGHT = LiveOptions().max_decodes_in_flight


@dataclasses.dataclass(frozen=True)
class Limit:
    """One row of README's "Input limits" table: where the data comes in, the field, the bound (a number, or the
    model property it follows), the status past it, what the error's `param` holds (the field's name before any
    " (...)" unless given) and where a bound that is not a constant of this module comes from: a serve flag
    ("--max-num-seqs": its default), an engine setting ("max_beam_width") or a library's constant (a dotted name)."""

    surface: str
    field: str
    value: Union[int, float, str]
    status: Union[int, str] = 400  # an HTTP status, a WebSocket close code, or how the input is held back
    param: Optional[str] = None
    setting: Optional[str] = None

    @property
    def refused_param(self) -> str:
        return self.param if self.param is not None else self.field.split(" (")[0]


_ALL = "HTTP: every POST"
_SAMPLING = "HTTP: completions, chat"
_CHAT = "HTTP: chat, /tokenize"
_AUDIO = "HTTP: audio"
_ITS_NAME = "the part's name"
_REALTIME = "WebSocket: /v1/realtime"
_LIVE = "CLI: transcribe - --live"
_ERROR_EVENT = "error event"
_HELD_BACK = "held back"

LIMITS: Tuple[Limit, ...] = (
    Limit(_ALL, "request body (MB)", DEFAULT_MAX_UPLOAD_MB, 413, "null", "--max-upload-mb"),
    Limit("HTTP: JSON routes, audio", "model", MAX_MODEL_CHARS),
    Limit(_SAMPLING, "user", MAX_USER_CHARS),
    Limit(_SAMPLING, "stop (count)", MAX_STOP_STRINGS),
    Limit(_SAMPLING, "stop (each string)", MAX_STOP_CHARS),
    Limit(_SAMPLING, "stop_token_ids", MAX_STOP_TOKEN_IDS),
    Limit(_SAMPLING, "bad_words (count)", MAX_BAD_WORDS),
    Limit(_SAMPLING, "bad_words (each word)", MAX_BAD_WORD_CHARS),
    Limit(_SAMPLING, "allowed_token_ids", MAX_VOCABULARY_IDS),
    Limit(_SAMPLING, "logit_bias", MAX_VOCABULARY_IDS),
    Limit(_SAMPLING, "n, best_of (sampling)", DEFAULT_MAX_NUM_SEQS, param="n or best_of", setting="--max-num-seqs"),
    Limit(_SAMPLING, "n, best_of (use_beam_search)", DEFAULT_MAX_BEAM_WIDTH, param="n or best_of",
          setting="max_beam_width"),
    Limit(_SAMPLING, "logprobs, top_logprobs", DEFAULT_MAX_LOGPROBS, param="logprobs or top_logprobs",
          setting="--max-logprobs"),
    Limit("HTTP: completions", "prompt (count)", MAX_PROMPTS),
    Limit("HTTP: completions, /tokenize", "prompt (each text)", PROMPT_CHARS_PER_TOKEN),
    Limit("HTTP: completions", "decoder_prompt (text)", PROMPT_CHARS_PER_TOKEN),
    Limit("HTTP: completions", "prompt, decoder_prompt (token ids)", "max_model_len", param="prompt"),
    Limit(_CHAT, "messages (count)", MAX_MESSAGES),
    Limit(_CHAT, "messages (all contents)", PROMPT_CHARS_PER_TOKEN),
    Limit(_CHAT, "messages.N.content (parts)", MAX_CONTENT_PARTS),
    Limit(_CHAT, "messages.N.name", MAX_MESSAGE_NAME_CHARS),
    Limit("HTTP: /detokenize", "tokens", MAX_DETOKENIZE_TOKENS),
    Limit("HTTP: /v1/load_lora_adapter", "lora_name", MAX_LORA_NAME_CHARS),
    Limit("HTTP: /v1/load_lora_adapter", "lora_path", MAX_LORA_PATH_CHARS),
    Limit(_AUDIO, "file (decoded audio, seconds)", DEFAULT_MAX_AUDIO_SECONDS, 413, setting="--max-audio-seconds"),
    Limit(_AUDIO, "file (count)", MAX_FORM_FILES, param=_ITS_NAME),
    Limit(_AUDIO, "text fields (count)", MAX_FORM_FIELDS, param=_ITS_NAME),
    Limit(_AUDIO, "each text field (bytes)", MAX_FORM_FIELD_BYTES, param=_ITS_NAME),
    Limit(_AUDIO, "each part's header line (bytes)", MAX_PART_HEADER_LINE_BYTES, param="file",
          setting="python_multipart.multipart.DEFAULT_MAX_HEADER_SIZE"),
    Limit(_AUDIO, "each part's headers (count)", MAX_PART_HEADERS, param="file",
          setting="python_multipart.multipart.DEFAULT_MAX_HEADER_COUNT"),
    Limit(_AUDIO, "language", MAX_LANGUAGE_CHARS),
    Limit(_AUDIO, "prompt", MAX_AUDIO_PROMPT_CHARS),
    Limit(_AUDIO, "hotwords", MAX_AUDIO_PROMPT_CHARS),
    Limit(_AUDIO, "prefix", MAX_AUDIO_PROMPT_CHARS),
    Limit(_AUDIO, "temperature (count)", MAX_TEMPERATURES),
    Limit(_AUDIO, "clip_timestamps (count)", MAX_CLIP_TIMESTAMPS),
    Limit(_AUDIO, "suppress_tokens (count)", MAX_VOCABULARY_IDS),
    Limit(_AUDIO, "vad_parameters", MAX_VAD_PARAMETERS_CHARS),
    Limit(_AUDIO, "timestamp_granularities[]", MAX_TIMESTAMP_GRANULARITIES),
    Limit(_AUDIO, "beam_size, beam_width", DEFAULT_MAX_BEAM_WIDTH, param="beam_width", setting="max_beam_width"),
    Limit(_AUDIO, "best_of", DEFAULT_MAX_NUM_SEQS, setting="--max-num-seqs"),
    Limit(_REALTIME, "sessions", DEFAULT_MAX_REALTIME_SESSIONS, 1013, "null",
          setting="--max-realtime-sessions"),
    Limit(_REALTIME, "message (bytes)", MAX_MESSAGE_BYTES, 1009, "message"),
    Limit(_REALTIME, "event_id", MAX_NAME_CHARS, _ERROR_EVENT),
    Limit(_REALTIME, "session.audio.input.transcription.model", MAX_NAME_CHARS, _ERROR_EVENT),
    Limit(_REALTIME, "session.audio.input.transcription.language", MAX_NAME_CHARS, _ERROR_EVENT),
    Limit(_REALTIME, "session.audio.input.transcription.prompt", MAX_PROMPT_CHARS, _ERROR_EVENT),
    Limit(_REALTIME, "audio (one append, seconds)", LIVE_MAX_BUFFERED_S, _ERROR_EVENT),
    Limit(_REALTIME, "audio held, not yet decoding (seconds)", LIVE_MAX_BUFFERED_S, _HELD_BACK, "audio"),
    Limit(_REALTIME, "final decodes in flight (a session)", LIVE_MAX_DECODES_IN_FLIGHT, _HELD_BACK, "audio"),
    Limit(_LIVE, "stdin read ahead (blocks of at most 100 ms)", MAX_QUEUED_BLOCKS, _HELD_BACK, "stdin"),
    Limit(_LIVE, "final decodes in flight", LIVE_MAX_DECODES_IN_FLIGHT, _HELD_BACK, "stdin"),
)
