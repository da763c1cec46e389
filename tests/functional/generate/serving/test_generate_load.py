"""A generative version is built and tested while it loads (engine/generate/serving/registry.py `load`): its
engine is made and one short greedy generation runs before it is READY, so a folder that cannot generate is
UNAVAILABLE with the reason (the load's answer, the repository index, the model's ready endpoint, the log)
and /v1/models does not list it, while the example tiny_decoder is READY with its engine built, so its first
request builds nothing; unloading it ends that engine. Explicit model control: the repository API loads
each folder and answers for it.

The broken folders are tiny_decoder's own files with one fault each: a tokenizer.json that is not one, and a
graph whose `attention_mask` input is renamed, which ONNX Runtime opens and the engine takes (a decoder with
past, the mask being optional) but which no run can feed, so only the load check's generation finds it."""

from __future__ import annotations

import http.client
import json
import shutil
from pathlib import Path

import onnx
import pytest

from conftest import RunningServer, openai_client, start_server
from test_openai_api import MODEL, build_repository

BAD_TOKENIZER = "bad_tokenizer"
BAD_GRAPH = "bad_graph"
ENGINE_READY = f"model {MODEL} version 1: generation engine ready, load check passed"
ENGINE_ENDED = f"model {MODEL} version 1: generation engine ended"


def copy_decoder(root: Path, name: str) -> Path:
    """tiny_decoder's folder under another name (its config's name line changed)."""
    folder = root / name
    shutil.copytree(root / MODEL, folder)
    config = folder / "config.pbtxt"
    config.write_text(config.read_text().replace(f'name: "{MODEL}"', f'name: "{name}"'))
    return folder


def build_broken(root: Path) -> None:
    folder = copy_decoder(root, BAD_TOKENIZER)
    config = folder / "config.pbtxt"
    config.write_text(config.read_text().replace('string_value: "bytes"', 'string_value: "tokenizer.json"'))
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": ')  # cut short
    folder = copy_decoder(root, BAD_GRAPH)
    graph = onnx.load(str(folder / "1" / "model.onnx"))
    for value in graph.graph.input:
        if value.name == "attention_mask":
            value.name = "attention_bias"
    for node in graph.graph.node:
        node.input[:] = ["attention_bias" if i == "attention_mask" else i for i in node.input]
    onnx.save(graph, str(folder / "1" / "model.onnx"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("generate_load")
    repo = build_repository(root / "repo")
    build_broken(repo)
    running = start_server(repo, root / "server.log", "--model-control-mode", "explicit",
                           "--load-model", MODEL)
    yield running
    running.stop()


def call(server: RunningServer, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    conn.request(method, path, body=None if body is None else json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    return resp.status, json.loads(raw) if raw else {}


def index(server: RunningServer) -> dict[str, dict]:
    status, rows = call(server, "POST", "/v2/repository/index", {})
    assert status == 200, rows
    return {row["name"]: row for row in rows}  # type: ignore[union-attr]


def served_models(server: RunningServer) -> set[str]:
    return {m.id for m in openai_client(server).models.list().data}


def test_the_example_is_ready_with_its_engine_built_and_its_first_request_builds_none(server: RunningServer):
    log = server.log()
    assert log.count(ENGINE_READY) == 1 and log.index(ENGINE_READY) < log.index(f"model {MODEL} version 1 "
                                                                                 "READY"), log
    assert index(server)[MODEL]["state"] == "READY" and MODEL in served_models(server)
    answer = openai_client(server).completions.create(model=MODEL, prompt="hi", max_tokens=3)
    assert answer.usage is not None and answer.usage.completion_tokens == 3
    assert server.log().count(ENGINE_READY) == 1  # the request found the engine; it built none


@pytest.mark.parametrize(("name", "reason"), [
    (BAD_TOKENIZER, f"model '{BAD_TOKENIZER}' version 1 cannot generate: model '{BAD_TOKENIZER}': its "
                    "tokenizer.json cannot be loaded: "),
    (BAD_GRAPH, f"model '{BAD_GRAPH}' version 1 cannot generate: its load check (2 greedy tokens from "
                "'Hello') failed: "),
])
def test_a_folder_that_cannot_generate_is_unavailable_with_the_reason(server: RunningServer, name: str,
                                                                      reason: str):
    status, doc = call(server, "POST", f"/v2/repository/models/{name}/load", {})
    assert status == 400 and reason in doc["error"], doc
    if name == BAD_GRAPH:  # found by running the graph: the run's own words name the input it lacks
        assert "attention_bias" in doc["error"], doc
    row = index(server)[name]
    assert row["state"] == "UNAVAILABLE" and reason in row["reason"], row
    status, doc = call(server, "GET", f"/v2/models/{name}/ready")
    assert status == 503 and reason in doc["error"], doc
    assert name not in served_models(server) and MODEL in served_models(server)
    assert f"model {name} version 1 UNAVAILABLE: {reason}" in server.log()


def test_unloading_the_example_ends_its_engine_and_loading_it_builds_a_new_one(server: RunningServer):
    assert ENGINE_ENDED not in server.log()
    assert call(server, "POST", f"/v2/repository/models/{MODEL}/unload", {})[0] == 200
    log = server.log()  # the unload answers once the version is drained and freed
    assert log.index(f"model {MODEL} version 1 UNLOADING") < log.index(ENGINE_ENDED) \
        < log.index(f"model {MODEL} version 1 unloaded"), log
    assert MODEL not in served_models(server)
    assert call(server, "POST", f"/v2/repository/models/{MODEL}/load", {})[0] == 200
    assert server.log().count(ENGINE_READY) == 2 and MODEL in served_models(server)
