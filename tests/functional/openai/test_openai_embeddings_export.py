"""/v1/embeddings on a real Optimum `feature-extraction` export (tests/fixtures/embeddings/models/bert_embed:
a tiny random-weight BertModel with a WordPiece tokenizer and sentence-transformers' mean pooling and
Normalize, made by tools/llm_fixtures/make_embedding_fixture.py), against the vectors torch gave for the same
texts (expected/bert_embed.json), with the `openai` package. The folder is served as exported: the test adds
only the version folder and a config.pbtxt."""

from __future__ import annotations

import json
import shutil

import numpy as np
import openai
import pytest

from conftest import ROOT, RunningServer, openai_client, start_server

FIXTURES = ROOT / "tests" / "fixtures" / "embeddings"
NAME = "bert_embed"
EXPECTED = json.loads((FIXTURES / "expected" / f"{NAME}.json").read_text())
TEXTS = [t["text"] for t in EXPECTED["texts"]]
HIDDEN = EXPECTED["hidden_size"]

CONFIG = f"""name: "{NAME}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {{ name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] }},
  {{ name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }},
  {{ name: "token_type_ids" data_type: TYPE_INT64 dims: [ -1 ] }}
]
output [ {{ name: "last_hidden_state" data_type: TYPE_FP32 dims: [ -1, {HIDDEN} ] }} ]
dynamic_batching {{ }}
parameters {{ key: "embedding" value {{ string_value: "true" }} }}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("openai_embeddings_export") / "repo"
    folder = root / NAME
    shutil.copytree(FIXTURES / "models" / NAME, folder)
    (folder / "1").mkdir()
    (folder / "model.onnx").rename(folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(CONFIG)
    running = start_server(root, tmp_path_factory.mktemp("openai_embeddings_export_log") / "server.log")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai_client(server)


def assert_close(got: list[float], want: list[float] | np.ndarray) -> None:
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=1e-4,
                               atol=1e-4)


def test_the_fixture_is_what_the_test_reads():
    assert EXPECTED["pooling"] == "mean_tokens" and EXPECTED["normalize"] is True
    assert EXPECTED["inputs"] == ["attention_mask", "input_ids", "token_type_ids"]
    assert (FIXTURES / "models" / NAME / "2_Normalize").is_dir()


def test_texts_give_torchs_vectors(client: openai.OpenAI):
    out = client.embeddings.create(model=NAME, input=TEXTS)  # base64, as the openai package asks
    for d, record in zip(out.data, EXPECTED["texts"], strict=True):
        assert_close(d.embedding, record["embedding"])
    assert out.usage.prompt_tokens == sum(len(t["ids"]) for t in EXPECTED["texts"])


def test_one_text_at_a_time_as_floats(client: openai.OpenAI):
    for record in EXPECTED["texts"]:
        out = client.embeddings.create(model=NAME, input=record["text"], encoding_format="float")
        assert out.usage.prompt_tokens == len(record["ids"])
        assert_close(out.data[0].embedding, record["embedding"])


def test_the_tokenizers_ids_give_the_same_vectors(client: openai.OpenAI):
    ids = [t["ids"] for t in EXPECTED["texts"]]
    out = client.embeddings.create(model=NAME, input=ids, encoding_format="float")
    for d, record in zip(out.data, EXPECTED["texts"], strict=True):
        assert_close(d.embedding, record["embedding"])


@pytest.mark.parametrize("dims", EXPECTED["matryoshka_dimensions"])
def test_matryoshka_dimensions_from_config_json(client: openai.OpenAI, dims: int):
    out = client.embeddings.create(model=NAME, input=TEXTS[:2], dimensions=dims, encoding_format="float")
    for d, record in zip(out.data, EXPECTED["texts"], strict=False):
        cut = np.asarray(record["pooled"][:dims])
        assert_close(d.embedding, cut / np.linalg.norm(cut))


def test_the_context_from_sentence_bert_config(client: openai.OpenAI):
    too_long = " ".join(["the"] * EXPECTED["max_seq_length"])
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=NAME, input=too_long)
    assert e.value.code == "context_length_exceeded"
    assert client.models.retrieve(NAME).to_dict()["max_model_len"] == EXPECTED["max_seq_length"]
