"""CTranslate2 text models (TransformerSpec) → HF directories (seq2seq_engine.model_loader.ct2.text).

Random HF models of each family are converted by CTranslate2's own converter; the directory we convert back must
generate, in HF transformers and in this engine, the same greedy tokens as `ctranslate2.Translator` on the CT2
files and as HF on the original model."""
import json
import os
import random
import shutil

import pytest
import torch
import transformers
from ct2_text_utils import FAMILIES, VOCAB, convert_with_ctranslate2, tiny_hf_dir, tokens_of, write_tokenizer
from ct2_whisper_utils import write_model_bin
from safetensors.torch import load_file

from seq2seq_engine.model_loader.ct2.model_bin import read_ct2_model
from seq2seq_engine.model_loader.ct2.text import ct2_text_to_hf, main
from seq2seq_engine.model_loader.resolver import resolve_model_path
from seq2seq_engine.models.registry import MODEL_REGISTRY

ctranslate2 = pytest.importorskip("ctranslate2")

NEW_TOKENS = 8
# Marian as trained (tied); BART and T5 untied, as the benchmarks' random models and Flan-T5/mT5 are
TIED = {"marian": True, "bart": False, "t5": False}
ARCHITECTURES = {"bart": "BartForConditionalGeneration", "mbart": "MBartForConditionalGeneration",
                 "marian": "MarianMTModel", "m2m100": "M2M100ForConditionalGeneration",
                 "pegasus": "PegasusForConditionalGeneration", "t5": "T5ForConditionalGeneration",
                 "umt5": "UMT5ForConditionalGeneration"}


def build(family, root):
    """(family, HF dir, CT2 dir made by CTranslate2's converter, our conversion of it)."""
    hf_dir = tiny_hf_dir(family, root / "hf", tie=TIED.get(family, True))
    ct2_dir = convert_with_ctranslate2(family, hf_dir, root / "ct2")
    return family, hf_dir, ct2_dir, ct2_text_to_hf(ct2_dir, str(root / "converted"))


@pytest.fixture(scope="module", params=FAMILIES)
def dirs(request, tmp_path_factory):
    return build(request.param, tmp_path_factory.mktemp(request.param))


def sources(family):
    eos = tokens_of(family).index("</s>")
    rng = random.Random(1)
    return [[rng.randrange(4, VOCAB - 2) for _ in range(rng.randint(2, 14))] + [eos] for _ in range(4)]


def ctranslate2_tokens(family, ct2_dir, start):
    tokens = tokens_of(family)
    translator = ctranslate2.Translator(ct2_dir)
    prefix = [[tokens[start]]] * 4 if family == "mbart" else None  # its decoder start is a prompt, as for mBART-25
    skip = 1 if prefix else 0  # the prefix counts in CTranslate2's lengths
    results = translator.translate_batch([[tokens[i] for i in s] for s in sources(family)], beam_size=1,
                                         min_decoding_length=NEW_TOKENS + skip,
                                         max_decoding_length=NEW_TOKENS + skip, target_prefix=prefix)
    return [[tokens.index(t) for t in r.hypotheses[0][skip:]] for r in results]


def hf_tokens(family, model_dir):
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    outputs = []
    for source in sources(family):
        generated = model.generate(torch.tensor([source]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                   do_sample=False, num_beams=1, forced_eos_token_id=None, forced_bos_token_id=None)
        outputs.append(generated[0, 1:].tolist())
    return outputs


def test_converted_directory_generates_the_tokens_of_ctranslate2_and_of_the_original(dirs):
    family, hf_dir, ct2_dir, converted = dirs
    with open(os.path.join(converted, "config.json")) as f:
        config = json.load(f)
    assert config["architectures"] == [ARCHITECTURES[family]]
    start = config["decoder_start_token_id"]
    expected = ctranslate2_tokens(family, ct2_dir, start)
    assert len({tuple(e) for e in expected}) > 1 or family in ("marian", "pegasus")  # inputs matter (mostly)
    assert hf_tokens(family, converted) == expected
    assert hf_tokens(family, hf_dir) == expected


def test_engine_loads_the_ct2_directory_and_generates_ctranslate2s_tokens(dirs, tmp_path, monkeypatch):
    from seq2seq_engine import LLM, SamplingParams
    from seq2seq_engine.inputs.data import ExplicitEncoderDecoderPrompt, TokensPrompt

    family, _, ct2_dir, _ = dirs
    assert ARCHITECTURES[family] in MODEL_REGISTRY
    monkeypatch.setenv("SEQ2SEQ_ENGINE_CACHE", str(tmp_path / "cache"))
    llm = LLM(ct2_dir, dtype="float32", num_gpu_blocks_override=64, swap_space_gb=0.01)
    start = transformers.AutoConfig.from_pretrained(resolve_model_path(ct2_dir)).decoder_start_token_id
    prompts = [ExplicitEncoderDecoderPrompt(encoder_prompt=TokensPrompt(prompt_token_ids=s),
                                            decoder_prompt=TokensPrompt(prompt_token_ids=[start]))
               for s in sources(family)]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    expected = ctranslate2_tokens(family, ct2_dir, start)
    assert [list(o.outputs[0].token_ids) for o in outputs] == expected
    # a text prompt is the pieces CTranslate2 takes, separated by spaces; the output is decoded from the pieces
    tokens = tokens_of(family)
    text = ExplicitEncoderDecoderPrompt(encoder_prompt=" ".join(tokens[i] for i in sources(family)[0]),
                                        decoder_prompt=TokensPrompt(prompt_token_ids=[start]))
    (output,) = llm.generate([text], params, use_tqdm=False)
    assert output.encoder_prompt_token_ids == sources(family)[0] and list(output.outputs[0].token_ids) == expected[0]
    pieces = [tokens[i] for i in expected[0] if tokens[i] not in ("<s>", "</s>", "<pad>", "<unk>")]
    assert output.outputs[0].text.split() == [piece.lstrip("▁") for piece in pieces]


def test_vocabulary_tokenizer_takes_the_pieces_ctranslate2_takes(dirs):
    family, _, _, converted = dirs
    with open(os.path.join(converted, "ct2_source.json")) as f:
        assert json.load(f)["tokenizer"] == "vocabulary"
    tokenizer = transformers.AutoTokenizer.from_pretrained(converted)
    tokens = tokens_of(family)
    ids = tokenizer("▁w5 ▁w17 </s>")["input_ids"]
    assert ids == [5, 17, tokens.index("</s>")]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "w5 w17"
    assert tokenizer.eos_token == "</s>" and tokenizer.pad_token == "<pad>"


def test_resolver_converts_a_ct2_text_directory_once(dirs, tmp_path):
    family, _, ct2_dir, _ = dirs
    resolved = resolve_model_path(ct2_dir, cache_dir=str(tmp_path))
    assert resolved.startswith(str(tmp_path))
    assert resolve_model_path(ct2_dir, cache_dir=str(tmp_path)) == resolved
    with open(os.path.join(resolved, "ct2_source.json")) as f:
        assert json.load(f)["family"] == family


def test_int8_directory_is_dequantized(tmp_path):
    hf_dir = tiny_hf_dir("bart", tmp_path / "hf", tie=False)
    float_dir = ct2_text_to_hf(convert_with_ctranslate2("bart", hf_dir, tmp_path / "f32"), str(tmp_path / "a"))
    int8_ct2 = convert_with_ctranslate2("bart", hf_dir, tmp_path / "i8", quantization="int8")
    assert read_ct2_model(int8_ct2)[2]["encoder/layer_0/ffn/linear_0/weight"].dtype == torch.int8
    exact, dequantized = (load_file(os.path.join(d, "model.safetensors"))
                          for d in (float_dir, ct2_text_to_hf(int8_ct2, str(tmp_path / "b"))))
    assert set(exact) == set(dequantized)
    weight = "model.encoder.layers.0.fc1.weight"
    step = exact[weight].abs().amax(dim=1, keepdim=True) / 127
    error = (exact[weight] - dequantized[weight]).abs()
    assert bool((error <= step / 2 + 1e-6).all()) and bool((error > 0).any())


def test_unsupported_specs_and_features_are_named(tmp_path):
    _, _, ct2_dir, _ = build("bart", tmp_path / "bart")
    _, _, variables, aliases = read_ct2_model(ct2_dir)
    for name in ("config.json", "shared_vocabulary.json"):
        with open(os.path.join(ct2_dir, name)) as src, open(tmp_path / name, "w") as dst:
            dst.write(src.read())
    write_model_bin(tmp_path / "model.bin", variables, aliases, spec="TransformerDecoderSpec", revision=8)
    with pytest.raises(ValueError, match=r"'TransformerDecoderSpec'.*TransformerSpec, WhisperSpec"):
        resolve_model_path(str(tmp_path), cache_dir=str(tmp_path / "cache"))
    variables["encoder/pre_norm"] = torch.tensor(1, dtype=torch.int8)
    write_model_bin(tmp_path / "model.bin", variables, aliases, spec="TransformerSpec", revision=7)
    with pytest.raises(ValueError, match="pre_norm=True.*matches no supported family"):
        ct2_text_to_hf(str(tmp_path), str(tmp_path / "out"))
    os.remove(tmp_path / "shared_vocabulary.json")
    variables["encoder/pre_norm"] = torch.tensor(0, dtype=torch.int8)
    write_model_bin(tmp_path / "model.bin", variables, aliases, spec="TransformerSpec", revision=7)
    with pytest.raises(ValueError, match="shared_vocabulary"):
        ct2_text_to_hf(str(tmp_path), str(tmp_path / "out"))


def test_cli_writes_the_requested_dtype(tmp_path, capsys):
    _, _, ct2_dir, _ = build("t5", tmp_path / "t5")
    capsys.readouterr()
    assert main([ct2_dir, str(tmp_path / "out"), "--dtype", "bfloat16"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "out")
    assert load_file(str(tmp_path / "out" / "model.safetensors"))["shared.weight"].dtype == torch.bfloat16
    assert main([str(tmp_path / "nowhere"), str(tmp_path / "out2")]) == 1


def test_hf_tokenizer_files_in_the_ct2_directory_are_used_when_they_agree(tmp_path):
    _, hf_dir, ct2_dir, _ = build("m2m100", tmp_path / "m2m100")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(hf_dir, name), os.path.join(ct2_dir, name))
    converted = ct2_text_to_hf(ct2_dir, str(tmp_path / "copied"))
    with open(os.path.join(converted, "ct2_source.json")) as f:
        assert json.load(f)["tokenizer"] == "copied"
    with open(os.path.join(converted, "tokenizer.json")) as f, open(os.path.join(hf_dir, "tokenizer.json")) as g:
        assert json.load(f) == json.load(g)
    # a tokenizer whose ids disagree with the vocabulary is replaced by the vocabulary's
    write_tokenizer("bart", ct2_dir)  # <s> <pad> </s> <unk> at 0-3, as m2m100's, but pieces renamed below
    with open(os.path.join(ct2_dir, "tokenizer.json")) as f:
        data = json.load(f)
    data["model"]["vocab"] = {("▁x" + token if i >= 4 else token): i for token, i in data["model"]["vocab"].items()}
    with open(os.path.join(ct2_dir, "tokenizer.json"), "w") as f:
        json.dump(data, f)
    converted = ct2_text_to_hf(ct2_dir, str(tmp_path / "mismatch"))
    with open(os.path.join(converted, "ct2_source.json")) as f:
        assert json.load(f)["tokenizer"] == "vocabulary"
    assert transformers.AutoTokenizer.from_pretrained(converted)("▁w5")["input_ids"] == [5]


def test_converted_directory_scores_tokens_as_ctranslate2_does(dirs):
    """Token log-probabilities of a forced target, HF on our conversion vs `Translator.score_batch`: catches what
    greedy tokens cannot (output scales, logit biases). mBART's CTranslate2 decoder start is null: the start token
    leads its target (the decoder input, not a scored token)."""
    family, _, ct2_dir, converted = dirs
    tokens = tokens_of(family)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(converted).eval()
    start, eos = model.config.decoder_start_token_id, model.config.eos_token_id
    translator = ctranslate2.Translator(ct2_dir)
    rng = random.Random(2)
    for source in sources(family):
        target = [rng.randrange(4, VOCAB - 2) for _ in range(5)]
        lead = [start] if family == "mbart" else []
        (result,) = translator.score_batch([[tokens[i] for i in source]], [[tokens[i] for i in lead + target]])
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([[start] + target])).logits
        expected = torch.log_softmax(logits[0].float(), dim=-1)[torch.arange(len(target) + 1), target + [eos]]
        assert torch.allclose(torch.tensor(result.log_probs), expected, atol=2e-4), (family, result.log_probs)
