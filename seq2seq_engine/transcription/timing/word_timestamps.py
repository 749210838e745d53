"""Word timestamps of finished windows: the engine's alignment pass, DTW token timing, words per segment."""
from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch

from seq2seq_engine.engine_port import AlignmentRequest, AlignmentResult, EnginePort
from seq2seq_engine.transcription.prompts import WhisperTokens
from seq2seq_engine.transcription.timing.segments import split_segments
from seq2seq_engine.transcription.timing.token_timing import (FRAME_SECONDS, alignment_matrix, scores_to_weights,
                                                              token_start_frames)
from seq2seq_engine.transcription.timing.words import WordTiming, merge_punctuations, time_words, truncate_long_words


@dataclasses.dataclass(frozen=True)
class WindowToAlign:
    """One finished window whose words are wanted: its log-mel `features`, generated `token_ids`, language, task
    and length in seconds."""

    features: torch.Tensor
    token_ids: Sequence[int]
    language: str
    task: str
    duration: float


class WordAligner:
    """Times the words of finished windows with the engine's loaded Whisper weights.

        aligner = WordAligner(engine, whisper_tokens)
        words_per_segment = aligner.window_words(features, token_ids, language, task, duration)

    As openai-whisper: the window's text tokens (timestamps dropped) follow `sot [lang task] <|notimestamps|>` and
    are followed by `<|endoftext|>`; the alignment pass yields the heads' cross-attention over the window's frames
    and each token's probability (softmax over the non-special vocabulary at the position that predicts it);
    words are timed and handed out to the window's segments in token order. Times are seconds relative to the
    window, clamped to [0, duration]; segment times are left as they are.

    The pass attends to the window's cross K/V as the engine cached them for its requests (the encoder cache keeps
    a finished request's cross table while the pool does not need its blocks), so the window's encoder ran once,
    in the engine; when that entry is gone (evicted, or the cache is off) the engine runs the window's encoder
    again and `num_encoder_runs` counts it. Call it between engine steps, in the thread that steps the engine.
    """

    def __init__(self, engine: EnginePort, tokens: WhisperTokens, lora_request: Optional[Any] = None) -> None:
        self.engine = engine
        self.lora_int_id = lora_request.lora_int_id if lora_request is not None else 0
        self.tokenizer = engine.tokenizer
        self.tokens = tokens
        self.max_positions = engine.hf_config.max_target_positions
        self.num_encoder_runs = 0    # windows whose encoder the alignment pass ran again (no cached entry)
        self.num_cache_hits = 0      # windows aligned over the engine's cached cross K/V

    def _decode(self, token_ids: List[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)

    def _request(self, window: WindowToAlign,
                 text_tokens: Sequence[int]) -> Tuple[List[int], Optional[AlignmentRequest]]:
        """(the text tokens kept, the pass request: them after `sot [lang task] <|notimestamps|>` and before
        `<|endoftext|>`, the rows predicting them scored over the non-special vocabulary, as openai-whisper; None
        when no text is left)."""
        tokens = self.tokens
        prompt = tokens.prompt(window.language if tokens.is_multilingual else None, window.task, timestamps=False)
        text = [int(t) for t in text_tokens][:self.max_positions - len(prompt) - 1]
        if not text:
            return text, None
        return text, AlignmentRequest(window.features, prompt + text + [tokens.eot], len(prompt) - 1, len(text),
                                      tokens.eot, self.lora_int_id)

    def _words(self, window: WindowToAlign, text_tokens: List[int], result: AlignmentResult,
               prompt_len: int) -> Tuple[List[WordTiming], float]:
        """(timed words (punctuation merged, possibly empty entries), median word duration) of one window."""
        self.num_cache_hits += result.cross_kv_cached
        self.num_encoder_runs += not result.cross_kv_cached
        num_frames = max(1, min(result.scores.shape[-1], int(round(window.duration / FRAME_SECONDS))))
        matrix = alignment_matrix(scores_to_weights(result.scores, num_frames))[prompt_len - 1:-1]
        words = time_words(text_tokens, result.token_probs.numpy(), token_start_frames(matrix), self._decode,
                           self.tokens.eot, window.language, FRAME_SECONDS)
        median = truncate_long_words(words)
        merge_punctuations(words)
        return words, median

    def align(self, windows: Sequence[WindowToAlign],
              text_tokens: Sequence[Sequence[int]]) -> List[Tuple[List[WordTiming], float]]:
        """(timed words, median word duration) of each window's `text_tokens`, the windows run together."""
        texts, requests = zip(*(self._request(window, tokens) for window, tokens in zip(windows, text_tokens)))
        results = iter(self.engine.align([request for request in requests if request is not None]))
        return [self._words(window, text, next(results), request.first_scored_row + 1)
                if request is not None else ([], 0.0) for window, text, request in zip(windows, texts, requests)]

    def window_words(self, features: torch.Tensor, token_ids: Sequence[int], language: str, task: str,
                     duration: float) -> List[List[WordTiming]]:
        """The words of each segment split_segments finds in the window's generated `token_ids`."""
        return self.windows_words([WindowToAlign(features, token_ids, language, task, duration)])[0]

    def windows_words(self, windows: Sequence[WindowToAlign]) -> List[List[List[WordTiming]]]:
        """window_words of each window, their alignment passes run together."""
        segments = [split_segments(window.token_ids, self.tokens, window.duration) for window in windows]
        texts = [[t for _, _, segment_tokens in window_segments for t in segment_tokens]
                 for window_segments in segments]
        timed = self.align(windows, texts)
        return [distribute(words, window_segments, window.duration, median)
                for (words, median), window_segments, window in zip(timed, segments, windows)]


def distribute(words: List[WordTiming], segments: Sequence[Any], duration: float,
               median: float) -> List[List[WordTiming]]:
    """Hand the words to the segments in token order (a segment takes words until it has its token count);
    openai's boundary rules: the first word(s) after a pause last at most twice the median duration (the pause
    measured from the window's start or the previous segment's end), and the first and last word of a segment
    that overrun the segment's timestamps by over 0.5 s are pulled in; then all times are clamped to
    [0, duration] and made monotone."""
    result: List[List[WordTiming]] = []
    index, speech_end = 0, 0.0
    for start, end, segment_tokens in segments:
        taken, seg_words = 0, []
        while index < len(words) and taken < len(segment_tokens):
            if words[index].word:
                seg_words.append(words[index])
            taken += len(words[index].tokens)
            index += 1
        if seg_words:
            _shorten_after_pause(seg_words, speech_end, median)
            first, last = seg_words[0], seg_words[-1]
            if start < first.end and start - 0.5 > first.start:
                first.start = max(0.0, min(first.end - median, start))
            if end > last.start and end + 0.5 < last.end:
                last.end = max(last.start + median, end)
            speech_end = last.end
        result.append(seg_words)
    _clamp([w for seg in result for w in seg], duration)
    return result


def _shorten_after_pause(words: List[WordTiming], speech_end: float, median: float) -> None:
    """openai's rule for a segment's first word (and second, when it is long too) ending more than four median
    durations after the last speech, and lasting more than twice the median: they keep only the end of it."""
    longest = median * 2
    first = words[0]
    if first.end - speech_end <= median * 4:
        return
    if not (first.end - first.start > longest or (len(words) > 1 and words[1].end - first.start > longest * 2)):
        return
    if len(words) > 1 and words[1].end - words[1].start > longest:
        boundary = max(words[1].end / 2, words[1].end - longest)
        first.end = words[1].start = boundary
    first.start = max(0.0, first.end - longest)


def _clamp(words: List[WordTiming], duration: float) -> None:
    previous_end = 0.0
    for word in words:
        word.start = float(np.clip(word.start, previous_end, duration))
        word.end = float(np.clip(word.end, word.start, duration))
        word.start, word.end = round(word.start, 3), round(word.end, 3)
        previous_end = word.end
