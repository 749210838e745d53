"""The EnginePort: LLMEngine has all of it, no `engine: Any` is left, features read only the engine's port names."""
import ast
import inspect
import pathlib

import pytest
from hf_reference import build_tiny_model

from seq2seq_engine.engine.llm_engine import LLMEngine
from seq2seq_engine.engine_port import EnginePort, EngineStats

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "seq2seq_engine"
# The modules that hold an engine they were handed (serve_cli builds its engines; its `engine` is an argument group).
FEATURE_FILES = sorted({*(PACKAGE / "transcription").rglob("*.py"), *(PACKAGE / "integrations").rglob("*.py"),
                        *(PACKAGE / "entrypoints" / "openai").rglob("*.py"), PACKAGE / "entrypoints" / "live_cli.py",
                        PACKAGE / "entrypoints" / "llm.py", PACKAGE / "engine" / "streaming.py"}
                       - {PACKAGE / "entrypoints" / "openai" / "serve_cli.py"})
ENGINE_HOLDERS = {"engine", "llm_engine"}  # `engine.x`, `self.engine.x`, `state.engine.x`, `llm.llm_engine.x`


def _port_methods():
    return {name: member for name, member in vars(EnginePort).items()
            if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))}


def _port_members():
    return set(_port_methods()) | set(EnginePort.__annotations__)


def _parsed(path):
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def test_no_engine_is_annotated_any():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(_parsed(path)):
            if isinstance(node, ast.arg):
                name, annotation = node.arg, node.annotation
            elif isinstance(node, ast.AnnAssign):
                name, annotation = ast.unparse(node.target), node.annotation
            else:
                continue
            if "engine" in name.lower() and annotation is not None and ast.unparse(annotation) == "Any":
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {name}")
    assert not found, f"annotate the engine as EnginePort: {found}"


def test_features_read_only_what_the_port_names():
    members, reached = _port_members(), []
    for path in FEATURE_FILES:
        for node in ast.walk(_parsed(path)):
            if not isinstance(node, ast.Attribute):
                continue
            holder = node.value
            held = (isinstance(holder, ast.Name) and holder.id in ENGINE_HOLDERS) or \
                (isinstance(holder, ast.Attribute) and holder.attr in ENGINE_HOLDERS)
            if held and node.attr not in members:
                reached.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {ast.unparse(node)}")
    assert FEATURE_FILES and not reached, f"not on the EnginePort: {reached}"


def test_llm_engine_has_every_member_of_the_port():
    for name, member in _port_methods().items():
        implemented = inspect.getattr_static(LLMEngine, name, None)
        assert implemented is not None, f"LLMEngine has no {name}"
        if isinstance(member, property):
            assert isinstance(implemented, property), f"LLMEngine.{name} is not a property"
            continue
        wanted = list(inspect.signature(member).parameters)
        given = list(inspect.signature(implemented).parameters)
        assert given[:len(wanted)] == wanted, f"LLMEngine.{name}{given} does not take {wanted}"
    init = inspect.getsource(LLMEngine.__init__)
    for name in EnginePort.__annotations__:
        assert f"self.{name} = " in init, f"LLMEngine.__init__ does not set {name}"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from seq2seq_engine import LLM
    model_dir, _ = build_tiny_model("bart", tmp_path_factory.mktemp("port_bart"))
    return LLM(model_dir, skip_tokenizer_init=True, kv_cache_space_gb=0.05, block_size=8, max_num_seqs=8).llm_engine


def test_a_built_engine_is_an_engine_port_with_its_facts_and_state(engine):
    assert isinstance(engine, EnginePort)
    assert (engine.max_num_seqs, engine.max_beam_width, engine.block_size) == (8, 8, 8)
    assert engine.num_mel_bins is None and engine.hf_config.model_type == "bart"
    assert engine.max_encoder_len == engine.model_config.max_source_positions
    assert engine.weight_bytes() > 0
    assert engine.request_kv_bytes(16, 2) < engine.request_kv_bytes(16, 3)
    idle = engine.stats()
    assert isinstance(idle, EngineStats) and (idle.running, idle.waiting, idle.swapped) == (0, 0, 0)
    assert idle.free_gpu_blocks == idle.total_gpu_blocks > 0
    engine.add_request("port-a", {"prompt_token_ids": [5, 6, 7]}, {"max_tokens": 4})
    engine.add_request("port-b", {"prompt_token_ids": [8, 9]}, {"max_tokens": 4})
    assert engine.unfinished_request_ids() == ["port-a", "port-b"] and engine.stats().waiting == 2
    engine.step()
    assert engine.stats().free_gpu_blocks < idle.free_gpu_blocks
    engine.abort_request(engine.unfinished_request_ids())
    assert not engine.has_unfinished_requests() and engine.stats().free_gpu_blocks == idle.free_gpu_blocks
