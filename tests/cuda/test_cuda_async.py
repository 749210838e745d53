"""Asynchronous scheduling on CUDA: the same float32 greedy tokens and log-probs as without it, for BART, T5, Whisper
and Llama, eager and with CUDA graphs (the fed tokens are written into the graphs' static inputs), with steps
really launched ahead of the previous step's outputs."""
import pytest
import torch
from cuda_models import build_case, run_engine, strict_float32

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _results(outputs):
    return [(list(o.outputs[0].token_ids), o.outputs[0].cumulative_logprob) for o in outputs]


@pytest.mark.parametrize("enforce_eager", [True, False], ids=["eager", "graphs"])
@pytest.mark.parametrize("arch", ["bart", "t5", "whisper", "llama"])
def test_async_scheduling_changes_no_output(arch, enforce_eager, tmp_path):
    case = build_case(arch, tmp_path)
    with strict_float32():
        plain = run_engine(case.model_dir, case.prompts, "float32", enforce_eager)
        ahead = run_engine(case.model_dir, case.prompts, "float32", enforce_eager, async_scheduling=True)
    assert run_engine.steps_ahead > 0
    assert _results(ahead) == _results(plain)
