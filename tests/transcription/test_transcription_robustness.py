"""Whisper's robustness rules end to end on whisper-tiny.en vs transformers: fallback, no-speech, prompts, clips."""
import glob
import importlib.util
import os

import numpy as np
import pytest
import torch
import transformers

from seq2seq_engine.audio import load_audio
from seq2seq_engine.sampling_params import SamplingParams
from seq2seq_engine.transcription.prompts import whisper_tokens_for
from seq2seq_engine.transcription.schedule import result_assembler

pytestmark = pytest.mark.usefixtures("one_thread", "no_leaked_blocks")
SR = 16000


@pytest.fixture(scope="module")
def model_dir(tiny_dir):
    return tiny_dir


@pytest.fixture(scope="module")
def llm(tiny_llm):
    return tiny_llm


@pytest.fixture(scope="module")
def hf(model_dir):
    return transformers.WhisperForConditionalGeneration.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def clips():
    spec = importlib.util.find_spec("pytest_audioeval")
    if spec is None:
        pytest.skip("pytest-audioeval is not installed")
    folder = os.path.join(list(spec.submodule_search_locations)[0], "samples", "audio", "en")
    return {os.path.basename(p)[:-4]: load_audio(p) for p in glob.glob(os.path.join(folder, "*.wav"))}


@pytest.fixture()
def requests(llm, monkeypatch):
    """Every request the pipeline adds: (prompt dict, params, number of requests unfinished before it)."""
    engine, added = llm.llm_engine, []
    real = engine.add_request

    def spy(request_id, prompt, params, *args, **kwargs):
        added.append((prompt, params, engine.get_num_unfinished_requests()))
        return real(request_id, prompt, params, *args, **kwargs)

    monkeypatch.setattr(engine, "add_request", spy)
    return added


@pytest.fixture()
def windows(monkeypatch):
    """Per transcribed input, the WindowTokens it was stitched from (silent windows included)."""
    calls = []
    real = result_assembler.stitch
    monkeypatch.setattr(result_assembler, "stitch", lambda w, *a, **k: calls.append(list(w)) or real(w, *a, **k))
    return calls


def _hf_greedy(hf, samples, prompt, max_new_tokens, **kwargs):
    extractor = transformers.WhisperFeatureExtractor(feature_size=80)
    features = torch.from_numpy(extractor(samples, sampling_rate=SR, return_tensors="np").input_features)
    with torch.no_grad():
        out = hf.generate(features, max_new_tokens=max_new_tokens, return_dict_in_generate=True, **kwargs)
    sequence = out.sequences[0].tolist()
    assert sequence[:len(prompt)] == prompt
    tokens = sequence[len(prompt):]
    return tokens[:-1] if tokens and tokens[-1] == hf.generation_config.eos_token_id else tokens


def test_a_failing_window_is_redecoded_in_the_batch_while_the_others_finish(llm, clips, requests):
    inputs = [(clips[name], SR) for name in ("counting", "hello_world", "quick_brown_fox")]
    greedy = llm.transcribe(inputs, temperature=0.0, use_tqdm=False)
    scores = [r.segments[0].avg_logprob for r in greedy]
    weakest = int(np.argmin(scores))
    threshold = (scores[weakest] + sorted(scores)[1]) / 2  # only the weakest window fails at temperature 0
    requests.clear()
    results = llm.transcribe(inputs, temperature=(0.0, 0.5), best_of=3, log_prob_threshold=threshold, use_tqdm=False)
    for i, (result, before) in enumerate(zip(results, greedy)):
        if i == weakest:
            assert [s.temperature for s in result.segments] == [0.5]
        else:
            assert (result.text, [s.temperature for s in result.segments]) == (before.text, [0.0])
            assert result.segments[0].avg_logprob == pytest.approx(before.segments[0].avg_logprob, abs=1e-5)
    assert len(requests) == 4  # three windows, one retry
    retry_prompt, retry_params, unfinished = requests[3]
    assert unfinished >= 1  # queued while other windows of the batch were still decoding
    assert isinstance(retry_params, SamplingParams) and retry_params.temperature == 0.5
    assert retry_params.n == retry_params.best_of == 3 and retry_params.seed is not None
    assert torch.equal(retry_prompt["multi_modal_data"]["input_features"],
                       requests[weakest][0]["multi_modal_data"]["input_features"])


def test_every_temperature_is_tried_when_every_attempt_fails(llm, clips):
    result = llm.transcribe((clips["hello_world"], SR), temperature=(0.0, 0.2, 0.4), best_of=2,
                            compression_ratio_threshold=0.1, use_tqdm=False)[0]
    assert [s.temperature for s in result.segments] == [0.4]  # the last attempt is kept
    assert result.segments[0].compression_ratio > 0.1


def _hf_no_speech_prob(hf, prompt):
    """transformers' no-speech probability: softmax of the logits at <|startoftranscript|>, at <|nocaptions|>."""
    token_ids = prompt["prompt_token_ids"]
    sot = hf.generation_config.decoder_start_token_id
    with torch.no_grad():
        logits = hf(input_features=prompt["multi_modal_data"]["input_features"][None],
                    decoder_input_ids=torch.tensor([token_ids])).logits[0]
    no_speech = hf.generation_config.no_timestamps_token_id - 1
    return float(torch.softmax(logits[token_ids.index(sot)].float(), dim=-1)[no_speech])


def test_no_speech_prob_matches_transformers(llm, hf, clips, requests, windows):
    noise = (0.1 * np.random.default_rng(0).standard_normal(5 * SR)).astype(np.float32)
    long_audio = np.concatenate([clips["counting"], np.zeros(30 * SR - len(clips["counting"]), np.float32),
                                 clips["quick_brown_fox"]])
    # The second input runs sequentially: its second window's prompt starts with <|startofprev|> + the first's text.
    llm.transcribe([(clips["hello_world"], SR), (noise, SR)], temperature=0.0, no_speech_threshold=None,
                   use_tqdm=False)
    llm.transcribe([long_audio], temperature=0.0, condition_on_previous_text=True, max_new_tokens=48,
                   use_tqdm=False, vad_filter=False)
    decoded = [w for per_input in windows for w in per_input]
    assert len(requests) == len(decoded) == 4
    assert requests[3][0]["prompt_token_ids"][0] == llm.get_tokenizer().convert_tokens_to_ids("<|startofprev|>")
    for (prompt, _, _), window in zip(requests, decoded):
        assert window.no_speech_prob == pytest.approx(_hf_no_speech_prob(hf, prompt), abs=1e-4)
    assert decoded[0].no_speech_prob < 0.1 < 0.6 < decoded[1].no_speech_prob


def test_a_silent_window_gives_no_text(llm, clips):
    noise = (0.1 * np.random.default_rng(0).standard_normal(5 * SR)).astype(np.float32)
    greedy = dict(temperature=0.0, beam_width=1, use_tqdm=False)   # the rule's scores as openai-whisper's greedy pass
    decoded, skipped = (llm.transcribe([(noise, SR)], no_speech_threshold=None, **greedy)
                        + llm.transcribe([(noise, SR)], **greedy))
    assert decoded.text and decoded.segments[0].avg_logprob < -1.0 and decoded.segments[0].no_speech_prob > 0.6
    assert (skipped.text, skipped.segments) == ("", [])


def test_initial_prompt_and_prefix_set_the_decoder_prompt_as_openai_whisper(llm, hf, model_dir, clips, requests):
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    sot, no_timestamps = tokenizer.convert_tokens_to_ids(["<|startoftranscript|>", "<|notimestamps|>"])
    fox = clips["quick_brown_fox"]
    long_audio = np.concatenate([fox, np.zeros(30 * SR - len(fox), np.float32), clips["hello_world"]])
    results = llm.transcribe([(fox, SR), long_audio], temperature=0.0, initial_prompt="Animals: fox, dog.",
                             max_new_tokens=40, use_tqdm=False, vad_filter=False)
    prompt_ids = tokenizer.get_prompt_ids("Animals: fox, dog.").tolist()  # <|startofprev|> + " Animals: fox, dog."
    assert prompt_ids[1:] == tokenizer.encode(" Animals: fox, dog.", add_special_tokens=False)
    prompts = [p["prompt_token_ids"] for p, _, _ in requests]
    assert prompts == [prompt_ids + [sot, no_timestamps]] * 2 + [[sot, no_timestamps]]  # first windows only
    expected = _hf_greedy(hf, fox, prompt_ids + [sot, no_timestamps], 40, prompt_ids=torch.tensor(prompt_ids))
    assert results[0].text == tokenizer.decode(expected, skip_special_tokens=True).strip()

    requests.clear()
    prefixed = llm.transcribe([(fox, SR)], temperature=0.0, prefix="The quick", hotwords="fox",
                              use_tqdm=False)[0]
    hinted = llm.transcribe([long_audio], temperature=0.0, hotwords="fox", timestamps=True, prefix="The",
                            use_tqdm=False, vad_filter=False)[0]
    quick, the, hot = (tokenizer.encode(text, add_special_tokens=False) for text in (" The quick", " The", " fox"))
    timestamp_0 = no_timestamps + 1
    prev = tokenizer.convert_tokens_to_ids("<|startofprev|>")
    assert [p["prompt_token_ids"] for p, _, _ in requests] == [
        [sot, no_timestamps] + quick, [sot, timestamp_0] + the, [prev] + hot + [sot]]
    assert prefixed.text.startswith("The quick brown fox")
    assert hinted.text.startswith("The") and hinted.segments[0].start == 0.0


def test_clip_timestamps_transcribe_only_the_clips(llm, hf, clips, windows):
    fox, counting = clips["quick_brown_fox"], clips["counting"]
    audio = np.concatenate([counting, np.zeros(30 * SR - len(counting), np.float32), fox,
                            np.zeros(5 * SR, np.float32)])
    result = llm.transcribe([audio], temperature=0.0, timestamps=True, clip_timestamps="30,36",
                            use_tqdm=False, vad_filter=False)[0]
    clip = audio[30 * SR:36 * SR]
    assert [(w.offset, w.duration) for w in windows[0]] == [(30.0, 6.0)]
    tokens = whisper_tokens_for(llm.llm_engine)
    assert windows[0][0].token_ids == _hf_greedy(hf, clip, tokens.prompt(timestamps=True), 224,
                                                 return_timestamps=True, force_unique_generate_call=True)
    assert "fox" in result.text and "one" not in result.text.lower() and "1" not in result.text
    assert all(30.0 <= s.start < s.end <= 36.0 for s in result.segments)


def test_seeded_sampling_is_reproducible(llm, clips):
    hello, fox, counting = (clips[n] for n in ("hello_world", "quick_brown_fox", "counting"))
    kwargs = dict(temperature=1.0, best_of=2, max_new_tokens=30, use_tqdm=False)
    first = llm.transcribe([(counting, SR), (hello, SR)], **kwargs)
    again = llm.transcribe([(counting, SR), (fox, SR)], **kwargs)  # another batch around the same first input
    assert first[0].text == again[0].text
    assert first[0].segments[0].avg_logprob == pytest.approx(again[0].segments[0].avg_logprob, abs=1e-5)
    assert [s.temperature for s in first[0].segments] == [1.0]
    others = [llm.transcribe([(counting, SR)], seed=seed, **kwargs)[0].text for seed in (1, 2, 3)]
    assert len({first[0].text, *others}) > 1  # the seed changes the samples


@pytest.mark.parametrize("rate", [-16000, 0])
def test_a_bad_sample_rate_fails_its_input_alone_with_the_progress_bar_on(tiny_llm, clips, rate):
    """A non-positive sample rate is that input's error, named; the other input transcribes and the bar runs."""
    samples = next(iter(clips.values()))
    bad, good = tiny_llm.transcribe([(samples, rate), (samples, 16000)], use_tqdm=True, temperature=0.0)
    assert bad.error is not None and "sample rate must be a positive integer" in bad.error
    assert good.error is None and good.text
    [alone] = tiny_llm.transcribe([(samples, rate)], use_tqdm=True)
    assert "sample rate must be a positive integer" in alone.error


def test_scraps_of_audio_give_text_only_when_speech_is_likely(clips):
    """0.2 s cuts from the middle of every English clip, on whisper base: a cut that gives text has a no-speech
    probability at most the threshold (under a second of audio, confident stock phrases are not kept)."""
    from conftest import require_model

    from seq2seq_engine import LLM
    base = LLM(require_model("whisper-base"), kv_cache_space_gb=0.3)
    cuts = [(samples[len(samples) // 2:len(samples) // 2 + 3200], 16000) for samples in clips.values()]
    results = base.transcribe(cuts, use_tqdm=False, temperature=0.0, language="en")
    kept = [segment for result in results for segment in result.segments]
    assert all(segment.no_speech_prob <= 0.6 for segment in kept)
    assert all(result.error is None for result in results)
