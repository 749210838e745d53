"""Whisper on CUDA from raw audio (sines in white noise, no files) with a forced decoder prompt: the engine's own
log-mel features and encoder against HF transformers fed by its WhisperFeatureExtractor, float32 without TF32."""
import pytest
import torch
import transformers
from cuda_models import (WHISPER_FORCED_PROMPT, Case, agreement, load_hf, run_engine, save_checkpoint, sine_and_noise,
                         strict_float32)

from seq2seq_engine import TokensPrompt

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_audio_with_forced_prompt_gives_hf_tokens(tmp_path):
    model_dir = save_checkpoint("whisper", tmp_path)
    audios = [sine_and_noise(3.0, 440.0, 0), sine_and_noise(11.5, 1000.0, 1), sine_and_noise(30.0, 220.0, 2)]
    extractor = transformers.WhisperFeatureExtractor(feature_size=80)
    features = [torch.from_numpy(extractor(a, sampling_rate=16000, return_tensors="np").input_features[0])
                for a in audios]
    prompts = [TokensPrompt(prompt_token_ids=WHISPER_FORCED_PROMPT, multi_modal_data={"audio": (a, 16000)})
               for a in audios]
    case = Case("whisper", model_dir, prompts, features, [WHISPER_FORCED_PROMPT] * len(audios))
    with strict_float32():
        outputs = run_engine(model_dir, prompts, "float32", enforce_eager=False)
        assert [o.prompt_token_ids for o in outputs] == case.decoder_prompts
        result = agreement(case, outputs, load_hf(case, torch.float32))
    assert result.mismatches == []
    assert result.max_logprob_diff < 1e-3
