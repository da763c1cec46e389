"""An embedding model's folder is read while its version loads (engine/embed/model.py): one that cannot embed
fails its load through the repository API, UNAVAILABLE with the reason naming the file, and is neither
listed on /v1/models nor embedded with; a good one loaded beside it serves."""

from __future__ import annotations

import http.client
import json

import openai
import pytest
from embedding_model import write_model

from conftest import RunningServer, openai_client, start_server

GOOD, NO_TOKENIZER, TWO_POOLINGS = "embedder", "no_tokenizer", "two_poolings"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("openai_embeddings_load")
    repo = root / "repo"
    repo.mkdir()
    for name in (GOOD, NO_TOKENIZER, TWO_POOLINGS):
        write_model(repo, name)
    (repo / NO_TOKENIZER / "tokenizer.json").unlink()
    pooling = repo / TWO_POOLINGS / "1_Pooling" / "config.json"
    pooling.write_text(json.dumps({**json.loads(pooling.read_text()), "pooling_mode_cls_token": True}))
    running = start_server(repo, root / "server.log", "--model-control-mode", "explicit",
                           "--load-model", GOOD)
    yield running
    running.stop()


def call(server: RunningServer, path: str) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(server.http_url, timeout=60)
    try:
        conn.request("POST", path, b"{}", {"Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read()
        return r.status, json.loads(raw) if raw else {}
    finally:
        conn.close()


@pytest.mark.parametrize(("name", "reason"), [
    (NO_TOKENIZER, "tokenizer.json does not load"),
    (TWO_POOLINGS, "1_Pooling/config.json must set exactly one of"),
])
def test_a_folder_that_cannot_embed_fails_its_load(server: RunningServer, name: str, reason: str):
    status, doc = call(server, f"/v2/repository/models/{name}/load")
    assert status == 400 and reason in doc["error"], doc
    status, rows = call(server, "/v2/repository/index")
    row = next(r for r in rows if r["name"] == name)  # type: ignore[union-attr]
    assert row["state"] == "UNAVAILABLE" and reason in row["reason"], row
    client = openai_client(server)
    assert [m.id for m in client.models.list().data] == [GOOD]
    with pytest.raises(openai.APIStatusError) as e:
        client.embeddings.create(model=name, input="hello")
    assert e.value.status_code in (404, 503)
    assert client.embeddings.create(model=GOOD, input="hello").data[0].embedding


