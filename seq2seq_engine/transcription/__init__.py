"""Speech transcription with Whisper models on the engine: prompts, logits processors, language detection,
windowed batch transcription and result formats.

    from seq2seq_engine import LLM
    from seq2seq_engine.transcription import transcribe
    llm = LLM("whisper-tiny.en")                       # a short name, HF, CTranslate2 or GGUF path
    results = transcribe(llm, ["a.wav", "b.mp3"], timestamps=True)       # or llm.transcribe(...)
    results = transcribe(llm, "a.wav", TranscriptionOptions(temperature=0.0, initial_prompt="Glossary: ..."))
    for index, result in iter_transcribe(llm, paths, vad_filter=True): ...   # each result as soon as it is done
"""
from seq2seq_engine.transcription.decode.fallback import compression_ratio
from seq2seq_engine.transcription.decode.language import detect_language
from seq2seq_engine.transcription.decode.processors import (OnlyTokens, SuppressTokens, SuppressTokensAtBegin,
                                                            WhisperTimestamps, whisper_processors)
from seq2seq_engine.transcription.options import DEFAULT_TEMPERATURES, TranscriptionOptions
from seq2seq_engine.transcription.output.results import (OUTPUT_FORMATS, Segment, TranscriptionResult, Word,
                                                         format_timestamp, render, to_srt, to_vtt)
from seq2seq_engine.transcription.pipeline import iter_transcribe, transcribe
from seq2seq_engine.transcription.prompts import DEFAULT_MAX_NEW_TOKENS, WhisperTokens
from seq2seq_engine.transcription.timing.segments import WindowTokens, split_segments, stitch

__all__ = [
    "transcribe", "iter_transcribe", "TranscriptionOptions", "DEFAULT_TEMPERATURES", "compression_ratio",
    "detect_language", "TranscriptionResult", "Segment", "Word", "WhisperTokens", "DEFAULT_MAX_NEW_TOKENS",
    "SuppressTokens", "SuppressTokensAtBegin", "WhisperTimestamps", "OnlyTokens", "whisper_processors",
    "OUTPUT_FORMATS", "render", "to_srt", "to_vtt", "format_timestamp", "WindowTokens", "split_segments", "stitch",
]
