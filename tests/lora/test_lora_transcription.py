"""LoRA adapters on real Whisper weights: greedy tokens identical to HF PEFT, and transcription (language detection,
word timestamps) with an adapter gives the same result whether its requests share the engine's batches with another
adapter's and the base model's or run alone; the encoder cache never hands one adapter's encoder output to
another."""
import os

import pytest
import torch
import transformers
from conftest import require_model, require_speech_clips
from hf_reference import hf_greedy
from lora_reference import save_random_adapter

from seq2seq_engine import LLM, LoRARequest, SamplingParams, TokensPrompt
from seq2seq_engine.audio import load_audio
from seq2seq_engine.transcription.job import TranscriptionJob
from seq2seq_engine.transcription.options import TranscriptionOptions

CLIPS = ["en/quick_brown_fox.wav", "es/hola_mundo.wav"]


@pytest.fixture(scope="module")
def whisper_base(tmp_path_factory):
    model_dir = require_model("whisper-base")
    hf_model = transformers.WhisperForConditionalGeneration.from_pretrained(model_dir).eval()
    root = tmp_path_factory.mktemp("whisper_lora")
    adapters = []
    for index, (targets, scale) in enumerate([(["q_proj", "v_proj", "fc1"], 0.5), (["k_proj", "out_proj"], 0.5)]):
        path, peft_model = save_random_adapter(hf_model, root / f"adapter{index}", 8, targets, seed=30 + index,
                                               b_scale=scale)
        adapters.append((LoRARequest(f"w{index}", index + 1, path), peft_model))
    return model_dir, hf_model, adapters


def _clips():
    folder = require_speech_clips()
    return [os.path.join(folder, name) for name in CLIPS]


def test_greedy_tokens_match_peft_on_real_weights(whisper_base):
    model_dir, hf_model, adapters = whisper_base
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(model_dir)
    features = [extractor(load_audio(path), sampling_rate=16000, return_tensors="pt").input_features[0]
                for path in _clips()[:1]]
    prompt = [50258, 50259, 50359, 50363]     # <|startoftranscript|><|en|><|transcribe|><|notimestamps|>
    llm = LLM(model_dir, dtype="float32", kv_cache_space_gb=0.3, enable_lora=True, max_loras=2)
    cases = [(f, choice) for f in features for choice in (adapters[0], adapters[1], None)]
    params = SamplingParams(temperature=0.0, max_tokens=20, logprobs=0)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=prompt, multi_modal_data={"input_features": f})
                            for f, _ in cases], params, use_tqdm=False,
                           lora_request=[choice[0] if choice else None for _, choice in cases])
    for output, (f, choice) in zip(outputs, cases):
        tokens, logprobs = hf_greedy(choice[1] if choice else hf_model, f, prompt, len(output.outputs[0].token_ids),
                                     features=True)
        assert output.outputs[0].token_ids == tokens
        ours = [lp[t] for lp, t in zip(output.outputs[0].logprobs, tokens)]
        assert torch.allclose(torch.tensor(ours), torch.tensor(logprobs), atol=1e-4)


def _run_together(engine, jobs):
    """Drive several transcription jobs on one engine at once (as the server does)."""
    try:
        while True:
            for job in jobs:
                job.fill()
            if not any(job.in_flight for job in jobs):
                break
            for output in engine.step(finished_only=True):
                for job in jobs:
                    if job.owns(output.request_id):
                        job.on_output(output)
            for job in jobs:
                job.end_of_step()
    finally:
        for job in jobs:
            job.close()
    return [job.results() for job in jobs]


def _words(results):
    return [[(w.word, round(w.start, 2), round(w.end, 2)) for s in r.segments for w in s.words] for r in results]


def test_transcription_with_adapters_mixed_equals_alone(whisper_base):
    model_dir, _, adapters = whisper_base
    clips = _clips()
    llm = LLM(model_dir, dtype="float32", kv_cache_space_gb=0.3, enable_lora=True, max_loras=2)
    engine = llm.llm_engine
    choices = [adapters[0][0], adapters[1][0], None]
    options = [TranscriptionOptions(language=None, word_timestamps=True, beam_width=1, temperature=0.0,
                                    use_tqdm=False, lora_request=choice) for choice in choices]
    alone = [_run_together(engine, [TranscriptionJob(engine, clips, option)])[0] for option in options]
    engine.reset_prefix_cache()
    mixed = _run_together(engine, [TranscriptionJob(engine, clips, option) for option in options])
    for single, together in zip(alone, mixed):
        assert [r.text for r in single] == [r.text for r in together]
        assert [r.language for r in single] == [r.language for r in together]
        assert _words(single) == _words(together)
    # each adapter changed the words it heard
    assert _words(alone[0]) != _words(alone[2]) and _words(alone[1]) != _words(alone[2])
    # and the API's lora_request reaches the same requests
    via_api = llm.transcribe(clips, language=None, word_timestamps=True, beam_width=1, temperature=0.0,
                             use_tqdm=False, lora_request=choices[0])
    assert _words(via_api) == _words(alone[0])
