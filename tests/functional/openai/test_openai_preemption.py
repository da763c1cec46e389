"""Through the OpenAI API, a KV cache too small for the streams running together: the engine preempts
(recomputes) some of them, and every stream still gets exactly the text it gets alone, greedy, token for
token (engine/generate/core/scheduler.py preemption; engine/generate/serving/driver.py hands out text only
once)."""

from __future__ import annotations

import concurrent.futures

import pytest

from conftest import EXAMPLES, RunningServer, openai_client, start_server
from hubserve_models import examples
from test_openai_api import MODEL, _metric


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("openai_preemption")
    folder = root / "repo" / MODEL
    folder.mkdir(parents=True)
    config = (EXAMPLES / MODEL / "config.pbtxt").read_text()
    small = config.replace('key: "kv_num_blocks" value { string_value: "1024" }',
                           'key: "kv_num_blocks" value { string_value: "40" }')
    assert small != config
    (folder / "config.pbtxt").write_text(small)
    examples.build_repository(root / "repo", [MODEL])
    running = start_server(root / "repo", root / "server.log")
    yield running
    running.stop()


def test_streams_preempted_for_blocks_lose_nothing(server: RunningServer):
    client = openai_client(server, timeout_s=120.0)
    ask = {"model": MODEL, "max_tokens": 150, "temperature": 0, "extra_body": {"ignore_eos": True}}
    prompts = [f"prompt number {i} " * 3 for i in range(8)]  # 8 x ~200 tokens: far over 40 blocks of 16
    alone = [client.completions.create(prompt=p, **ask).choices[0].text for p in prompts]
    assert _metric(server, "hubserve_generation_preemptions_total") == 0

    def streamed(prompt: str) -> str:
        chunks = client.completions.create(prompt=prompt, stream=True, **ask)
        return "".join(c.choices[0].text for c in chunks)

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(streamed, prompts))
    assert _metric(server, "hubserve_generation_preemptions_total") > 0
    assert together == alone
    assert _metric(server, "hubserve_generation_kv_blocks_free") == 40
