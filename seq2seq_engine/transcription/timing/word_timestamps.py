"""Word timestamps for one finished window: alignment pass, DTW token timing, words per segment."""
from __future__ import annotations

import dataclasses
from typing import Any, List, Sequence, Tuple

import numpy as np
import torch

from seq2seq_engine.engine_port import EnginePort
from seq2seq_engine.transcription.prompts import WhisperTokens
from seq2seq_engine.transcription.timing.alignment import CrossKV, alignment_heads, alignment_pass, encoder_cross_kv
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
    in the engine; when that entry is gone (evicted, or the cache is off) the plain-torch encoder computes them
    and `num_encoder_runs` counts it. Call it between engine steps, in the thread that steps the engine.
    """

    def __init__(self, engine: EnginePort, tokens: WhisperTokens) -> None:
        self.engine = engine
        self.model = engine.alignment_model()
        self.tokenizer = engine.tokenizer
        self.tokens = tokens
        self.heads = alignment_heads(engine.hf_config, engine.model_path)
        self.max_positions = engine.hf_config.max_target_positions
        self.num_encoder_runs = 0    # windows whose cross K/V the plain-torch encoder computed (no cached entry)
        self.num_cache_hits = 0      # windows aligned over the engine's cached cross K/V

    def cross_kv(self, features: torch.Tensor) -> CrossKV:
        """The window's cross K/V: the engine's cached ones when its entry is still there, else computed."""
        dtype = self.model.model.decoder.embed_tokens.weight.dtype
        cached = self.engine.cached_cross_kv(features, dtype)
        if cached is not None:
            self.num_cache_hits += 1
            return cached
        self.num_encoder_runs += 1
        return encoder_cross_kv(self.model, features)

    def _decode(self, token_ids: List[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)

    def align(self, features: torch.Tensor, text_tokens: Sequence[int], language: str, task: str,
              duration: float) -> Tuple[List[WordTiming], float]:
        """(timed words (punctuation merged, possibly empty entries) of `text_tokens` in a window of
        `duration` seconds whose log-mel features are `features` [n_mels, frames], median word duration)."""
        prompt = self.tokens.prompt(language if self.tokens.is_multilingual else None, task, timestamps=False)
        text_tokens = [int(t) for t in text_tokens][:self.max_positions - len(prompt) - 1]
        if not text_tokens:
            return [], 0.0
        sequence = prompt + text_tokens + [self.tokens.eot]
        text_rows = slice(len(prompt) - 1, len(prompt) - 1 + len(text_tokens))  # the rows predicting the text
        scores, text_logits = alignment_pass(self.model, None, sequence, self.heads, self.cross_kv(features),
                                             logit_rows=text_rows)
        num_frames = max(1, min(scores.shape[-1], int(round(duration / FRAME_SECONDS))))
        matrix = alignment_matrix(scores_to_weights(scores, num_frames))[len(prompt) - 1:-1]
        text_logits = text_logits[:, :self.tokens.eot]
        probs = text_logits.softmax(dim=-1)[torch.arange(len(text_tokens)), torch.tensor(text_tokens)]
        words = time_words(text_tokens, probs.cpu().numpy(), token_start_frames(matrix), self._decode,
                           self.tokens.eot, language, FRAME_SECONDS)
        median = truncate_long_words(words)
        merge_punctuations(words)
        return words, median

    def window_words(self, features: torch.Tensor, token_ids: Sequence[int], language: str, task: str,
                     duration: float) -> List[List[WordTiming]]:
        """The words of each segment split_segments finds in the window's generated `token_ids`."""
        segments = split_segments(token_ids, self.tokens, duration)
        text_tokens = [t for _, _, segment_tokens in segments for t in segment_tokens]
        words, median = self.align(features, text_tokens, language, task, duration)
        return distribute(words, segments, duration, median)

    def windows_words(self, windows: Sequence[WindowToAlign]) -> List[List[List[WordTiming]]]:
        """window_words of each window (those that finish in the same engine step are aligned together)."""
        return [self.window_words(w.features, w.token_ids, w.language, w.task, w.duration) for w in windows]


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
