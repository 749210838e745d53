"""Word error rate: jiwer over text normalised by Whisper's English normalizer from transformers."""
from __future__ import annotations

import functools
from typing import Iterable, List, Tuple

import jiwer
from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

# Whisper's British -> American spelling table (normalizer.json) ships neither with transformers nor with the
# CTranslate2 Whisper packages the benchmarks use, so "colour" vs "color" still counts as one error.
SPELLING_MAPPING: dict = {}


@functools.lru_cache(maxsize=1)
def _normalizer() -> EnglishTextNormalizer:
    return EnglishTextNormalizer(SPELLING_MAPPING)


def normalize(text: str) -> List[str]:
    """Words after Whisper's ``EnglishTextNormalizer``: lower case, no punctuation or fillers, contractions
    expanded, numbers as digits ("Ten apples, um." -> ["10", "apples"])."""
    return _normalizer()(text).split()


def wer(reference: str, hypothesis: str) -> float:
    """WER of one pair (errors / reference words)."""
    return corpus_wer([(reference, hypothesis)])


def corpus_wer(pairs: Iterable[Tuple[str, str]]) -> float:
    """Total errors / total reference words over (reference, hypothesis) pairs (errors alone if none)."""
    pairs = list(pairs)
    if not pairs:
        return 0.0
    references = [" ".join(normalize(reference)) for reference, _ in pairs]
    hypotheses = [" ".join(normalize(hypothesis)) for _, hypothesis in pairs]
    return jiwer.wer(references, hypotheses)


def inserted_runs(reference: str, hypothesis: str) -> List[str]:
    """The runs of words the hypothesis has and the reference does not (jiwer's alignment of the normalised texts),
    each with the reference word before it for context: 'after: inserted words'."""
    reference_words, hypothesis_words = normalize(reference), normalize(hypothesis)
    if not reference_words:
        return [" ".join(hypothesis_words)] if hypothesis_words else []
    output = jiwer.process_words(" ".join(reference_words), " ".join(hypothesis_words))
    runs = []
    for chunk in output.alignments[0]:
        if chunk.type == "insert":
            before = reference_words[chunk.ref_start_idx - 1] if chunk.ref_start_idx > 0 else "^"
            runs.append(f"{before}: {' '.join(hypothesis_words[chunk.hyp_start_idx:chunk.hyp_end_idx])}")
    return runs
