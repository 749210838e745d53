"""The engine's alignment pass (EnginePort.align) against the plain-torch oracle on real whisper-base weights: the
heads' scores and token probabilities of windows run together, and the word times a transcription gets from each."""
import os

import pytest
import torch
from alignment_oracle import alignment_pass
from conftest import require_model, require_speech_clips

from seq2seq_engine.audio import load_audio
from seq2seq_engine.engine_port import AlignmentRequest, AlignmentResult
from seq2seq_engine.models.whisper_alignment import alignment_heads
from seq2seq_engine.transcription.input.windows import features_for

pytestmark = pytest.mark.usefixtures("one_thread")

CLIPS = ["en/quick_brown_fox.wav", "en/counting.wav", "es/pangrama.wav"]


@pytest.fixture(scope="module")
def base_llm():
    from seq2seq_engine import LLM
    return LLM(require_model("whisper-base"), kv_cache_space_gb=0.3, swap_space_gb=0.01)


@pytest.fixture(scope="module")
def clip_requests(base_llm):
    return _requests(base_llm, CLIPS)


def _heads(engine):
    return alignment_heads(engine.hf_config, engine.generation_defaults.values)


def _oracle(engine, request):
    """The oracle's AlignmentResult of one request (its own plain-torch encoder over the features)."""
    model = engine.model_runner.model
    rows = slice(request.first_scored_row, request.first_scored_row + request.num_scored)
    scores, logits = alignment_pass(model, request.features, request.token_ids, _heads(engine), logit_rows=rows)
    targets = torch.tensor([int(t) for t in request.token_ids[rows.start + 1:rows.stop + 1]])
    probs = logits[:, :request.vocab_limit].softmax(-1)[torch.arange(request.num_scored), targets]
    return AlignmentResult(scores, probs, False)


def _requests(llm, names):
    """Each clip's window transcribed, then its text after `sot lang transcribe notimestamps` and before eot."""
    engine, tokenizer = llm.llm_engine, llm.get_tokenizer()
    requests = []
    for name in names:
        samples = load_audio(os.path.join(require_speech_clips(), name))
        result, = llm.transcribe([samples], use_tqdm=False)
        prompt = tokenizer.convert_tokens_to_ids(["<|startoftranscript|>", f"<|{result.language}|>",
                                                  "<|transcribe|>", "<|notimestamps|>"])
        text = tokenizer.encode(" " + result.text.strip(), add_special_tokens=False)
        eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
        requests.append(AlignmentRequest(features_for(engine, samples), prompt + text + [eot], len(prompt) - 1,
                                         len(text), eot))
    return requests


def test_windows_run_together_match_the_oracle_and_each_alone(base_llm, clip_requests):
    engine = base_llm.llm_engine
    requests = clip_requests
    together = engine.align(requests)
    assert all(result.cross_kv_cached for result in together)  # the transcriptions' cached cross K/V
    for request, result in zip(requests, together):
        alone, = engine.align([request])
        expected = _oracle(engine, request)
        assert result.scores.shape == expected.scores.shape == (len(_heads(engine)), len(request.token_ids), 1500)
        assert (result.scores.softmax(-1) - expected.scores.softmax(-1)).abs().max().item() < 1e-4
        assert (result.token_probs - expected.token_probs).abs().max().item() < 1e-4
        assert (result.scores - alone.scores).abs().max().item() < 1e-4
        assert (result.token_probs - alone.token_probs).abs().max().item() < 1e-5


def test_word_times_match_the_oracle_within_20_ms(base_llm, monkeypatch):
    clips = [load_audio(os.path.join(require_speech_clips(), name)) for name in CLIPS]
    ours = base_llm.transcribe(clips, word_timestamps=True, use_tqdm=False)
    engine = base_llm.llm_engine
    monkeypatch.setattr(engine, "align", lambda requests: [_oracle(engine, request) for request in requests])
    reference = base_llm.transcribe(clips, word_timestamps=True, use_tqdm=False)
    for mine, theirs in zip(ours, reference):
        words = [w for segment in mine.segments for w in segment.words]
        expected = [w for segment in theirs.segments for w in segment.words]
        assert mine.text == theirs.text and [w.word for w in words] == [w.word for w in expected] and len(words) > 3
        assert max(abs(a.start - b.start) + abs(a.end - b.end) for a, b in zip(words, expected)) <= 0.02
        assert max(abs(a.probability - b.probability) for a, b in zip(words, expected)) < 1e-3


@pytest.mark.parametrize("change, message", [
    (dict(token_ids=list(range(449))), "token_ids has 449 tokens; 1 to 448"),
    (dict(num_scored=99), "must each have a next token"),
    (dict(vocab_limit=10), "not below vocab_limit 10"),
])
def test_a_request_the_pass_cannot_run_is_refused_by_name(base_llm, clip_requests, change, message):
    good = clip_requests[0]
    fields = {**dict(features=good.features, token_ids=good.token_ids, first_scored_row=good.first_scored_row,
                     num_scored=good.num_scored, vocab_limit=good.vocab_limit), **change}
    with pytest.raises(ValueError, match=r"alignment request 1: .*" + message):
        base_llm.llm_engine.align([good, AlignmentRequest(**fields)])
