"""`cache_reuse.py`'s translation workload: one document into several target languages with a random M2M100 (NLLB's
architecture), each language forced by the decoder prompt [decoder_start, language token]; this engine with its
encoder cache on or off, and HF `generate` on the same weights as one batch."""
from __future__ import annotations

import dataclasses
import random
from typing import List

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch

# isort: split
import torch
import transformers

from benchmarks.lib.cache_workloads import CacheRun, cache_label, measured
from seq2seq_engine import LLM, SamplingParams, TokensPrompt
from seq2seq_engine.inputs.data import ExplicitEncoderDecoderPrompt

# full: facebook/nllb-200-distilled-600M's layers (its vocabulary of 256,206 cut to 32,000 to save memory)
SHAPES = {
    "full": dict(d_model=1024, encoder_layers=12, decoder_layers=12, encoder_attention_heads=16,
                 decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096, vocab_size=32000),
    "small": dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                  decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, vocab_size=32000),
    "tiny": dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=1000),
}
PAD, BOS, EOS = 1, 0, 2
DECODER_START = EOS   # as NLLB: </s>, then the target language token
FIRST_WORD = 4        # ids below are special


@dataclasses.dataclass
class TranslateJob:
    model_dir: str
    document: List[int]         # the encoder tokens every request shares
    language_tokens: List[int]  # one request per target language
    new_tokens: int = 64
    threads: int = 2

    def decoder_prompts(self) -> List[List[int]]:
        return [[DECODER_START, token] for token in self.language_tokens]

    def warmup_document(self) -> List[int]:
        """Another document (the first 32 tokens reversed), so the warm-up caches nothing the timed run reads."""
        return list(reversed(self.document[:32]))


def save_model(shape: str, seed: int, model_dir: str) -> int:
    """A random M2M100 of `shape` saved with save_pretrained; returns its vocabulary size. The LM head is tied to the
    embeddings, as NLLB's; no forced BOS/EOS token, so the decoder prompt alone picks the language."""
    torch.manual_seed(seed)
    config = transformers.M2M100Config(max_position_embeddings=1024, pad_token_id=PAD, bos_token_id=BOS,
                                       eos_token_id=EOS, decoder_start_token_id=DECODER_START, scale_embedding=True,
                                       forced_bos_token_id=None, forced_eos_token_id=None, dropout=0.0,
                                       attention_dropout=0.0, activation_dropout=0.0, **SHAPES[shape])
    model = transformers.M2M100ForConditionalGeneration(config).eval()
    model.generation_config.update(forced_bos_token_id=None, forced_eos_token_id=None, num_beams=1,
                                   max_length=None)
    model.save_pretrained(model_dir)
    return config.vocab_size


def translate_job(model_dir: str, vocab_size: int, doc_tokens: int, languages: int, new_tokens: int, seed: int,
                  threads: int) -> TranslateJob:
    """A random document of `doc_tokens` word ids ending in </s>; the language tokens are the vocabulary's last ids
    (where NLLB keeps them)."""
    rng = random.Random(seed)
    document = [rng.randrange(FIRST_WORD, vocab_size - languages) for _ in range(doc_tokens - 1)] + [EOS]
    return TranslateJob(model_dir, document, list(range(vocab_size - languages, vocab_size)), new_tokens, threads)


def run_ours(job: TranslateJob, cache_on: bool) -> CacheRun:
    torch.set_num_threads(job.threads)
    llm = LLM(job.model_dir, skip_tokenizer_init=True, enable_encoder_cache=cache_on)
    params = SamplingParams(temperature=0.0, max_tokens=job.new_tokens, min_tokens=job.new_tokens)

    def translate(document: List[int], decoder_prompts: List[List[int]], sampling: SamplingParams):
        prompts = [ExplicitEncoderDecoderPrompt(encoder_prompt=TokensPrompt(prompt_token_ids=document),
                                                decoder_prompt=TokensPrompt(prompt_token_ids=decoder))
                   for decoder in decoder_prompts]
        return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, sampling, use_tqdm=False)]

    translate(job.warmup_document(), job.decoder_prompts()[:2], SamplingParams(temperature=0.0, max_tokens=2))
    runner = llm.llm_engine.model_runner
    encoder_runs = runner.num_encoder_runs
    run = measured("ours", cache_label(cache_on), lambda: translate(job.document, job.decoder_prompts(), params))
    run.stats["encoder_runs"] = runner.num_encoder_runs - encoder_runs
    return run


def run_hf(job: TranslateJob) -> CacheRun:
    """HF `generate` on all target languages as one batch: the document repeated per row, the decoder prompts
    given as decoder_input_ids, the same forced length."""
    torch.set_num_threads(job.threads)
    model = transformers.M2M100ForConditionalGeneration.from_pretrained(job.model_dir, dtype=torch.float32).eval()

    @torch.no_grad()
    def translate(document: List[int], decoder_prompts: List[List[int]], new_tokens: int) -> List[List[int]]:
        input_ids = torch.tensor([document] * len(decoder_prompts))
        decoder_input_ids = torch.tensor(decoder_prompts)
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                             decoder_input_ids=decoder_input_ids, do_sample=False, num_beams=1,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens)
        return [row[decoder_input_ids.shape[1]:] for row in out.tolist()]

    translate(job.warmup_document(), job.decoder_prompts()[:2], 2)
    run = measured("hf", "n/a", lambda: translate(job.document, job.decoder_prompts(), job.new_tokens))
    run.stats["encoder_runs"] = len(job.language_tokens)   # the batch's encoder call encodes every row
    return run
