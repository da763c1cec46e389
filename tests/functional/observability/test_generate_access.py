"""A generative request's end, as every request's (engine/observability/request_life.py): its access line,
with its queue time (arrival until the hand-off to the engine) and compute time (the whole generation)
filled in, and its spans, for an OpenAI chat completion and completion (plain and streamed) and Triton's
generate and generate_stream, against a real server on the tiny_decoder example (also with
HUBSERVE_TEST_WORKERS=2: the engine process writes the lines) with a tiny OTLP collector."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.http as httpclient

from conftest import EXAMPLES, RunningServer, openai_client, start_server, wait_until
from hubserve_models import examples
from test_observability import Collector, access_lines

MODEL = "tiny_decoder"
GREEDY = {"temperature": 0, "max_tokens": 6, "ignore_eos": True}


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.close()


@pytest.fixture(scope="module")
def access_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gen_logs") / "hubserve.log"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, collector: Collector, access_log: Path
           ) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("gen_access") / "repo"
    (root / MODEL).mkdir(parents=True)
    shutil.copy(EXAMPLES / MODEL / "config.pbtxt", root / MODEL / "config.pbtxt")
    examples.build_repository(root, [MODEL])
    running = start_server(root, tmp_path_factory.mktemp("gen_access_log") / "server.log",
                           "--log-verbose", "1", "--log-format", "json", "--log-file", str(access_log),
                           "--trace-config", f"opentelemetry,url=127.0.0.1:{collector.port}",
                           "--trace-config", "opentelemetry,bsp_schedule_delay=50")
    yield running
    running.stop()


def line_for(path: Path, request_id: str) -> dict[str, Any]:
    return wait_until(lambda: next((d for d in access_lines(path) if d["request_id"] == request_id), None),
                      f"the access line of {request_id}")


def assert_generated(line: dict[str, Any], status: str = "OK") -> None:
    """A generation that reached the engine: its own model, its status, batch size 1, a real compute time
    (the whole generation) and a queue time, both inside its total."""
    assert line["model"] == MODEL and line["version"] == "1" and line["status"] == status, line
    assert line["batch_size"] == 1, line
    assert line["compute_us"] > 0 and line["queue_us"] >= 0, line
    assert line["queue_us"] + line["compute_us"] <= line["total_us"], line


def post(server: RunningServer, path: str, doc: dict[str, Any]) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://{server.http_url}{path}", data=json.dumps(doc).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_a_chat_completion_writes_its_access_line(server: RunningServer, access_log: Path) -> None:
    client = openai_client(server)
    reply = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=6, temperature=0,
        extra_headers={"X-Request-ID": "chat-line-1"})
    assert reply.headers["x-request-id"] == "chat-line-1"
    assert_generated(line_for(access_log, "chat-line-1"))


def test_a_completion_plain_and_streamed_writes_its_access_line(server: RunningServer, access_log: Path
                                                                ) -> None:
    client = openai_client(server)
    client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0,
                              extra_headers={"X-Request-ID": "cmpl-line-1"})
    chunks = list(client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6,
                                            temperature=0, stream=True,
                                            extra_headers={"X-Request-ID": "cmpl-line-2"}))
    assert chunks
    assert_generated(line_for(access_log, "cmpl-line-1"))
    assert_generated(line_for(access_log, "cmpl-line-2"))


def test_triton_generate_and_generate_stream_write_their_access_lines(server: RunningServer,
                                                                      access_log: Path) -> None:
    status, body = post(server, f"/v2/models/{MODEL}/generate",
                        {"id": "gen-line-1", "text_input": "Hello", "parameters": GREEDY})
    assert status == 200, body
    status, body = post(server, f"/v2/models/{MODEL}/generate_stream",
                        {"id": "gen-line-2", "text_input": "Hello", "stream": True, "parameters": GREEDY})
    assert status == 200 and body.count(b"data: ") > 1, body
    assert_generated(line_for(access_log, "gen-line-1"))
    assert_generated(line_for(access_log, "gen-line-2"))


def test_a_generation_refused_by_its_prompt_check_has_its_status(server: RunningServer, access_log: Path
                                                                 ) -> None:
    """Refused once the engine was reached (the prompt is past the context): INVALID_ARG, no compute."""
    status, body = post(server, f"/v2/models/{MODEL}/generate",
                        {"id": "gen-line-3", "text_input": "Hello " * 1000, "parameters": GREEDY})
    assert status == 400 and b"context of" in body, body
    line = line_for(access_log, "gen-line-3")
    assert line["model"] == MODEL and line["status"] == "INVALID_ARG" and line["compute_us"] == 0, line


def test_generative_requests_export_their_spans(server: RunningServer, collector: Collector) -> None:
    with httpclient.InferenceServerClient(server.http_url) as c:
        c.update_trace_settings(MODEL, {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "2"})
        try:
            openai_client(server).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                extra_headers={"X-Request-ID": "chat-traced"})
            status, body = post(server, f"/v2/models/{MODEL}/generate",
                                {"id": "gen-traced", "text_input": "Hi", "parameters": GREEDY})
            assert status == 200, body
        finally:
            c.update_trace_settings(MODEL, {"trace_level": None, "trace_rate": None, "trace_count": None})

    def traced() -> dict[str, dict[str, Any]] | None:
        by_id: dict[str, dict[str, Any]] = {}
        for span in collector.spans():
            attrs = {a["key"]: a["value"]["stringValue"] for a in span["attributes"]}
            if attrs["request_id"] in ("chat-traced", "gen-traced"):
                by_id.setdefault(attrs["request_id"], {})[span["name"]] = span
        return by_id if sum(map(len, by_id.values())) >= 6 else None

    by_id = wait_until(traced, "three spans of each generative request at the collector")
    for named in by_id.values():
        assert sorted(named) == ["compute", "frontend", "queue"]
        root = named["frontend"]
        assert int(root["startTimeUnixNano"]) <= int(named["queue"]["startTimeUnixNano"]) \
            <= int(named["compute"]["startTimeUnixNano"]) < int(named["compute"]["endTimeUnixNano"]) \
            <= int(root["endTimeUnixNano"])
