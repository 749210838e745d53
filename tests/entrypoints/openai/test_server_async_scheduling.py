"""`serve --async-scheduling` on a real uvicorn server, driven by the official `openai` client: concurrent streamed
chat completions and completions give the tokens and text of the synchronous engine on the same prompts and seeds,
a stream the client drops mid-way is aborted, and the pool returns to idle with every block free."""
import concurrent.futures

import pytest
from server_utils import SMALL_POOLS, build_engine, running_server, tiny_chat_llama, wait_until_idle

from seq2seq_engine import LLM, SamplingParams

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = "tiny-llama"
PROMPTS = ["the quick brown fox", "hello world", "one two three four", "a b c"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, spm_tokenizer):
    return tiny_chat_llama(tmp_path_factory.mktemp("async_llama"), spm_tokenizer)[0]


@pytest.fixture(scope="module")
def server(model_dir, one_thread):
    engine = build_engine(model_dir, max_num_seqs=8, async_scheduling=True)
    with running_server(engine, MODEL) as running:
        yield running, engine


def _expected(model_dir, params):
    llm = LLM(model_dir, max_num_seqs=8, **SMALL_POOLS)
    return [o.outputs[0] for o in llm.generate(PROMPTS, params, use_tqdm=False)]


def test_concurrent_streams_equal_the_synchronous_engine(server, model_dir):
    running, engine = server
    client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0, timeout=120)
    params = [SamplingParams(temperature=0.8, seed=i, max_tokens=6 + 3 * i) for i in range(len(PROMPTS))]
    expected = _expected(model_dir, params)

    def streamed(i):
        stream = client.completions.create(model=MODEL, prompt=PROMPTS[i], max_tokens=6 + 3 * i, temperature=0.8,
                                           seed=i, stream=True)
        return "".join(chunk.choices[0].text for chunk in stream if chunk.choices)

    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        texts = list(pool.map(streamed, range(len(PROMPTS))))
    assert texts == [completion.text for completion in expected]
    state = wait_until_idle(running, MODEL)
    assert state["unfinished"] == 0 and state["free"] == state["total"] and state["self_tables"] == 0
    assert engine.async_scheduler.steps_ahead > 0


def test_a_dropped_stream_is_aborted_and_frees_its_blocks(server):
    running, _ = server
    client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0, timeout=120)
    stream = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=100, temperature=0.0,
                                       stream=True, extra_body={"ignore_eos": True})
    for index, _ in enumerate(stream):
        if index == 3:
            break
    stream.close()
    state = wait_until_idle(running, MODEL)
    assert state["unfinished"] == 0 and state["free"] == state["total"] and state["self_tables"] == 0
