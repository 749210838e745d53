"""Small random-initialised BART, T5, Whisper and Llama checkpoints (head size 64, saved with `save_pretrained`), their
mixed-length prompts, and HF transformers' teacher-forced logits on any device: the reference of the CUDA tests."""
import contextlib
import dataclasses
import gc
from typing import Any, Dict, List, Optional

import numpy as np
import torch
import transformers

from seq2seq_engine import LLM, SamplingParams, TokensPrompt
from seq2seq_engine.inputs.data import ExplicitEncoderDecoderPrompt

DEVICE = "cuda"
VOCAB = 512
NUM_TOKENS = 24
WHISPER_START = 3
# Whisper's <|startoftranscript|><|en|><|transcribe|><|notimestamps|>, in the small vocabulary
WHISPER_FORCED_PROMPT = [WHISPER_START, 10, 11, 12]
ENCODER_LENS = [5, 40, 97, 3, 170, 18, 64, 33]
DECODER_ONLY_LENS = [1, 6, 13, 3, 40, 9, 77, 20]
# per request: requests finish at different steps, so the decode batch shrinks through sizes 8 to 1 (with CUDA
# graphs: batches padded up to the captured sizes)
MAX_TOKENS = [NUM_TOKENS, 10, 17, NUM_TOKENS, 5, 21, 13, NUM_TOKENS]
SPECIAL = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2)
SHAPE = dict(encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
             encoder_ffn_dim=512, decoder_ffn_dim=512, d_model=256, init_std=0.1)

CONFIGS = {
    "bart": lambda: transformers.BartConfig(vocab_size=VOCAB, max_position_embeddings=256, decoder_start_token_id=2,
                                            forced_bos_token_id=None, forced_eos_token_id=None, **SHAPE, **SPECIAL),
    "whisper": lambda: transformers.WhisperConfig(vocab_size=VOCAB, num_mel_bins=80, max_source_positions=1500,
                                                  max_target_positions=128, decoder_start_token_id=WHISPER_START,
                                                  suppress_tokens=[], begin_suppress_tokens=[], **SHAPE, **SPECIAL),
    "t5": lambda: transformers.T5Config(vocab_size=VOCAB, d_model=256, d_kv=64, d_ff=512, num_heads=4, num_layers=2,
                                        num_decoder_layers=2, relative_attention_num_buckets=32,
                                        relative_attention_max_distance=64, feed_forward_proj="gated-gelu",
                                        tie_word_embeddings=False, decoder_start_token_id=0, pad_token_id=0,
                                        eos_token_id=1),
    "llama": lambda: transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512,
                                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                              max_position_embeddings=512, initializer_range=0.1, **SPECIAL),
}
CLASSES = {"bart": transformers.BartForConditionalGeneration, "whisper": transformers.WhisperForConditionalGeneration,
           "t5": transformers.T5ForConditionalGeneration, "llama": transformers.LlamaForCausalLM}


@dataclasses.dataclass
class Case:
    """A saved checkpoint and its requests: the engine prompts, each request's encoder input (token ids, log-mel
    features or None) and the decoder prompt its output must report."""
    arch: str
    model_dir: str
    prompts: List[Any]
    encoders: List[Optional[torch.Tensor]]
    decoder_prompts: List[List[int]]


def save_checkpoint(arch: str, tmp_path) -> str:
    """The random checkpoint of `arch` (seed 0) saved to a folder under `tmp_path`. T5 gets a small untied head
    (std 0.1; its default init gives logits in the tens) and wide relative-position tables, so positions matter."""
    torch.manual_seed(0)
    model = CLASSES[arch](CONFIGS[arch]()).eval()
    if arch == "t5":
        with torch.no_grad():
            model.lm_head.weight.normal_(0.0, 0.1)
            for name, param in model.named_parameters():
                if "relative_attention_bias" in name:
                    param.normal_(0.0, 1.0)
    model_dir = str(tmp_path / arch)
    model.save_pretrained(model_dir)
    return model_dir


def _ids(generator: torch.Generator, length: int) -> List[int]:
    return torch.randint(4, VOCAB, (length,), generator=generator).tolist()


def _text_requests(arch: str, generator: torch.Generator):
    """Encoder/decoder text requests: encoders of 3 to 170 tokens; every third with the default decoder prompt
    (BART: [start, bos], T5: [start]), the others explicit ones of 1 to 3 tokens after the start token."""
    start = 2 if arch == "bart" else 0
    default = [start, 0] if arch == "bart" else [start]
    prompts, encoders, decoders = [], [], []
    for i, length in enumerate(ENCODER_LENS):
        encoder = _ids(generator, length)
        encoders.append(torch.tensor(encoder))
        if i % 3 == 0:
            prompts.append(TokensPrompt(prompt_token_ids=encoder))
            decoders.append(default)
            continue
        decoder = [start] + _ids(generator, i % 3 + (i % 2))
        prompts.append(ExplicitEncoderDecoderPrompt(encoder_prompt=TokensPrompt(prompt_token_ids=encoder),
                                                    decoder_prompt=TokensPrompt(prompt_token_ids=decoder)))
        decoders.append(decoder)
    return prompts, encoders, decoders


def _whisper_requests(generator: torch.Generator):
    """Random log-mel windows [80, 3000] (30 s); decoder prompts of 1 to 4 tokens, the forced prompt among them."""
    prompts, encoders, decoders = [], [], []
    for i in range(len(ENCODER_LENS)):
        features = (torch.randn(80, 3000, generator=generator) * 0.4).clamp_(-1.5, 1.5)
        decoder = WHISPER_FORCED_PROMPT if i % 2 else [WHISPER_START] + _ids(generator, i % 4)
        prompts.append(TokensPrompt(prompt_token_ids=decoder, multi_modal_data={"input_features": features}))
        encoders.append(features)
        decoders.append(decoder)
    return prompts, encoders, decoders


def build_case(arch: str, tmp_path) -> Case:
    model_dir = save_checkpoint(arch, tmp_path)
    generator = torch.Generator().manual_seed(7)
    if arch == "llama":
        decoders = [_ids(generator, n) for n in DECODER_ONLY_LENS]
        prompts = [TokensPrompt(prompt_token_ids=d) for d in decoders]
        return Case(arch, model_dir, prompts, [None] * len(prompts), decoders)
    prompts, encoders, decoders = (_whisper_requests(generator) if arch == "whisper"
                                   else _text_requests(arch, generator))
    return Case(arch, model_dir, prompts, encoders, decoders)


def load_hf(case: Case, dtype: torch.dtype):
    """The checkpoint loaded back by transformers (its own loading code) onto DEVICE, eager attention (the plain
    matmul-softmax-matmul every architecture has)."""
    model = CLASSES[case.arch].from_pretrained(case.model_dir, dtype=dtype, attn_implementation="eager")
    return model.to(DEVICE).eval()


def run_engine(model_dir: str, prompts: List[Any], dtype: str, enforce_eager: bool, kv_cache_dtype: str = "auto",
               async_scheduling: bool = False):
    """Greedy outputs of the engine on CUDA (EOS ignored, `MAX_TOKENS[i]` tokens for request i, top-1 logprobs);
    the engine and its KV pool are freed before returning."""
    llm = LLM(model_dir, skip_tokenizer_init=True, dtype=dtype, device=DEVICE, enforce_eager=enforce_eager,
              num_gpu_blocks_override=1024, swap_space_gb=0.05, max_num_seqs=16, kv_cache_dtype=kv_cache_dtype,
              async_scheduling=async_scheduling)
    key_cache = llm.llm_engine.cache_engine.device_cache[0][0]
    cache_dtype = torch.float8_e4m3fn if kv_cache_dtype == "fp8" else getattr(torch, dtype)
    assert (key_cache.device.type, key_cache.dtype) == (DEVICE, cache_dtype)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, logprobs=0)
              for n in MAX_TOKENS[:len(prompts)]]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    if async_scheduling:
        run_engine.steps_ahead = llm.llm_engine.async_scheduler.steps_ahead
    for output, max_tokens in zip(outputs, MAX_TOKENS):
        assert len(output.outputs[0].token_ids) == max_tokens and output.outputs[0].finish_reason == "length"
    del llm, key_cache
    gc.collect()
    torch.cuda.empty_cache()
    return outputs


@torch.no_grad()
def teacher_forced_logits(model, encoder: Optional[torch.Tensor], decoder_prompt: List[int],
                          tokens: List[int]) -> torch.Tensor:
    """[len(tokens), vocab] float32: HF's logits for each generated token given the prompt and the tokens before
    it, from one full forward (no cache, no generate processors)."""
    device = model.device
    sequence = torch.tensor([decoder_prompt + tokens[:-1]], device=device)
    if encoder is None:
        logits = model(input_ids=sequence, use_cache=False).logits
    elif encoder.dim() == 2:  # log-mel features
        features = encoder.unsqueeze(0).to(device=device, dtype=model.dtype)
        logits = model(input_features=features, decoder_input_ids=sequence, use_cache=False).logits
    else:
        ids = encoder.unsqueeze(0).to(device)
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), decoder_input_ids=sequence,
                       use_cache=False).logits
    return logits[0, len(decoder_prompt) - 1:].float()


@dataclasses.dataclass
class Agreement:
    """How generated tokens compare with HF's teacher-forced logits: the share that is HF's argmax, the largest
    logit gap from HF's best token, and the largest logprob difference (where logprobs were returned)."""
    argmax_share: float
    max_gap: float
    max_logprob_diff: float
    mismatches: List[str]


def agreement(case: Case, outputs, model) -> Agreement:
    matched = total = 0
    max_gap = max_logprob_diff = 0.0
    mismatches = []
    for index, output in enumerate(outputs):
        completion = output.outputs[0]
        tokens = list(completion.token_ids)
        logits = teacher_forced_logits(model, case.encoders[index], case.decoder_prompts[index], tokens)
        chosen = torch.tensor(tokens, device=logits.device)
        best = logits.argmax(dim=-1)
        gaps = logits.max(dim=-1).values - logits.gather(1, chosen[:, None])[:, 0]
        matched += int((best == chosen).sum())
        total += len(tokens)
        max_gap = max(max_gap, float(gaps.max()))
        if completion.logprobs:
            ours = torch.tensor([lp[t] for lp, t in zip(completion.logprobs, tokens)])
            theirs = torch.log_softmax(logits, dim=-1).gather(1, chosen[:, None])[:, 0].cpu()
            max_logprob_diff = max(max_logprob_diff, float((ours - theirs).abs().max()))
        if not torch.equal(best, chosen):
            first = int((best != chosen).nonzero()[0, 0])
            mismatches.append(f"request {index}: token {first} is {tokens[first]}, HF's argmax {int(best[first])} "
                              f"(gap {float(gaps[first]):.4f})")
    return Agreement(matched / max(total, 1), max_gap, max_logprob_diff, mismatches)


def sine_and_noise(seconds: float, frequency: float, seed: int) -> np.ndarray:
    """16 kHz float32 audio: a sine at `frequency` Hz (amplitude 0.3) plus white noise (std 0.05)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000.0
    return (0.3 * np.sin(2 * np.pi * frequency * t) + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)


@contextlib.contextmanager
def strict_float32():
    """float32 matmuls and convolutions in full float32 (no TF32) on both sides, restored afterwards."""
    saved: Dict[str, bool] = {"matmul": torch.backends.cuda.matmul.allow_tf32, "cudnn": torch.backends.cudnn.allow_tf32}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved["matmul"]
        torch.backends.cudnn.allow_tf32 = saved["cudnn"]
