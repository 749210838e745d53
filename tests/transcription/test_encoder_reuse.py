"""A Whisper window's encoder runs once: detection, fallback attempts and the word-timestamp alignment pass all
read the cross K/V the engine cached for it (real whisper weights, real speech clips)."""
import os

import numpy as np
import pytest
import torch
import transformers
from conftest import require_model, require_speech_clips

from seq2seq_engine.audio import load_audio
from seq2seq_engine.engine.alignment_pass import cached_cross_kv
from seq2seq_engine.transcription.input.windows import features_for
from seq2seq_engine.transcription.timing.word_timestamps import WordAligner

pytestmark = pytest.mark.usefixtures("one_thread")

CLIPS = ["en/quick_brown_fox.wav", "en/counting.wav"]
MULTILINGUAL_CLIPS = ["es/hola_mundo.wav", "fr/bonjour_monde.wav"]
# Every window's first attempt fails (its average log probability is below -0.01) and its attempt at 0.5 is kept.
FORCED_FALLBACK = dict(temperature=(0.0, 0.5), best_of=2, log_prob_threshold=-0.01, no_speech_threshold=None)


def _clip(name):
    return load_audio(os.path.join(require_speech_clips(), name))


@pytest.fixture()
def aligners(monkeypatch):
    """Every WordAligner the transcriptions of the test make, in order."""
    made = []
    real_init = WordAligner.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(WordAligner, "__init__", init)
    return made


@pytest.fixture(scope="module")
def tiny_without_cache(tiny_dir):
    from seq2seq_engine import LLM
    return LLM(tiny_dir, kv_cache_space_gb=0.3, swap_space_gb=0.05, enable_encoder_cache=False)


def _cached(engine, features):
    return cached_cross_kv(engine.scheduler.block_manager.cross_cache, engine.cache_engine.device_cache, features,
                           engine.max_encoder_len, torch.float32)


def test_cached_cross_kv_are_hf_cross_projections(tiny_llm, tiny_dir):
    """After a window's request finishes, its cross table read back is HF's k_proj / v_proj of HF's encoder
    output, layer by layer; features the engine never saw have no cached table."""
    engine = tiny_llm.llm_engine
    samples = _clip(CLIPS[0])
    tiny_llm.transcribe(samples, use_tqdm=False)
    features = features_for(engine, samples)  # what the window's requests carried
    cross_kv = _cached(engine, features)
    assert cross_kv is not None
    hf = transformers.WhisperForConditionalGeneration.from_pretrained(tiny_dir).eval()
    with torch.no_grad():
        encoded = hf.model.encoder(features[None]).last_hidden_state[0]
        for (keys, values), layer in zip(cross_kv, hf.model.decoder.layers):
            assert keys.shape == values.shape == (1500, hf.config.d_model)
            assert (keys - layer.encoder_attn.k_proj(encoded)).abs().max().item() < 2e-3
            assert (values - layer.encoder_attn.v_proj(encoded)).abs().max().item() < 2e-3
    assert len(cross_kv) == hf.config.decoder_layers
    assert _cached(engine, features + 0.5) is None


def test_word_times_from_cached_kv_match_the_encoder_path(tiny_llm, tiny_without_cache, aligners):
    clips = [_clip(name) for name in CLIPS]
    cached = tiny_llm.transcribe(clips, word_timestamps=True, use_tqdm=False)
    recomputed = tiny_without_cache.transcribe(clips, word_timestamps=True, use_tqdm=False)
    with_cache, without_cache = aligners
    assert (with_cache.num_cache_hits, with_cache.num_encoder_runs) == (len(clips), 0)
    assert (without_cache.num_cache_hits, without_cache.num_encoder_runs) == (0, len(clips))
    for ours, reference in zip(cached, recomputed):
        words = [w for segment in ours.segments for w in segment.words]
        reference_words = [w for segment in reference.segments for w in segment.words]
        assert ours.text == reference.text and len(words) > 3
        assert [w.word for w in words] == [w.word for w in reference_words]
        # Same weights, two encoders (the engine's kernels, plain torch) whose K/V differ by float rounding (~1e-6):
        # equal times on these clips, but a near tie on the DTW path may move a boundary by one 20 ms frame.
        differences = np.array([[w.start - r.start, w.end - r.end] for w, r in zip(words, reference_words)])
        assert np.abs(differences).max() <= 0.02 + 1e-6
        assert np.median(np.abs(differences)) == 0.0
        probabilities = np.array([[w.probability, r.probability] for w, r in zip(words, reference_words)])
        assert np.abs(probabilities[:, 0] - probabilities[:, 1]).max() < 1e-3


@pytest.fixture(scope="module")
def base_dir():
    return require_model("whisper-base")


def _transcribe_counting(llm, clips, aligners):
    """(results, engine encoder runs, alignment fallback encoder runs) of one transcription with language
    detection, a forced temperature fallback and word timestamps."""
    runner = llm.llm_engine.model_runner
    before = runner.num_encoder_runs
    results = llm.transcribe(clips, language=None, word_timestamps=True, use_tqdm=False, **FORCED_FALLBACK)
    return results, runner.num_encoder_runs - before, aligners[-1].num_encoder_runs


def test_window_encoder_runs_once_through_detection_fallback_and_alignment(base_dir, aligners):
    from seq2seq_engine import LLM
    clips = [_clip(name) for name in MULTILINGUAL_CLIPS]   # each under 30 s: one window each
    cached_llm = LLM(base_dir, kv_cache_space_gb=0.3, swap_space_gb=0.01)
    cached, engine_runs, aligner_runs = _transcribe_counting(cached_llm, clips, aligners)
    del cached_llm
    plain_llm = LLM(base_dir, kv_cache_space_gb=0.3, swap_space_gb=0.01, enable_encoder_cache=False)
    plain, plain_engine_runs, plain_aligner_runs = _transcribe_counting(plain_llm, clips, aligners)
    assert [r.language for r in cached] == ["es", "fr"]
    assert all(s.temperature == 0.5 for r in cached for s in r.segments)   # the first attempt was rejected
    assert (engine_runs, aligner_runs) == (len(clips), 0)
    # Without the cache: detection and both attempts run the engine's encoder, the alignment pass its own.
    assert (plain_engine_runs, plain_aligner_runs) == (3 * len(clips), len(clips))
    for ours, reference in zip(cached, plain):
        assert ours.text == reference.text and ours.segments
        assert ours.segments == reference.segments   # span and text
        assert [s.avg_logprob for s in ours.segments] == pytest.approx([s.avg_logprob for s in reference.segments])
        assert [w.word for s in ours.segments for w in s.words] == \
            [w.word for s in reference.segments for w in s.words]
