"""`gpu_throughput.py`'s workloads: random Whisper large-v3 and BART-large shaped models built on the device, saved once
for this engine's loader, and one timed generation of each engine (this engine and HF `generate`) on the same inputs."""
import argparse
import dataclasses
import math
import time
from typing import Any, Dict, List, Optional

import torch
import transformers

from seq2seq_engine import LLM, SamplingParams, TokensPrompt
from seq2seq_engine.inputs.data import ExplicitEncoderDecoderPrompt

# large-v3's special tokens: <|endoftext|>, <|startoftranscript|>, <|en|>, <|translate|>, <|transcribe|>,
# <|notimestamps|>; the forced prompt is the last four after <|startoftranscript|>
WHISPER_EOT, WHISPER_SOT, WHISPER_EN, WHISPER_TRANSLATE, WHISPER_TRANSCRIBE, WHISPER_NO_TS = (
    50257, 50258, 50259, 50359, 50360, 50364)
WHISPER_PROMPT = [WHISPER_SOT, WHISPER_EN, WHISPER_TRANSCRIBE, WHISPER_NO_TS]
WHISPER_SHAPES = {
    "full": dict(d_model=1280, encoder_layers=32, decoder_layers=32, encoder_attention_heads=20,
                 decoder_attention_heads=20, encoder_ffn_dim=5120, decoder_ffn_dim=5120, num_mel_bins=128),
    "tiny": dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                 encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=80),
}
BART_SHAPES = {
    "full": dict(d_model=1024, encoder_layers=12, decoder_layers=12, encoder_attention_heads=16,
                 decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096),
    "tiny": dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                 encoder_ffn_dim=128, decoder_ffn_dim=128),
}
BART_DECODER_PROMPT = [2, 0]   # decoder_start, bos
WINDOW_SECONDS = 30.0          # 3000 feature frames of 10 ms: 1500 encoder positions


def tiny_cpu_args(**sizes: Any) -> argparse.Namespace:
    """The arguments the workloads read, for the tiny shapes at float32 on the CPU (host-time measurements and
    tests), with `sizes` (max_batch, whisper_new_tokens, bart_docs, ...) added."""
    return argparse.Namespace(device="cpu", dtype="float32", shape="tiny", seed=0, enforce_eager=False,
                              kv_cache_dtype="auto", max_num_batched_tokens=None, **sizes)


def synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


@dataclasses.dataclass
class Setup:
    """The engines of one workload: the HF model (in memory) and this engine loaded from its saved copy."""
    hf: Any
    ours: Any
    seconds: Dict[str, float]


def _build_hf(model_class, config, device: str, dtype: torch.dtype, seed: int):
    """Random weights created directly on the device in `dtype` (a large-v3 shape takes seconds, not minutes)."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_class._from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def load_ours(model_dir: str, args, dtype: str, num_blocks: int) -> Any:
    kwargs = dict(dtype=dtype, device=args.device, skip_tokenizer_init=True, num_gpu_blocks_override=num_blocks,
                  swap_space_gb=0.1, max_num_seqs=max(256, args.max_batch))
    if args.enforce_eager:
        kwargs["enforce_eager"] = True
    if getattr(args, "async_scheduling", False):
        kwargs["async_scheduling"] = True
    if args.kv_cache_dtype != "auto":
        kwargs["kv_cache_dtype"] = args.kv_cache_dtype
    if args.max_num_batched_tokens:
        kwargs["max_num_batched_tokens"] = args.max_num_batched_tokens
    return LLM(model_dir, **kwargs)


def _setup(model_class, config, model_dir: str, args, num_blocks: int, configure=None) -> Setup:
    seconds = {}
    start = time.perf_counter()
    hf = _build_hf(model_class, config, args.device, getattr(torch, args.dtype), args.seed)
    if configure:
        configure(hf.generation_config)
    synchronize(args.device)
    seconds["build"] = time.perf_counter() - start
    start = time.perf_counter()
    hf.save_pretrained(model_dir)
    seconds["save"] = time.perf_counter() - start
    start = time.perf_counter()
    ours = load_ours(model_dir, args, args.dtype, num_blocks)
    seconds["load_ours"] = time.perf_counter() - start
    return Setup(hf, ours, seconds)


def blocks_for(encoder_lens: List[int], decoder_len: int, block_size: int = 16) -> int:
    """KV blocks for every request at once (self + cross), plus 1% and 16 spare: a Whisper large-v3 pool for 128
    windows is 34 GB, beside HF's own cache of about the same size during its rounds."""
    need = sum(math.ceil(n / block_size) + math.ceil(decoder_len / block_size) for n in encoder_lens)
    return int(need * 1.01) + 16


# ---------------------------------------------------------------------------------------------- Whisper
def _whisper_generation_config(generation_config) -> None:
    """What HF's Whisper generate needs to force <|en|><|transcribe|><|notimestamps|> without a tokenizer."""
    fields = dict(lang_to_id={"<|en|>": WHISPER_EN}, no_timestamps_token_id=WHISPER_NO_TS,
                  task_to_id={"translate": WHISPER_TRANSLATE, "transcribe": WHISPER_TRANSCRIBE}, is_multilingual=True,
                  decoder_start_token_id=WHISPER_SOT, forced_decoder_ids=None, suppress_tokens=[],
                  begin_suppress_tokens=[])
    for name, value in fields.items():  # setattr: GenerationConfig.update skips fields it does not have yet
        setattr(generation_config, name, value)


def whisper_setup(args, model_dir: str) -> Setup:
    config = transformers.WhisperConfig(vocab_size=51866, max_source_positions=1500, max_target_positions=448,
                                        decoder_start_token_id=WHISPER_SOT, eos_token_id=WHISPER_EOT,
                                        pad_token_id=WHISPER_EOT, bos_token_id=WHISPER_EOT, suppress_tokens=[],
                                        begin_suppress_tokens=[], init_std=0.02, **WHISPER_SHAPES[args.shape])
    blocks = blocks_for([1500] * args.max_batch, len(WHISPER_PROMPT) + args.whisper_new_tokens)
    return _setup(transformers.WhisperForConditionalGeneration, config, model_dir, args, blocks,
                  _whisper_generation_config)


def whisper_memory_gib(args, setup: Setup) -> Dict[str, float]:
    """Estimated device memory: both engines' weights, our KV pool and HF's K/V at the largest batch (its
    cross-attention cache of 1500 positions per window dominates)."""
    config = setup.hf.config
    element = setup.hf.dtype.itemsize
    weights = sum(p.numel() for p in setup.hf.parameters()) * element
    per_token = 2 * config.decoder_layers * config.d_model * element   # K and V of every decoder layer
    pool = setup.ours.llm_engine.cache_config.num_gpu_blocks * 16 * per_token
    hf_cache = args.max_batch * (1500 + len(WHISPER_PROMPT) + args.whisper_new_tokens) * per_token
    return {name: round(value / 2**30, 1) for name, value in
            (("weights_x2", 2 * weights), ("our_kv_pool", pool), ("hf_kv_cache", hf_cache),
             ("total", 2 * weights + pool + hf_cache))}


def whisper_features(args, count: int) -> List[torch.Tensor]:
    """`count` 30 s windows of random log-mel features [n_mels, 3000] in the range of real ones, float32 on the CPU
    (where a caller's feature extractor leaves them)."""
    generator = torch.Generator().manual_seed(args.seed)
    n_mels = WHISPER_SHAPES[args.shape]["num_mel_bins"]
    return [(torch.randn(n_mels, 3000, generator=generator) * 0.4 - 0.3).clamp_(-1.0, 1.5) for _ in range(count)]


def whisper_ours(llm, features: List[torch.Tensor], new_tokens: int) -> List[List[int]]:
    prompts = [TokensPrompt(prompt_token_ids=WHISPER_PROMPT, multi_modal_data={"input_features": f})
               for f in features]
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, min_tokens=new_tokens)
    llm.reset_prefix_cache()  # no run reuses the encoder outputs of the warm-up or an earlier round
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


@torch.no_grad()
def whisper_hf(model, features: List[torch.Tensor], new_tokens: int) -> List[List[int]]:
    """One generate call on the whole batch (HF's own batching), the prompt forced by language and task."""
    batch = torch.stack(features).to(device=model.device, dtype=model.dtype)
    out = model.generate(batch, language="en", task="transcribe", return_timestamps=False, do_sample=False,
                         num_beams=1, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    sequences = out.sequences if hasattr(out, "sequences") else out
    return [row[-new_tokens:] for row in sequences.tolist()]


# ---------------------------------------------------------------------------------------------- BART
def bart_setup(args, model_dir: str, documents: List[List[int]]) -> Setup:
    config = transformers.BartConfig(vocab_size=50265, max_position_embeddings=1024, init_std=0.02,
                                     decoder_start_token_id=2, forced_bos_token_id=None, forced_eos_token_id=None,
                                     pad_token_id=1, bos_token_id=0, eos_token_id=2, **BART_SHAPES[args.shape])
    blocks = blocks_for([len(d) for d in documents], len(BART_DECODER_PROMPT) + args.bart_new_tokens)
    return _setup(transformers.BartForConditionalGeneration, config, model_dir, args, blocks,
                  lambda g: g.update(forced_bos_token_id=None, forced_eos_token_id=None, num_beams=1))


def bart_documents(args) -> List[List[int]]:
    generator = torch.Generator().manual_seed(args.seed)
    lengths = torch.randint(args.bart_min_len, args.bart_max_len + 1, (args.bart_docs,), generator=generator)
    return [torch.randint(4, 50265, (int(n),), generator=generator).tolist() for n in lengths]


def bart_ours(llm, documents: List[List[int]], new_tokens: int) -> List[List[int]]:
    prompts = [ExplicitEncoderDecoderPrompt(encoder_prompt=TokensPrompt(prompt_token_ids=d),
                                            decoder_prompt=TokensPrompt(prompt_token_ids=BART_DECODER_PROMPT))
               for d in documents]
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, min_tokens=new_tokens)
    llm.reset_prefix_cache()  # no run reuses the encoder outputs of the warm-up or an earlier round
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


@torch.no_grad()
def bart_hf(model, documents: List[List[int]], new_tokens: int, batch_size: int) -> List[List[int]]:
    """generate in batches of `batch_size` documents in input order, right-padded with an attention mask."""
    results: List[List[int]] = []
    for start in range(0, len(documents), batch_size):
        part = documents[start:start + batch_size]
        width = max(len(d) for d in part)
        ids = torch.full((len(part), width), 1, dtype=torch.long)
        mask = torch.zeros((len(part), width), dtype=torch.long)
        for row, doc in enumerate(part):
            ids[row, :len(doc)] = torch.tensor(doc)
            mask[row, :len(doc)] = 1
        decoder = torch.tensor([BART_DECODER_PROMPT] * len(part), device=model.device)
        out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                             decoder_input_ids=decoder, do_sample=False, num_beams=1, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens)
        results += [row[-new_tokens:] for row in out.tolist()]
    return results


def agreement(ours: Optional[List[List[int]]], hf: Optional[List[List[int]]]) -> Dict[str, float]:
    """Share of requests with identical tokens and the mean common prefix as a share of the length."""
    if not ours or not hf:
        return {}
    same = sum(a == b for a, b in zip(ours, hf))
    prefixes = []
    for a, b in zip(ours, hf):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prefixes.append(n / max(len(a), len(b), 1))
    return {"identical": same / len(ours), "common_prefix": sum(prefixes) / len(prefixes)}
