"""A folder holding one model's files directly (a flat model.onnx: KServe's ONNX layout at /mnt/models) is
served as a one-model repository named by --single-model-name (engine/repository/single_model.py), over both
protocols; and a server whose repository serves nothing is live but never ready in none and poll mode
(engine/dataplane.py `ready`), while in explicit mode it is ready, as Triton is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import start_server
from engine import native
from hubserve_models.examples import simple_model, write_model


def _infer(url: str, module, name: str) -> list[list[int]]:
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    with module.InferenceServerClient(url) as client:
        inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(x)
        return client.infer(name, inputs).as_numpy("OUTPUT0").tolist()


def test_a_flat_model_onnx_is_served_as_one_model(tmp_path: Path):
    flat = tmp_path / "models"
    flat.mkdir()
    write_model(simple_model(), flat / "model.onnx")
    (flat / ".kserve-hidden").write_text("left by a storage initializer")
    srv = start_server(flat, tmp_path / "server.log", "--model-control-mode", "none",
                       "--single-model-name", "resnet")
    try:
        expected = (2 * np.arange(16)).reshape(1, 16).tolist()
        assert _infer(srv.http_url, httpclient, "resnet") == expected
        assert _infer(srv.grpc_url, grpcclient, "resnet") == expected
        with httpclient.InferenceServerClient(srv.http_url) as client:
            assert client.is_server_ready()
            assert [(m["name"], m.get("state")) for m in client.get_model_repository_index()] == [
                ("resnet", "READY")]
    finally:
        srv.stop()
    assert "holds one model's files: serving them as model 'resnet'" in srv.log()
    assert native.status().line() in srv.log()  # compiled or not, and why: as this checkout decides


def test_a_bad_single_model_name_is_refused_before_anything_loads(tmp_path: Path):
    flat = tmp_path / "models"
    flat.mkdir()
    write_model(simple_model(), flat / "model.onnx")
    with pytest.raises(RuntimeError, match=r"--single-model-name '\.\.'"):
        start_server(flat, tmp_path / "server.log", "--single-model-name", "..", ready_timeout=20)


@pytest.mark.parametrize(("mode", "ready"), [("none", False), ("poll", False), ("explicit", True)])
def test_a_repository_that_serves_nothing_is_not_ready(tmp_path: Path, mode: str, ready: bool):
    empty = tmp_path / "models"
    empty.mkdir()
    srv = start_server(empty, tmp_path / "server.log", "--model-control-mode", mode, wait_ready=False)
    try:
        with httpclient.InferenceServerClient(srv.http_url) as client:
            assert client.is_server_live()
            assert client.is_server_ready() is ready
        with grpcclient.InferenceServerClient(srv.grpc_url) as client:
            assert client.is_server_ready() is ready
    finally:
        srv.stop()


def test_a_flat_hugging_face_export_serves_with_its_own_chat_template(tmp_path: Path):
    """KServe mounts an LLM folder as it was uploaded: an Optimum export's files at /mnt/models's top.
    Served as a one-model repository its files are version 1's (`1/`), and its chat template, tokenizer and
    EOS list are read from there: the recorded chat answers as transformers did."""
    import json

    import openai

    from conftest import ROOT, openai_client

    fixtures = ROOT / "tests" / "fixtures" / "llm"
    srv = start_server(fixtures / "models" / "llama", tmp_path / "server.log", "--model-control-mode", "none",
                       "--single-model-name", "llm")
    try:
        recorded = json.loads((fixtures / "expected" / "llama.json").read_text())
        chat = next(c for c in recorded["chats"] if c["name"] == "system")
        client: openai.OpenAI = openai_client(srv)
        out = client.chat.completions.create(model="llm", messages=chat["messages"], temperature=0,
                                             max_tokens=recorded["greedy"]["max_new_tokens"])
        assert out.choices[0].message.content == chat["text"]
        assert out.choices[0].finish_reason == chat["finish_reason"]
        assert out.usage is not None and out.usage.prompt_tokens == len(chat["prompt_ids"])
    finally:
        srv.stop()
