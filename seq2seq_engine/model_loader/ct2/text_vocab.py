"""The vocabulary of a CTranslate2 text model (shared_vocabulary.json/.txt, or equal source/target vocabularies), its
special-token ids (from the CT2 config.json), and the tokenizer written into the converted HF directory.

The tokenizer is the original HF one when the CT2 directory carries its files (`ct2-transformers-converter
--copy_files ...`) and it agrees with the vocabulary; otherwise it is built from the vocabulary: one token per
whitespace-separated piece, exactly the token strings `ctranslate2.Translator.translate_batch` takes, decoded back
to text with SentencePiece (▁) or byte-level (Ġ) rules when the vocabulary uses them.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from typing import Dict, List, Optional

logger = logging.getLogger(__name__)

# files of an HF tokenizer that a CT2 directory may carry (copied from the original model)
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                      "vocab.json", "merges.txt", "source.spm", "target.spm", "spiece.model",
                      "sentencepiece.bpe.model")
MARIAN_PAD = "<pad>"


def _read_tokens(path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        if path.endswith(".json"):
            tokens = json.load(f)
        else:
            tokens = [line.rstrip("\r\n") for line in f]
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise ValueError(f"{path} is not a list of token strings")
    return tokens


def _find_vocabulary(ct2_dir: str, name: str) -> Optional[str]:
    for extension in (".json", ".txt"):
        path = os.path.join(ct2_dir, f"{name}_vocabulary{extension}")
        if os.path.isfile(path):
            return path
    return None


def read_text_vocabulary(ct2_dir: str) -> List[str]:
    """The model's tokens in id order: the shared vocabulary, or source and target vocabularies that are equal."""
    shared = _find_vocabulary(ct2_dir, "shared")
    if shared:
        return _read_tokens(shared)
    source, target = _find_vocabulary(ct2_dir, "source"), _find_vocabulary(ct2_dir, "target")
    if not (source and target):
        raise ValueError(f"{ct2_dir!r} has no shared_vocabulary.json/.txt nor source_ and target_vocabulary "
                         f"files: the token ids of a CTranslate2 text model cannot be known")
    source_tokens, target_tokens = _read_tokens(source), _read_tokens(target)
    if source_tokens != target_tokens:
        raise ValueError(f"{ct2_dir!r} has different source and target vocabularies ({len(source_tokens)} and "
                         f"{len(target_tokens)} tokens); only models with one shared vocabulary are supported")
    return source_tokens


def token_index(tokens: List[str]) -> Dict[str, int]:
    """token -> its first id."""
    index: Dict[str, int] = {}
    for position, token in enumerate(tokens):
        index.setdefault(token, position)
    return index


def special_token_ids(tokens: List[str], ct2_config: dict, family: str) -> Dict[str, int]:
    """HF config token ids (bos, eos, pad, decoder_start) from the CT2 config.json's token strings.

    `tokens` of a Marian model end with the "<pad>" the converter removed (put back by the caller).
    CTranslate2's `decoder_start_token` may be null (mBART-25 takes the language code as the prefix): HF's
    eos then starts the decoder, and the language code goes in the decoder prompt. CT2 keeps no pad token: "<pad>"
    where the vocabulary has one, else eos.
    """
    index = token_index(tokens)

    def token_id(key: str, default: Optional[str] = None, required: bool = True) -> Optional[int]:
        token = ct2_config.get(key, default)
        if token is None or (token not in index and not required):
            return None
        if token not in index:
            raise ValueError(f"the CT2 config.json's {key} {token!r} is not in the vocabulary")
        return index[token]

    eos = token_id("eos_token", "</s>")
    ids = {"eos_token_id": eos, "bos_token_id": token_id("bos_token", "<s>", required=False),
           "pad_token_id": index.get(MARIAN_PAD, eos), "unk_token_id": token_id("unk_token", "<unk>", required=False)}
    ids["decoder_start_token_id"] = token_id("decoder_start_token", None)
    if family == "marian":  # <pad> (put back by the caller) starts the decoder from its zero embedding row
        ids["pad_token_id"] = ids["decoder_start_token_id"] = index[MARIAN_PAD]
    elif ids["decoder_start_token_id"] is None:
        ids["decoder_start_token_id"] = eos
    return ids


def _decoder_for(tokens: List[str]):
    from tokenizers import decoders
    sample = tokens[: 5000]
    if sum(t.startswith("▁") for t in sample) * 10 >= len(sample):
        return decoders.Metaspace()
    if sum(t.startswith("Ġ") for t in sample) * 10 >= len(sample):
        return decoders.ByteLevel()
    return None


def write_vocabulary_tokenizer(tokens: List[str], ct2_config: dict, out_dir: str, model_max_length: int) -> None:
    """A word-level tokenizer over the CT2 vocabulary: a text prompt is its tokens separated by spaces."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    index = token_index(tokens)
    unk = ct2_config.get("unk_token") or "<unk>"
    backend = Tokenizer(models.WordLevel(index, unk_token=unk if unk in index else None))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    decoder = _decoder_for(tokens)
    if decoder is not None:
        backend.decoder = decoder
    special = {key: ct2_config.get(key) for key in ("bos_token", "eos_token", "unk_token")}
    special = {key: value for key, value in special.items() if value in index}
    if MARIAN_PAD in index:
        special["pad_token"] = MARIAN_PAD
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=model_max_length,
                                                     clean_up_tokenization_spaces=False, **special)
    tokenizer.save_pretrained(out_dir)


def copy_hf_tokenizer(ct2_dir: str, out_dir: str, tokens: List[str]) -> bool:
    """Copy the HF tokenizer files the CT2 directory carries into out_dir; True when they load and agree with the
    vocabulary (every CT2 token has the same id), else the copies are removed and False is returned."""
    present = [name for name in HF_TOKENIZER_FILES if os.path.isfile(os.path.join(ct2_dir, name))]
    if not present:
        return False
    for name in present:
        shutil.copyfile(os.path.join(ct2_dir, name), os.path.join(out_dir, name))
    try:
        import transformers
        tokenizer = transformers.AutoTokenizer.from_pretrained(out_dir, local_files_only=True)
        vocab = tokenizer.get_vocab()
        agrees = all(vocab.get(token) == position for token, position in token_index(tokens).items()
                     if token in vocab) and sum(token in vocab for token in tokens) >= 0.99 * len(tokens)
    except (OSError, ValueError, TypeError, KeyError) as error:
        logger.warning("%s: the HF tokenizer files %s do not load (%s); using the CT2 vocabulary instead",
                       ct2_dir, present, error)
        agrees = False
    if not agrees:
        logger.warning("%s: the HF tokenizer files %s do not match the CT2 vocabulary; using the vocabulary",
                       ct2_dir, present)
        for name in present:
            os.remove(os.path.join(out_dir, name))
    return agrees
