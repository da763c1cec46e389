"""The OpenAI-compatible API with `--workers 2`: the generation engine lives in the engine process (one KV
cache), the frontends forward /v1 requests there as whole requests. Answers that do not stream work as in
one process; `stream: true` is refused with 501 and says why, for now (engine/frontend/openai_routes.py)."""

from __future__ import annotations

import openai
import pytest

from conftest import RunningServer, start_server
from test_openai_api import MODEL, build_repository


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("openai_workers")
    running = start_server(build_repository(root / "repo"), root / "server.log", "--workers", "2")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0,
                         timeout=60.0)


def test_whole_answers_work_through_a_frontend(client: openai.OpenAI, server: RunningServer):
    assert [m.id for m in client.models.list().data] == [MODEL]
    answers = set()
    for _ in range(4):  # connections are spread over both frontends; the answer is the engine's each time
        out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=8, temperature=0)
        assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 8
        answers.add(out.choices[0].message.content)
    assert len(answers) == 1
    raw = client.completions.with_raw_response.create(model=MODEL, prompt="x", max_tokens=2,
                                                      extra_headers={"X-Request-ID": "through-frontend"})
    assert raw.headers["x-request-id"] == "through-frontend" == raw.parse().id
    assert server.metric("hubserve_generation_tokens_total", MODEL) >= 34  # the engine process counts


def test_streaming_is_refused_clearly_for_now(client: openai.OpenAI):
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=4, stream=True)
    assert refused.value.status_code == 501
    assert refused.value.code == "unsupported_parameter" and refused.value.param == "stream"
    assert "--workers 1" in refused.value.message


def test_errors_cross_unchanged(client: openai.OpenAI):
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as empty:
        client.chat.completions.create(model=MODEL, messages=[])
    assert empty.value.param == "messages"
