"""The examples: transcribe.py (README's main job, real Whisper base); summarize.py, translate.py (tiny BART vs HF)."""
import importlib.util
import os
import subprocess
import sys

from hf_reference import build_tiny_bart_with_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _clip(name):
    spec = importlib.util.find_spec("pytest_audioeval")
    assert spec is not None, "pytest-audioeval is installed by scripts/setup_env.sh"
    return os.path.join(list(spec.submodule_search_locations)[0], "samples", "audio", "en", f"{name}.wav")


def test_transcribe_example_prints_the_spoken_words():
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "transcribe.py"), _clip("hello_world"),
                             _clip("quick_brown_fox")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ours:      Hello world." in result.stdout
    assert "ours:      The quick brown fox jumps over the lazy dog." in result.stdout


def _run_example(name, *args):
    result = subprocess.run([sys.executable, os.path.join(ROOT, "examples", name), *args], capture_output=True,
                            text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def _hf_texts(hf_model, model_dir, lines, **generate_kwargs):
    import torch
    import transformers
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    texts = []
    for line in lines:
        with torch.no_grad():
            sequences = hf_model.generate(torch.tensor([tokenizer(line).input_ids]), **generate_kwargs)
        texts.append(tokenizer.decode(sequences[0], skip_special_tokens=True).strip())
    return texts


def test_summarize_example_follows_the_generation_config_like_hf(tmp_path, spm_bart_tokenizer):
    model_dir, hf_model = build_tiny_bart_with_tokenizer(tmp_path, spm_bart_tokenizer, num_beams=2, max_length=12,
                                                         length_penalty=2.0, no_repeat_ngram_size=3,
                                                         early_stopping=True)
    documents = ["the quick brown fox jumps over the lazy dog", "hello world speech audio encoder"]
    (tmp_path / "docs.txt").write_text("\n".join(documents) + "\n", encoding="utf-8")
    stdout = _run_example("summarize.py", "--model", model_dir, str(tmp_path / "docs.txt"))
    summaries = [line[len("summary:"):].strip() for line in stdout.splitlines() if line.startswith("summary:")]
    assert summaries == _hf_texts(hf_model, model_dir, documents)


def test_translate_example_runs_beam_search_like_hf(tmp_path, spm_bart_tokenizer):
    model_dir, hf_model = build_tiny_bart_with_tokenizer(tmp_path, spm_bart_tokenizer)
    lines = ["hello world", "the lazy dog jumps"]
    (tmp_path / "lines.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    stdout = _run_example("translate.py", "--model", model_dir, "--beam-width", "3", "--max-tokens", "6",
                          str(tmp_path / "lines.txt"))
    translations = [line.strip()[len("-> "):].strip() for line in stdout.splitlines() if line.strip().startswith("->")]
    # The example's BeamSearchParams are explicit: HF gets the same (its forced BOS is our default decoder prompt).
    assert translations == _hf_texts(hf_model, model_dir, lines, num_beams=3, max_new_tokens=7,
                                     forced_eos_token_id=None, no_repeat_ngram_size=0)


def test_readme_python_api_example_runs(tmp_path):
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as handle:
        readme = handle.read()
    code = readme.split("## Python API", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    code = code.replace("/tmp/tiny-bart", str(tmp_path / "tiny-bart"))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "[2, 0] [0, 31, 41, 23, 2]" in result.stdout and "length" in result.stdout
