"""The Whisper tokenizer bundled with a CTranslate2 model, fixed to decode like the HF hub processor.

Two fixes: (1) the added tokens (<|endoftext|> … <|notimestamps|>) are registered as special tokens
in tokenizer_config.json — transformers' Whisper tokenizer takes `all_special_ids[-1] + 1` as the first timestamp
id, so without this timestamps come out shifted; (2) the 1,501 timestamp tokens <|0.00|> … <|30.00|> are added
(not special) with the ids right after <|notimestamps|>.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Dict, List, Optional

logger = logging.getLogger(__name__)

NUM_TIMESTAMPS = 1501
TIME_PRECISION = 0.02
TOKENIZER_JSON = "tokenizer.json"
EOT, SOT, NO_TIMESTAMPS = "<|endoftext|>", "<|startoftranscript|>", "<|notimestamps|>"


def timestamp_token(index: int) -> str:
    return "<|%.2f|>" % (index * TIME_PRECISION)


def read_vocab(ct2_dir: str) -> Dict[str, int]:
    """Token → id for the special tokens (tokenizer.json's added tokens), else the whole vocabulary.txt/.json."""
    path = os.path.join(ct2_dir, TOKENIZER_JSON)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        vocab = {token: index for token, index in data.get("model", {}).get("vocab", {}).items()
                 if token.startswith("<|")}
        vocab.update({entry["content"]: entry["id"] for entry in data.get("added_tokens", [])})
        return vocab
    if os.path.isfile(os.path.join(ct2_dir, "vocabulary.json")):
        with open(os.path.join(ct2_dir, "vocabulary.json"), encoding="utf-8") as f:
            return {token: index for index, token in enumerate(json.load(f))}
    if os.path.isfile(os.path.join(ct2_dir, "vocabulary.txt")):
        with open(os.path.join(ct2_dir, "vocabulary.txt"), encoding="utf-8") as f:
            return {line.rstrip("\n"): index for index, line in enumerate(f)}
    raise ValueError(f"{ct2_dir!r} has no {TOKENIZER_JSON}, vocabulary.json or vocabulary.txt to read token ids from")


def special_ids(vocab: Dict[str, int]) -> Dict[str, int]:
    """eot / sot / notimestamps ids (required) and the optional task, prompt and language token ids."""
    missing = [t for t in (EOT, SOT, NO_TIMESTAMPS) if t not in vocab]
    if missing:
        raise ValueError(f"the Whisper vocabulary lacks {missing}")
    ids = {"eot": vocab[EOT], "sot": vocab[SOT], "notimestamps": vocab[NO_TIMESTAMPS]}
    for key, token in (("transcribe", "<|transcribe|>"), ("translate", "<|translate|>"),
                       ("startofprev", "<|startofprev|>"), ("startoflm", "<|startoflm|>")):
        if token in vocab:
            ids[key] = vocab[token]
    return ids


def language_tokens(vocab: Dict[str, int]) -> Dict[str, int]:
    """The <|xx|> language tokens: those between <|startoftranscript|> and the first task token."""
    sot = vocab[SOT]
    end = min([vocab[t] for t in ("<|translate|>", "<|transcribe|>") if t in vocab], default=sot + 1)
    return {token: index for token, index in vocab.items() if sot < index < end}


def write_fixed_tokenizer(ct2_dir: str, out_dir: str, vocab_size: int, model_max_length: int = 448) -> bool:
    """Write the fixed tokenizer.json + tokenizer_config.json into out_dir; False (and a warning) if the CT2
    directory has no tokenizer.json. Checks the result (check_fixed_tokenizer)."""
    path = os.path.join(ct2_dir, TOKENIZER_JSON)
    if not os.path.isfile(path):
        logger.warning("%s has no %s: the converted model has no tokenizer (use skip_tokenizer_init=True)",
                       ct2_dir, TOKENIZER_JSON)
        return False
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    added: List[dict] = data.setdefault("added_tokens", [])
    vocab = read_vocab(ct2_dir)
    notimestamps = special_ids(vocab)["notimestamps"]
    special = [entry["content"] for entry in sorted(added, key=lambda e: e["id"]) if entry["id"] <= notimestamps]
    for entry in added:
        if entry["content"] in special:
            entry["special"] = True
    present = {entry["content"] for entry in added} | set(data.get("model", {}).get("vocab", {}))
    for index in range(NUM_TIMESTAMPS):
        token, token_id = timestamp_token(index), notimestamps + 1 + index
        if token in present:
            continue
        added.append({"id": token_id, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": False})
    added.sort(key=lambda e: e["id"])
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, TOKENIZER_JSON), "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)
    config = {"tokenizer_class": "WhisperTokenizer", "bos_token": EOT, "eos_token": EOT, "unk_token": EOT,
              "pad_token": EOT, "additional_special_tokens": special, "model_max_length": model_max_length,
              "add_prefix_space": False, "errors": "replace", "clean_up_tokenization_spaces": False}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
    check_fixed_tokenizer(out_dir, notimestamps, vocab_size)
    return True


def check_fixed_tokenizer(hf_dir: str, notimestamps: int, vocab_size: Optional[int] = None) -> None:
    """Check the fixes took in hf_dir's tokenizer.json (read by `tokenizers`); ValueError naming what did not."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(os.path.join(hf_dir, TOKENIZER_JSON))
    first, last = (tokenizer.token_to_id(timestamp_token(index)) for index in (0, NUM_TIMESTAMPS - 1))
    problems = []
    if (first, last) != (notimestamps + 1, notimestamps + NUM_TIMESTAMPS):
        problems.append(f"timestamp ids {first}..{last}, expected {notimestamps + 1}..{notimestamps + NUM_TIMESTAMPS}")
    special = [index for index, token in tokenizer.get_added_tokens_decoder().items() if token.special]
    if max(special, default=None) != notimestamps:
        problems.append(f"the last special id is {max(special, default=None)}, not <|notimestamps|> {notimestamps}")
    if tokenizer.id_to_token(notimestamps + 1) != timestamp_token(0):
        problems.append(f"id {notimestamps + 1} is {tokenizer.id_to_token(notimestamps + 1)!r}")
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if vocab_size is not None and size > vocab_size:
        problems.append(f"the tokenizer has {size} tokens, the model's vocabulary only {vocab_size}")
    if problems:
        raise ValueError(f"the fixed Whisper tokenizer in {hf_dir} is wrong: " + "; ".join(problems))
