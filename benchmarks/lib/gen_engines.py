"""Text generation runners for throughput.py, each run in its own child process: this engine, HF generate, CT2.

Every request i generates exactly `lengths[i]` new tokens in every engine (EOS is masked until then, and the
request ends there, as if the model had emitted EOS at that length):
  * ours: SamplingParams / BeamSearchParams with min_tokens = max_tokens = lengths[i];
  * HF: a per-row logits processor masking EOS below the row's length and a per-row stopping criterion at it
    (a stopped row idles in the batch, as a row that emitted EOS does in HF);
  * CT2 greedy: min length = the longest target, a callback stopping each row at its own length; CT2 beam search
    (no callback there): one call per distinct target length with min = max = that length.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Dict, List, Optional

import seq2seq_engine  # noqa: F401,I001 - first: its OpenMP defaults must precede torch, for every engine run here

# isort: split
import torch
import transformers

from benchmarks.lib.common import EngineRun, timed_run
from seq2seq_engine import LLM, BeamSearchParams, SamplingParams
from seq2seq_engine.inputs.data import ExplicitEncoderDecoderPrompt, TokensPrompt


@dataclasses.dataclass
class GenJob:
    model_dir: str
    enc_dec: bool
    prompts: List[List[int]]     # encoder inputs (encoder/decoder) or decoder prompts (decoder-only)
    lengths: List[int]           # forced new tokens per request
    beam: int = 1
    threads: int = 2
    repeat: int = 1
    warmup: bool = True
    hf_batch_size: int = 0       # documents per HF generate() call; 0: all
    ct2_dir: Optional[str] = None
    decoder_start: Optional[int] = None
    eos: int = 2
    pad: int = 1


def _warmup_job(job: GenJob) -> GenJob:
    return dataclasses.replace(job, prompts=job.prompts[:2], lengths=[2, 2], repeat=1)


def _timed(job: GenJob, engine: str, dtype: str, run_once) -> EngineRun:
    if job.warmup:
        run_once(_warmup_job(job))
    return timed_run(engine, dtype, job.repeat, lambda: run_once(job))


# ---------------------------------------------------------------------------------------------- ours
def kv_blocks_needed(job: GenJob, block_size: int = 16) -> int:
    """KV blocks that hold every request at full length at once (+10%): no preemption, no idle preallocation."""
    per_request = [(math.ceil(len(p) / block_size) if job.enc_dec else 0)
                   + job.beam * math.ceil(((1 if job.enc_dec else len(p)) + n + 1) / block_size)
                   for p, n in zip(job.prompts, job.lengths)]
    return int(sum(per_request) * 1.1) + 16


def run_ours(job: GenJob, dtype: str) -> EngineRun:
    """`dtype` "int8" runs float32 with quantization="int8" (its KV cache in bfloat16, the engine's default)."""
    torch.set_num_threads(job.threads)
    precision = dict(dtype="float32", quantization="int8") if dtype == "int8" else dict(dtype=dtype)
    llm = LLM(job.model_dir, skip_tokenizer_init=True, max_num_seqs=256,
              num_gpu_blocks_override=kv_blocks_needed(job), swap_space_gb=0.01,
              max_beam_width=max(job.beam, 1), **precision)

    def run_once(j: GenJob) -> List[List[int]]:
        llm.reset_prefix_cache()  # no run reuses the prefixes or encoder outputs of the warm-up or an earlier repeat
        if j.enc_dec:
            inputs = [ExplicitEncoderDecoderPrompt(encoder_prompt=TokensPrompt(prompt_token_ids=p),
                                                   decoder_prompt=TokensPrompt(prompt_token_ids=[j.decoder_start]))
                      for p in j.prompts]
        else:
            inputs = [TokensPrompt(prompt_token_ids=p) for p in j.prompts]
        if j.beam > 1:
            params = [BeamSearchParams(beam_width=j.beam, max_tokens=n, min_tokens=n) for n in j.lengths]
            outputs = llm.beam_search(inputs, params, use_tqdm=False)
        else:
            params = [SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n) for n in j.lengths]
            outputs = llm.generate(inputs, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]

    return _timed(job, "ours", dtype, run_once)


# ---------------------------------------------------------------------------------------------- HF
def _row_lengths(lengths: torch.Tensor, rows: int) -> torch.Tensor:
    """Per-row targets: beam search hands processors batch*num_beams rows and stopping criteria batch*2*num_beams."""
    return lengths.repeat_interleave(rows // lengths.shape[0])


class MaskEosBelowLength(transformers.LogitsProcessor):
    """EOS gets -inf while a row has generated fewer than its target tokens (HF min_new_tokens, per row)."""

    def __init__(self, lengths: torch.Tensor, prompt_width: int, eos: int) -> None:
        self.lengths, self.prompt_width, self.eos = lengths, prompt_width, eos

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        generated = input_ids.shape[1] - self.prompt_width
        below = _row_lengths(self.lengths, input_ids.shape[0]) > generated
        scores[below, self.eos] = float("-inf")
        return scores


class StopAtLength(transformers.StoppingCriteria):
    """A row is done once it has its target number of new tokens (HF max_new_tokens, per row)."""

    def __init__(self, lengths: torch.Tensor, prompt_width: int) -> None:
        self.lengths, self.prompt_width = lengths, prompt_width

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        generated = input_ids.shape[1] - self.prompt_width
        return _row_lengths(self.lengths, input_ids.shape[0]) <= generated


def _pad(prompts: List[List[int]], pad_id: int, left: bool):
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        cols = slice(width - len(p), width) if left else slice(0, len(p))
        ids[row, cols] = torch.tensor(p)
        mask[row, cols] = 1
    return ids, mask


def _hf_chunk(model, job: GenJob, prompts: List[List[int]], lengths: List[int]) -> List[List[int]]:
    ids, mask = _pad(prompts, job.pad, left=not job.enc_dec)
    width = 1 if job.enc_dec else ids.shape[1]  # the decoder prompt: [decoder_start] or the padded prompt
    targets = torch.tensor(lengths)
    beam_kwargs = dict(num_beams=job.beam, length_penalty=1.0, early_stopping=False) if job.beam > 1 else {}
    sequences = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=max(lengths), do_sample=False, **beam_kwargs,
        logits_processor=transformers.LogitsProcessorList([MaskEosBelowLength(targets, width, job.eos)]),
        stopping_criteria=transformers.StoppingCriteriaList([StopAtLength(targets, width)]))
    # A row stopped before the longest one is padded after its target length: cut there.
    return [row[width:width + n].tolist() for row, n in zip(sequences, lengths)]


def run_hf(job: GenJob) -> EngineRun:
    torch.set_num_threads(job.threads)
    model = transformers.AutoModelForSeq2SeqLM if job.enc_dec else transformers.AutoModelForCausalLM
    model = model.from_pretrained(job.model_dir, dtype=torch.float32).eval()
    # A fresh generation config: no no_repeat_ngram_size, forced bos/eos, min/max length from the model's defaults.
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=getattr(model.config, "bos_token_id", None), eos_token_id=job.eos, pad_token_id=job.pad,
        decoder_start_token_id=job.decoder_start)

    def run_once(j: GenJob) -> List[List[int]]:
        size = j.hf_batch_size or len(j.prompts)
        with torch.inference_mode():
            return [row for first in range(0, len(j.prompts), size)
                    for row in _hf_chunk(model, j, j.prompts[first:first + size], j.lengths[first:first + size])]

    return _timed(job, "hf", "float32", run_once)


# ---------------------------------------------------------------------------------------------- CTranslate2
def _ct2_vocabulary(ct2_dir: str) -> List[str]:
    for name in ("shared_vocabulary.json", "vocabulary.json", "target_vocabulary.json"):
        try:
            with open(f"{ct2_dir}/{name}", encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            continue
    raise FileNotFoundError(f"no vocabulary file in {ct2_dir}")


def _ct2_call(model, job: GenJob, tokens: List[List[str]], lengths: List[int]) -> List[List[str]]:
    """One batch: greedy stops each row by callback; beam search needs one shared length (callers group)."""
    longest = max(lengths)
    callback = None
    if job.beam == 1 and len(set(lengths)) > 1:
        callback = lambda step: step.step + 1 >= lengths[step.batch_id]  # noqa: E731 - the stop test per row
    if job.enc_dec:
        results = model.translate_batch(tokens, beam_size=job.beam, max_decoding_length=longest,
                                        min_decoding_length=longest, max_input_length=0, callback=callback)
        return [r.hypotheses[0] for r in results]
    results = model.generate_batch(tokens, beam_size=job.beam, max_length=longest, min_length=longest,
                                   include_prompt_in_result=False, callback=callback)
    return [r.sequences[0] for r in results]


def run_ct2(job: GenJob, compute_type: str) -> EngineRun:
    import ctranslate2
    kind = ctranslate2.Translator if job.enc_dec else ctranslate2.Generator
    model = kind(job.ct2_dir, device="cpu", compute_type=compute_type, intra_threads=job.threads)
    vocab = _ct2_vocabulary(job.ct2_dir)
    ids = {token: i for i, token in enumerate(vocab)}

    def run_once(j: GenJob) -> List[List[int]]:
        tokens = [[vocab[t] for t in p] for p in j.prompts]
        groups: Dict[int, List[int]] = {}
        for i, n in enumerate(j.lengths):
            groups.setdefault(n if j.beam > 1 else 0, []).append(i)
        outputs: List[List[int]] = [[] for _ in j.prompts]
        for members in groups.values():
            hypotheses = _ct2_call(model, j, [tokens[i] for i in members], [j.lengths[i] for i in members])
            for i, hypothesis in zip(members, hypotheses):
                outputs[i] = [ids[t] for t in hypothesis]
        return outputs

    return _timed(job, "ct2", compute_type, run_once)
