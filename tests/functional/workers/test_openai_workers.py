"""The OpenAI-compatible API with `--workers 2`: the generation engine lives in the engine process (one KV
cache), the frontends forward /v1 requests there, and a stream comes back to the frontend in pieces
(engine/workers/streams.py). test_openai_api.py and test_openai_errors.py also run whole under
HUBSERVE_TEST_WORKERS=2; this file checks what only the split adds: answers from either frontend are the
engine's, a stream crosses intact, and a client leaving a stream at a frontend frees the engine's blocks."""

from __future__ import annotations

import openai
import pytest

from conftest import RunningServer, openai_client, start_server, wait_until
from test_openai_api import MODEL, _metric, build_repository, leave_while_running


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("openai_workers")
    running = start_server(build_repository(root / "repo"), root / "server.log", "--workers", "2")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai_client(server)


def test_answers_and_streams_through_either_frontend(client: openai.OpenAI, server: RunningServer):
    assert [m.id for m in client.models.list().data] == [MODEL]
    messages = [{"role": "user", "content": "hi"}]
    whole, streamed = set(), set()
    for _ in range(3):  # new connections each time: spread over both frontends
        with openai_client(server) as fresh:
            out = fresh.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
            assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 16
            whole.add(out.choices[0].message.content)
            chunks = list(fresh.chat.completions.create(model=MODEL, messages=messages, max_tokens=16,
                                                        temperature=0, stream=True,
                                                        stream_options={"include_usage": True}))
            streamed.add("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
            assert chunks[-1].usage.completion_tokens == 16
    assert len(whole) == 1 and whole == streamed
    raw = client.completions.with_raw_response.create(model=MODEL, prompt="x", max_tokens=2,
                                                      extra_headers={"X-Request-ID": "through-frontend"})
    assert raw.headers["x-request-id"] == "through-frontend" == raw.parse().id
    assert _metric(server, "hubserve_generation_tokens_total") >= 98  # the engine process counts them


def test_a_client_leaving_a_stream_at_a_frontend_frees_the_engines_blocks(server: RunningServer):
    leave_while_running(server, 450)
    wait_until(lambda: _metric(server, "hubserve_generation_kv_blocks_used") == 0, "blocks not freed")
    assert _metric(server, "hubserve_generation_running_sequences") == 0


def test_errors_cross_unchanged(client: openai.OpenAI):
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as empty:
        client.chat.completions.create(model=MODEL, messages=[], stream=True)
    assert empty.value.param == "messages"
