"""LoRA adapters as OpenAI models, against a real server (also run with
HUBSERVE_TEST_WORKERS=2): `GET /v1/models` lists each adapter folder of a served generative model after its
base as `base:adapter`, with `parent` the base's id (the official `openai` client's `models.list()` /
`models.retrieve()`); an adapter not declared is OpenAI's 404."""

from __future__ import annotations

import shutil

import openai
import pytest

from conftest import EXAMPLES, RunningServer, start_server
from engine.examples import write_model
from engine.generate.tiny_decoder import tiny_decoder_model
from test_generate_lora import ADAPTERS, MODEL, build_model

PLAIN = "tiny_decoder"  # a generative model without adapters


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = build_model(tmp_path_factory.mktemp("adapters") / "repo", max_loras=2).parent
    (root / PLAIN / "1").mkdir(parents=True)
    shutil.copy(EXAMPLES / PLAIN / "config.pbtxt", root / PLAIN / "config.pbtxt")
    write_model(tiny_decoder_model(), root / PLAIN / "1" / "model.onnx")
    (root / MODEL / "adapters" / "notes.txt").write_text("a file, not an adapter")
    (root / MODEL / "adapters" / ".hidden").mkdir()  # not an adapter's name
    running = start_server(root, tmp_path_factory.mktemp("adapters_log") / "server.log")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key="unused", max_retries=0,
                         timeout=60.0)


def test_models_list_each_adapter_after_its_base(client: openai.OpenAI):
    listed = client.models.list().data
    assert [m.id for m in listed] == [PLAIN, MODEL] + [f"{MODEL}:{a}" for a in sorted(ADAPTERS)]
    by_id = {m.id: m.model_dump() for m in listed}
    for name in (PLAIN, MODEL):
        assert by_id[name]["parent"] is None and by_id[name]["root"] == name
    for adapter in ADAPTERS:
        card = by_id[f"{MODEL}:{adapter}"]
        assert card["object"] == "model" and card["owned_by"] == "hubserve"
        assert isinstance(card["created"], int) and card["created"] > 0
        assert card["parent"] == MODEL and card["root"] == f"{MODEL}/adapters/{adapter}"
    one = client.models.retrieve(f"{MODEL}:beta").model_dump()
    assert one == by_id[f"{MODEL}:beta"]
    assert client.models.retrieve(MODEL).model_dump() == by_id[MODEL]


def test_retrieving_an_adapter_not_declared_is_openai_404(client: openai.OpenAI):
    for name, words in ((f"{MODEL}:nope", f"model '{MODEL}' has no LoRA adapter 'nope'"),
                        (f"{PLAIN}:beta", f"model '{PLAIN}' has no LoRA adapter 'beta'"),
                        (f"{MODEL}:.hidden", "has no LoRA adapter '.hidden'"),
                        (f"{MODEL}:notes.txt", "has no LoRA adapter 'notes.txt'"),
                        ("tiny_missing:beta", "does not exist")):
        with pytest.raises(openai.NotFoundError) as err:
            client.models.retrieve(name)
        assert err.value.code == "model_not_found", name
        body = err.value.body
        assert isinstance(body, dict) and words in body["message"] and body["param"] == "model", (name, body)
