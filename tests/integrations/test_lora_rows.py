"""LoRA adapters of the Ray integration without a cluster (the batch classes are plain callables): prompt rows run
with the adapter their `lora` column names (a name, a directory, none: the replica's default), each row's own adapter
in one batch, a bad one failing its rows only; the rank a --lora adapter needs; AdapterEngine's adapter choice."""
import json

import pytest
from hf_reference import build_tiny_model
from lora.lora_reference import save_random_adapter

from seq2seq_engine import LLM, LoRARequest
from seq2seq_engine.integrations.adapters import AdaptedPrompt, AdapterEngine, adapter_rank, lora_engine_kwargs
from seq2seq_engine.integrations.ray_data import GenerateBatch, ReplicaConfig

ENGINE = {"skip_tokenizer_init": True, "kv_cache_space_gb": 0.05, "max_loras": 2}
SAMPLING = {"max_tokens": 6, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_rows")
    model_dir, hf_model = build_tiny_model("llama", root)
    adapters = [save_random_adapter(hf_model, root / name, 8, ["q_proj", "v_proj", "down_proj"], seed=50 + i,
                                    b_scale=4.0)[0] for i, name in enumerate("ab")]
    return model_dir, adapters


def _expected(model_dir, prompts, adapters):
    llm = LLM(model_dir, enable_lora=True, **ENGINE)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], SAMPLING, use_tqdm=False, lora_request=[
        LoRARequest("x", 1 + [a for a in adapters if a].index(a), a) if a else None for a in adapters])
    return [output.outputs[0].token_ids for output in outputs]


def test_prompt_rows_run_with_the_adapters_they_name(llama, tmp_path):
    model_dir, (path_a, path_b) = llama
    prompts = [[5, 6, 7, 8], [9, 10, 11], [5, 6, 7, 8], [12, 13], [14]]
    batch = {"prompt_token_ids": prompts, "lora": [None, "a", path_b, "a", str(tmp_path / "nothing")]}
    config = ReplicaConfig(model_dir, ENGINE, sampling=SAMPLING, lora_modules={"a": path_a})
    out = GenerateBatch(config)(batch)
    expected = _expected(model_dir, prompts[:4], [None, path_a, path_b, path_a])
    assert out["token_ids"][:4] == expected and expected[0] != expected[2]
    assert out["error"][:4] == [None] * 4 and "no such directory" in out["error"][4]
    assert out["lora"] == batch["lora"]  # the column passes through


def test_the_replicas_adapter_is_the_default_and_a_bad_one_fails_the_replica(llama, tmp_path):
    model_dir, (path_a, path_b) = llama
    out = GenerateBatch(ReplicaConfig(model_dir, ENGINE, sampling=SAMPLING, lora=path_b))(
        {"prompt_token_ids": [[5, 6, 7, 8]], "lora": [None]})
    assert out["token_ids"] == _expected(model_dir, [[5, 6, 7, 8]], [path_b])
    with pytest.raises(ValueError, match="no such directory"):
        GenerateBatch(ReplicaConfig(model_dir, ENGINE, lora=str(tmp_path / "nothing")))


def test_the_rank_an_adapter_needs(tmp_path):
    def adapter(name, **config):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text(json.dumps(config))
        return str(tmp_path / name)

    assert adapter_rank(adapter("r8", r=8)) == 8
    assert adapter_rank(adapter("r12", r=12)) == 16
    assert adapter_rank(adapter("pattern", r=8, rank_pattern={"q_proj": 40})) == 64
    assert adapter_rank(adapter("huge", r=512)) == 16 and adapter_rank(str(tmp_path / "nothing")) == 16
    assert lora_engine_kwargs([str(tmp_path / "r12")], {}) == {"enable_lora": True, "max_lora_rank": 16}
    assert lora_engine_kwargs([str(tmp_path / "r12")], {"max_lora_rank": 64})["max_lora_rank"] == 64
    assert lora_engine_kwargs([], {"dtype": "float32"}) == {"dtype": "float32"}


def test_adapter_engine_runs_each_request_with_its_adapter():
    calls = []

    class Engine:
        def add_request(self, request_id, prompt, params=None, arrival_time=None, priority=0, **kwargs):
            calls.append((prompt, kwargs.get("lora_request")))

        def step(self):
            return "stepped"

    default, other = LoRARequest("d", 1, "/d"), LoRARequest("o", 2, "/o")
    engine = AdapterEngine(Engine(), default)
    engine.add_request("1", "p1")
    engine.add_request("2", "p2", lora_request=other)
    engine.add_request("3", AdaptedPrompt("p3", None))
    engine.add_request("4", AdaptedPrompt("p4", other))
    assert calls == [("p1", default), ("p2", other), ("p3", None), ("p4", other)]
    assert engine.step() == "stepped"
