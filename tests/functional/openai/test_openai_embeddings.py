"""/v1/embeddings against a real server, with the `openai` package: tiny BERT-like encoders built in the test
(embedding_model.py: an ONNX graph, a WordPiece tokenizer.json, sentence-transformers' pooling folders),
served by the ONNX backend behind the dynamic batcher. Every vector is checked against the numpy reference
of the same network and pooling, run one input at a time without padding, so padding, batching, pooling,
Matryoshka cuts, normalization and both encodings are all held to it."""

from __future__ import annotations

import base64
import concurrent.futures
import http.client
import json
import shutil
import urllib.request
from pathlib import Path

import numpy as np
import openai
import pytest
from embedding_model import MATRYOSHKA, MAX_SEQ_LENGTH, Weights, reference, tokenizer, write_model

from conftest import EXAMPLES, RunningServer, openai_client, start_server, wait_until
from hubserve_models import examples

MODEL, CLS_MODEL, BATCHED = "embedder", "embedder_cls", "embedder_batched"
TEXTS = ["the quick brown fox", "hello world", "follow the white rabbit . the cat sat on the mat",
         "embed me", "the dog sat on a mat, the cat sat on the dog, the fox sat on the cat !"]
BATCH_ROWS = 4


@pytest.fixture(scope="module")
def weights() -> dict[str, Weights]:
    """Each model's weights, by name, filled by `repo`."""
    return {}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, weights: dict[str, Weights]) -> Path:
    root = tmp_path_factory.mktemp("openai_embeddings") / "repo"
    root.mkdir()
    weights[MODEL] = write_model(root, MODEL)
    weights[CLS_MODEL] = write_model(root, CLS_MODEL, pooling="cls_token", normalize=False, matryoshka=False,
                                     seed=11)
    # a long queue delay and a batch of BATCH_ROWS: concurrent requests of one length leave as one batch
    weights[BATCHED] = write_model(root, BATCHED, max_batch_size=BATCH_ROWS, delay_us=5_000_000, seed=7)
    (root / "tiny_decoder").mkdir()
    shutil.copy(EXAMPLES / "tiny_decoder" / "config.pbtxt", root / "tiny_decoder" / "config.pbtxt")
    examples.build_repository(root, ["tiny_decoder"])
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory):
    running = start_server(repo, tmp_path_factory.mktemp("openai_embeddings_log") / "server.log")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai_client(server)


def ids_of(text: str) -> list[int]:
    return tokenizer().encode(text).ids


def assert_close(got: list[float], want: np.ndarray) -> None:
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=1e-4, atol=2e-5)


def post(server: RunningServer, body: dict) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(server.http_url, timeout=30)
    try:
        conn.request("POST", "/v1/embeddings", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def test_one_text_as_floats(client: openai.OpenAI, weights: dict[str, Weights]):
    out = client.embeddings.create(model=MODEL, input=TEXTS[0], encoding_format="float")
    assert out.object == "list" and out.model == MODEL and len(out.data) == 1
    assert out.data[0].object == "embedding" and out.data[0].index == 0
    assert_close(out.data[0].embedding, reference(weights[MODEL], ids_of(TEXTS[0])))
    assert out.usage.prompt_tokens == out.usage.total_tokens == len(ids_of(TEXTS[0]))


def test_many_texts_as_base64(client: openai.OpenAI, weights: dict[str, Weights]):
    """The openai package asks for base64 unless told otherwise, and decodes it: lengths in two padding
    buckets (under and over 16 tokens), answered in the inputs' order."""
    assert len({len(ids_of(t)) > 16 for t in TEXTS}) == 2
    out = client.embeddings.create(model=MODEL, input=TEXTS)
    assert [d.index for d in out.data] == list(range(len(TEXTS)))
    for d, text in zip(out.data, TEXTS, strict=True):
        assert_close(d.embedding, reference(weights[MODEL], ids_of(text)))
    assert out.usage.prompt_tokens == sum(len(ids_of(t)) for t in TEXTS)


def test_base64_is_little_endian_float32(server: RunningServer, weights: dict[str, Weights]):
    status, body = post(server, {"model": MODEL, "input": ["hello world"], "encoding_format": "base64"})
    assert status == 200, body
    raw = base64.b64decode(body["data"][0]["embedding"])
    assert_close(np.frombuffer(raw, dtype="<f4").tolist(), reference(weights[MODEL], ids_of("hello world")))


def test_floats_by_default_over_http(server: RunningServer, weights: dict[str, Weights]):
    status, body = post(server, {"model": MODEL, "input": "embed me"})
    assert status == 200, body
    assert isinstance(body["data"][0]["embedding"], list)
    assert_close(body["data"][0]["embedding"], reference(weights[MODEL], ids_of("embed me")))


def test_token_id_inputs(client: openai.OpenAI, weights: dict[str, Weights]):
    """Token ids are taken as given: no special tokens added."""
    one = [6, 7, 8]
    out = client.embeddings.create(model=MODEL, input=one, encoding_format="float")
    assert len(out.data) == 1 and out.usage.prompt_tokens == 3
    assert_close(out.data[0].embedding, reference(weights[MODEL], one))
    many = [[6, 7, 8], ids_of("hello world"), [9]]
    out = client.embeddings.create(model=MODEL, input=many, encoding_format="float")
    for d, ids in zip(out.data, many, strict=True):
        assert_close(d.embedding, reference(weights[MODEL], ids))


def test_matryoshka_dimensions(client: openai.OpenAI, weights: dict[str, Weights]):
    for dims in MATRYOSHKA:
        out = client.embeddings.create(model=MODEL, input=TEXTS[:2], dimensions=dims)
        for d, text in zip(out.data, TEXTS, strict=False):
            assert len(d.embedding) == dims
            assert_close(d.embedding, reference(weights[MODEL], ids_of(text), dimensions=dims))
            assert abs(np.linalg.norm(d.embedding) - 1) < 1e-5


def test_cls_pooling_without_normalize(client: openai.OpenAI, weights: dict[str, Weights]):
    out = client.embeddings.create(model=CLS_MODEL, input=TEXTS[:3], encoding_format="float")
    for d, text in zip(out.data, TEXTS, strict=False):
        assert_close(d.embedding, reference(weights[CLS_MODEL], ids_of(text), "cls_token", normalize=False))


def _stats(server: RunningServer, model: str) -> dict:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/stats", timeout=10) as r:
        return json.loads(r.read())["model_stats"][0]


def test_concurrent_requests_are_batched(server: RunningServer, weights: dict[str, Weights]):
    """BATCH_ROWS requests of one input each, of different lengths in one padding bucket, sent at once: the
    model's statistics count BATCH_ROWS inferences in fewer executions (its queue delay lets them meet; inputs
    padded only to their own length could not share a batch)."""
    before = _stats(server, BATCHED)
    texts = ["cat", "the cat", "the cat sat", "the cat sat on"][:BATCH_ROWS]
    assert len({len(ids_of(t)) for t in texts}) == BATCH_ROWS
    clients = [openai_client(server) for _ in texts]
    with concurrent.futures.ThreadPoolExecutor(len(texts)) as pool:
        outs = list(pool.map(lambda c, text: c.embeddings.create(model=BATCHED, input=text,
                                                                 encoding_format="float"), clients, texts))
    for out, text in zip(outs, texts, strict=True):
        assert_close(out.data[0].embedding, reference(weights[BATCHED], ids_of(text)))
    after = wait_until(lambda: (s := _stats(server, BATCHED))["inference_count"]
                       - before["inference_count"] == BATCH_ROWS and s, "the batch's statistics")
    executions = after["execution_count"] - before["execution_count"]
    assert executions < BATCH_ROWS, after


def _error(excinfo: pytest.ExceptionInfo) -> dict:
    return excinfo.value.response.json()["error"]


def test_too_long_is_refused(client: openai.OpenAI):
    text = " ".join(["cat"] * MAX_SEQ_LENGTH)  # + [CLS] and [SEP]: past the context
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=MODEL, input=["hello", text])
    err = _error(e)
    assert err["param"] == "input" and err["code"] == "context_length_exceeded"
    assert f"maximum context length is {MAX_SEQ_LENGTH} tokens" in err["message"]
    assert "input[1]" in err["message"]


@pytest.mark.parametrize(("body", "param"), [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": ["ok", 3]}, "input"),
    ({"input": ["ok", [1, 2]]}, "input"),
    ({"input": [10_000]}, "input"),
    ({"input": "ok", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "ok", "dimensions": 0}, "dimensions"),
    ({"input": "ok", "dimensions": 12}, "dimensions"),
    ({"input": "ok", "truncate": True}, "truncate"),
    ({}, "input"),
])
def test_bad_requests_name_the_field(server: RunningServer, body: dict, param: str):
    status, answer = post(server, {"model": MODEL, **body})
    assert status == 400, answer
    assert answer["error"]["type"] == "invalid_request_error" and answer["error"]["param"] == param, answer


def test_dimensions_on_a_model_without_matryoshka(client: openai.OpenAI):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=CLS_MODEL, input="hello", dimensions=16)
    err = _error(e)
    assert err["param"] == "dimensions" and "not a Matryoshka model" in err["message"]


def test_a_generative_model_does_not_embed(client: openai.OpenAI):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="tiny_decoder", input="hello")
    err = _error(e)
    assert err["param"] == "model" and "does not serve embeddings" in err["message"]


def test_unknown_model(client: openai.OpenAI):
    with pytest.raises(openai.NotFoundError) as e:
        client.embeddings.create(model="nope", input="hello")
    assert _error(e)["param"] == "model"


def test_models_lists_the_embedding_models(client: openai.OpenAI):
    ids = [m.id for m in client.models.list().data]
    assert ids == ["tiny_decoder", MODEL, BATCHED, CLS_MODEL]
    assert client.models.retrieve(MODEL).to_dict()["max_model_len"] == MAX_SEQ_LENGTH
