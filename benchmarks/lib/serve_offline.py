"""The offline side of the load benchmark: the same requests without a server, text prompts through
`LLM.generate` at once, then the transcriptions through `llm.transcribe` at once."""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

from seq2seq_engine import LLM


def offline_run(text_dir: str, audio_dir: Optional[str], requests: List[Dict[str, Any]], args) -> Dict[str, float]:
    """The same requests without the server: the text prompts through LLM.generate at once, then the
    transcriptions through llm.transcribe at once; output tokens, the wall time of each part, CPU seconds."""
    tokens, text_wall, text_cpu = offline_text(text_dir, requests, args)
    clips = [r["clip"] for r in requests if r["kind"] == "transcription"]
    audio_wall = audio_cpu = 0.0
    if audio_dir is not None and clips:
        llm = LLM(audio_dir, max_num_seqs=args.max_num_seqs, kv_cache_space_gb=args.kv_cache_space_gb)
        start, cpu_start = time.perf_counter(), time.process_time()
        llm.transcribe(clips, use_tqdm=False)
        audio_wall, audio_cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return {"tokens": tokens, "text_wall": text_wall, "audio_wall": audio_wall, "cpu": text_cpu + audio_cpu}


def offline_text(model_dir: str, requests: List[Dict[str, Any]], args) -> Tuple[int, float, float]:
    """The same text prompts (chat rendered with the tokenizer's template) through LLM.generate at once: output
    tokens, wall and CPU seconds."""
    llm = LLM(model_dir, max_num_seqs=args.max_num_seqs, kv_cache_space_gb=args.kv_cache_space_gb)
    tokenizer = llm.get_tokenizer()
    prompts = [{"prompt_token_ids": tokenizer.encode(tokenizer.apply_chat_template(
        r["messages"], tokenize=False, add_generation_prompt=True), add_special_tokens=False)}
        if r["kind"] == "chat" else r["prompt"] for r in requests if r["kind"] != "transcription"]
    start, cpu_start = time.perf_counter(), time.process_time()
    outputs = llm.generate(prompts, {"max_tokens": args.max_tokens, "temperature": 0.0}, use_tqdm=False)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return sum(len(o.outputs[0].token_ids) for o in outputs), wall, cpu
