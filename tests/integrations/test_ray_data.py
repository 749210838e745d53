"""Ray Data integration (seq2seq_engine/integrations/) on a real multi-node Ray cluster on this machine: audio rows
and prompt rows give what the single-machine engine gives (rows naming LoRA adapters too), rows that fail carry their
own errors, the `--ray` command lines write the same files as the single-machine commands, `--ray` without ray
installed says how to install it, and a job whose worker node is killed mid-job still returns every input once, with
the same results."""
import dataclasses
import glob
import json
import os
import subprocess
import sys
import threading

import pytest
import ray
import transformers
from conftest import require_model, require_speech_clips
from hf_reference import build_tiny_model
from lora.lora_reference import save_random_adapter
from ray_cluster_utils import (MarkedTranscribeBatch, node_of_first_mark, same_but_float_rounding, start_cluster,
                               stop_cluster)

from seq2seq_engine import LoRARequest
from seq2seq_engine.entrypoints.cli import main
from seq2seq_engine.entrypoints.llm import LLM
from seq2seq_engine.integrations.ray_data import GenerateBatch, ReplicaConfig, TranscribeBatch
from seq2seq_engine.integrations.rows import row_to_result
from seq2seq_engine.transcription.options import TranscriptionOptions

pytestmark = pytest.mark.usefixtures("one_thread")  # replicas reserve one CPU each: one torch thread, as here

ENGINE = {"kv_cache_space_gb": 0.3, "swap_space_gb": 0.01}
ENGINE_FLAGS = ["--kv-cache-space-gb", "0.3", "--quiet"]
OPTIONS = TranscriptionOptions(max_new_tokens=48, use_tqdm=False)
SAMPLING = {"temperature": 0.0, "max_tokens": 8}


@pytest.fixture(scope="module")
def cluster():
    cluster, address = start_cluster()
    yield cluster, address
    stop_cluster(cluster)


@pytest.fixture(scope="module")
def whisper():
    return require_model("whisper-tiny.en")


@pytest.fixture(scope="module")
def clips():
    return sorted(glob.glob(os.path.join(require_speech_clips(), "en", "*.wav")))


@pytest.fixture(scope="module")
def whisper_llm(whisper):
    return LLM(whisper, **ENGINE)


def _map(rows, batch_class, batch_size, num_replicas=2, **constructor_kwargs):
    dataset = ray.data.from_items(rows, override_num_blocks=len(rows))
    # a batch waits for a free replica
    replicas = ray.data.ActorPoolStrategy(size=num_replicas, max_tasks_in_flight_per_actor=1)
    dataset = dataset.map_batches(batch_class, fn_constructor_kwargs=constructor_kwargs, num_cpus=1,
                                  compute=replicas, batch_size=batch_size)
    return sorted(dataset.take_all(), key=lambda row: row["id"])


def _audio_row(row_id, path=None, content=None, options=None, task=None):
    return {"id": row_id, "path": path, "bytes": content, "options": options, "task": task}


def test_audio_rows_give_the_single_machine_results_and_errors(cluster, whisper, whisper_llm, clips, tmp_path):
    notes = tmp_path / "notes.wav"
    notes.write_text("not audio\n" * 50)
    hello = next(clip for clip in clips if clip.endswith("hello_world.wav"))
    content = open(hello, "rb").read()
    sources = clips + [str(tmp_path / "missing.wav"), str(notes)]
    rows = [_audio_row(i, path=source) for i, source in enumerate(sources)]
    rows += [_audio_row(5, path="hello.wav", content=content), _audio_row(6, path=hello, task="dance"),
             _audio_row(7, path=hello, options={"word_timestamps": True})]
    marks = tmp_path / "marks"
    marks.mkdir()
    config = ReplicaConfig(whisper, ENGINE, transcription=OPTIONS)
    out = _map(rows, MarkedTranscribeBatch, 2, config=config, marks=str(marks), pause_s=0.0)

    expected = whisper_llm.transcribe(sources + [content], OPTIONS)
    expected[-1] = dataclasses.replace(expected[-1], source="hello.wav")  # bytes named by the row's path
    assert [row["id"] for row in out] == list(range(len(rows)))
    for row, result in zip(out, expected):
        got = row_to_result(row)
        assert (got.text, got.segments, got.error) == (result.text, result.segments, result.error), row["id"]
        assert same_but_float_rounding(got.to_dict(), result.to_dict()), row["id"]
    assert out[0]["text"] and out[0]["error"] is None and out[0]["segments"]
    assert "missing.wav" in out[3]["error"] and "notes.wav" in out[4]["error"]  # the others went on
    with pytest.raises(ValueError) as bad_task:
        TranscriptionOptions(task="dance")
    assert out[6]["error"] == str(bad_task.value) and out[6]["text"] == ""
    words = whisper_llm.transcribe([hello], OPTIONS, word_timestamps=True)[0]
    assert same_but_float_rounding(row_to_result(out[7]).to_dict(), words.to_dict())
    assert [(w["word"], w["start"], w["segment"]) for w in out[7]["words"]] == [
        (w.word, w.start, 0) for w in words.segments[0].words] and words.segments[0].words
    assert len({name.rsplit("-", 1)[0] for name in os.listdir(marks)}) == 2  # both replicas took batches


def test_prompt_rows_give_the_single_machine_generations_and_their_own_errors(cluster):
    smollm = require_model("smollm2-135m")
    prompts = ["The capital of France is", "1, 2, 3, 4,", "Once upon a time"]
    rows = [{"id": i, "prompt": p, "prompt_token_ids": None, "encoder_prompt": None, "max_tokens": None}
            for i, p in enumerate(prompts)]
    rows[2]["max_tokens"] = 3  # a row's own sampling field
    rows += [{"id": 3, "prompt": None, "prompt_token_ids": [1, 2, 10 ** 7], "encoder_prompt": None, "max_tokens": None},
             {"id": 4, "prompt": None, "prompt_token_ids": None, "encoder_prompt": "x", "max_tokens": None},
             {"id": 5, "prompt": None, "prompt_token_ids": None, "encoder_prompt": None, "max_tokens": None}]
    out = _map(rows, GenerateBatch, 3, config=ReplicaConfig(smollm, ENGINE, sampling=SAMPLING))

    llm = LLM(smollm, **ENGINE)
    expected = llm.generate(prompts, [SAMPLING, SAMPLING, dict(SAMPLING, max_tokens=3)], use_tqdm=False)
    for row, output in zip(out, expected):
        best = output.outputs[0]
        assert (row["text"], list(row["token_ids"]), row["finish_reason"], row["error"]) == (
            best.text, best.token_ids, best.finish_reason, None)
        assert row["prompt_text"] == output.prompt
        assert row["cumulative_logprob"] == pytest.approx(best.cumulative_logprob, rel=1e-5)
    assert len(out[2]["token_ids"]) == 3 and len(out[0]["token_ids"]) == 8
    for row, bad_prompt in zip(out[3:5], [{"prompt_token_ids": [1, 2, 10 ** 7]},
                                          {"encoder_prompt": "x", "decoder_prompt": None}]):
        with pytest.raises((ValueError, TypeError)) as refused:
            llm.generate(bad_prompt, SAMPLING, use_tqdm=False)
        assert row["error"] == str(refused.value) and row["text"] is None
    assert "needs a 'prompt'" in out[5]["error"]


def test_rows_run_with_the_lora_adapters_they_name(cluster, whisper, clips, tmp_path):
    """One batch of rows naming an adapter by name, by directory, none, and one that cannot be served: each row gets
    the single-machine result of its adapter (the adapted ones run together with the base model's)."""
    hf_model = transformers.WhisperForConditionalGeneration.from_pretrained(whisper).eval()
    path, _ = save_random_adapter(hf_model, tmp_path / "w", 8, ["q_proj", "v_proj", "fc1"], seed=31, b_scale=0.3)
    fox = next(clip for clip in clips if clip.endswith("quick_brown_fox.wav"))
    adapters = ["w", None, path, str(tmp_path / "nothing")]
    rows = [{"id": i, "path": fox, "lora": adapter} for i, adapter in enumerate(adapters)]
    config = ReplicaConfig(whisper, ENGINE, transcription=OPTIONS, lora_modules={"w": path})
    out = _map(rows, TranscribeBatch, len(rows), num_replicas=1, config=config)
    llm = LLM(whisper, enable_lora=True, max_lora_rank=8, **ENGINE)
    adapted, base = (llm.transcribe([fox], OPTIONS, lora_request=lora)[0].text
                     for lora in (LoRARequest("w", 1, path), None))
    assert [row["text"] for row in out[:3]] == [adapted, base, adapted] and adapted != base
    assert "no such directory" in out[3]["error"] and not out[3]["text"]


def test_generate_ray_with_lora_writes_the_single_machine_file(cluster, tmp_path):
    _, address = cluster
    model_dir, hf_model = build_tiny_model("llama", tmp_path)
    path, _ = save_random_adapter(hf_model, tmp_path / "a", 8, ["q_proj", "v_proj"], seed=3, b_scale=4.0)
    lines = [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [8, 9]}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    flags = ["--model", model_dir, "--input", str(tmp_path / "in.jsonl"), "--skip-tokenizer-init", "--lora", path,
             "--temperature", "0", "--max-tokens", "6", *ENGINE_FLAGS]
    assert main(["generate", *flags, "--output", str(tmp_path / "here.jsonl")]) == 0
    assert main(["generate", *flags, "--output", str(tmp_path / "ray.jsonl"), "--ray", address]) == 0
    here = [json.loads(line) for line in (tmp_path / "here.jsonl").read_text().splitlines()]
    assert same_but_float_rounding([json.loads(line) for line in (tmp_path / "ray.jsonl").read_text().splitlines()],
                                   here) and len(here) == 2


def _command(*args):
    command = [os.path.join(os.path.dirname(sys.executable), "seq2seq-engine"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=dict(os.environ))


def _tree(folder):
    return {os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), encoding="utf-8").read()
            for d, _, files in os.walk(folder) for f in files}


def test_transcribe_ray_writes_the_single_machine_outputs(cluster, clips, tmp_path, capsys):
    """One replica given the whole folder as one batch decodes exactly what the single-machine run decodes (json
    files equal byte for byte); two replicas given one file a batch print the same transcripts, in input order."""
    _, address = cluster
    folder = tmp_path / "in"
    folder.mkdir()
    for clip in clips:
        (folder / os.path.basename(clip)).write_bytes(open(clip, "rb").read())
    (folder / "broken.mp3").write_text("this is not an mp3\n" * 20)
    flags = [str(folder), "--max-new-tokens", "48", "--swap-space-gb", "0.01", *ENGINE_FLAGS]
    assert main(["transcribe", *flags, "--output-format", "json", "--output-dir", str(tmp_path / "here")]) == 1
    assert main(["transcribe", *flags, "--output-format", "txt"]) == 1
    expected = capsys.readouterr()
    whole = _command("transcribe", *flags, "--output-format", "json", "--output-dir", str(tmp_path / "ray"),
                     "--ray", address, "--num-replicas", "1", "--ray-batch-size", "64")
    spread = _command("transcribe", *flags, "--output-format", "txt", "--ray", address, "--num-replicas", "2",
                      "--ray-batch-size", "1")
    assert whole.returncode == 1 and spread.returncode == 1, whole.stderr + spread.stderr
    assert _tree(tmp_path / "ray") == _tree(tmp_path / "here") and len(_tree(tmp_path / "here")) == 4
    assert spread.stdout == expected.out and len(expected.out.splitlines()) == 4 and "lazy dog" in expected.out
    failure = next(line for line in expected.err.splitlines() if "broken.mp3: cannot decode" in line)
    assert failure in whole.stderr and failure in spread.stderr and "1 of 4 input(s) failed" in whole.stderr


def test_generate_ray_writes_the_single_machine_file(cluster, tmp_path):
    """One replica with every prompt in one batch: the same file byte for byte; two replicas with two prompts a
    batch: the same texts and tokens, in input order."""
    _, address = cluster
    smollm = require_model("smollm2-135m")
    lines = ["The capital of France is", {"prompt": "1, 2, 3, 4,"}, {"prompt_token_ids": [1, 10 ** 7]},
             {"prompt_token_ids": [504, 3458, 282]}, "Once upon a time"]
    (tmp_path / "in.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    flags = ["--model", smollm, "--input", str(tmp_path / "in.jsonl"), "--temperature", "0", "--max-tokens", "8",
             *ENGINE_FLAGS]
    assert main(["generate", *flags, "--output", str(tmp_path / "here.jsonl")]) == 1
    whole = _command("generate", *flags, "--output", str(tmp_path / "whole.jsonl"), "--ray", address)
    spread = _command("generate", *flags, "--output", str(tmp_path / "spread.jsonl"), "--ray", address,
                      "--num-replicas", "2", "--ray-batch-size", "2")
    assert whole.returncode == 1 and spread.returncode == 1, whole.stderr + spread.stderr
    expected = (tmp_path / "here.jsonl").read_text(encoding="utf-8")
    assert (tmp_path / "whole.jsonl").read_text(encoding="utf-8") == expected
    records = [json.loads(line) for line in expected.splitlines()]
    spread_records = [json.loads(line) for line in (tmp_path / "spread.jsonl").read_text().splitlines()]
    assert same_but_float_rounding(spread_records, records)
    assert [r["index"] for r in records] == list(range(5)) and "error" in records[2] and records[4]["text"]


def test_ray_flag_without_ray_installed_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    (tmp_path / "in.txt").write_text("hello\n", encoding="utf-8")
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    assert main(["generate", "--model", str(tmp_path), "--input", str(tmp_path / "in.txt"), "--ray"]) == 2
    assert "pip install seq2seq-engine[ray]" in capsys.readouterr().err
    assert main(["transcribe", str(tmp_path / "a.wav"), "--ray", "auto", "--quiet"]) == 2
    assert "pip install seq2seq-engine[ray]" in capsys.readouterr().err
    assert main(["transcribe", str(tmp_path / "a.wav"), "--num-replicas", "2"]) == 2
    assert "--num-replicas needs --ray" in capsys.readouterr().err


def test_a_replica_that_cannot_start_fails_the_job_with_its_error(cluster, tmp_path, capsys):
    _, address = cluster
    (tmp_path / "in.txt").write_text("hello\n", encoding="utf-8")
    code = main(["generate", "--model", str(tmp_path / "nomodel"), "--input", str(tmp_path / "in.txt"), "--ray",
                 address, "--quiet", "--output", str(tmp_path / "out.jsonl")])
    assert code == 2
    assert "seq2seq-engine: error: the Ray job failed: ValueError: cannot resolve model" in capsys.readouterr().err


def test_a_killed_worker_node_loses_no_input_and_changes_no_result(cluster, whisper, whisper_llm, clips, tmp_path):
    """Runs last: the cluster loses a node. Every batch pauses 3 s after marking its start; the first marked node
    is killed then, with its batch running. Ray Data restarts that replica on the spare CPU and retries its batch."""
    cluster_handle, _ = cluster
    marks = tmp_path / "marks"
    marks.mkdir()
    sources = clips * 2
    rows = [_audio_row(i, path=source) for i, source in enumerate(sources)]
    killed = {}

    def kill_first_marked_node():
        node_id = node_of_first_mark(str(marks), timeout_s=300)
        node = next(node for node in cluster_handle.worker_nodes if node.node_id == node_id)
        cluster_handle.remove_node(node, allow_graceful=False)
        killed["node"] = node_id

    killer = threading.Thread(target=kill_first_marked_node, daemon=True)
    killer.start()
    config = ReplicaConfig(whisper, ENGINE, transcription=OPTIONS)
    out = _map(rows, MarkedTranscribeBatch, 1, config=config, marks=str(marks), pause_s=3.0)
    killer.join(timeout=60)

    assert killed and killed["node"] not in {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    assert len(os.listdir(marks)) > len(rows)  # the killed node's batch started again elsewhere
    assert [row["id"] for row in out] == list(range(len(rows)))  # every input exactly once
    expected = whisper_llm.transcribe(sources, OPTIONS)
    assert [row_to_result(row).text for row in out] == [result.text for result in expected]
    assert same_but_float_rounding([row_to_result(row).to_dict() for row in out], [r.to_dict() for r in expected])
