"""The example text pipeline (model_repository/text_pipeline, issue 14 point 7) through Triton's own clients
over both protocols: a Python tokenizer, an ONNX classifier and Python post-processing with labels, as an
ensemble, from the committed files as they are (the ONNX model built by perf/hubserve_models/examples.py).

This file imports `tritonclient.grpc` and none of our generated modules.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import start_server
from hubserve_harness import EXAMPLES
from hubserve_models import examples

PIPELINE = ["text_tokenizer", "text_classifier", "text_postprocess", "text_pipeline"]
TEXTS = {
    "What a great movie, I loved it!": "positive",
    "The service was terrible and SLOW.": "negative",
    "It is a film about a server.": "neutral",
    "Ünïcode wörds, nothing else": "neutral",
    "": "neutral",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("text_repository")
    for name in PIPELINE:
        shutil.copytree(EXAMPLES / name, root / name,
                        ignore=shutil.ignore_patterns("model.onnx", "__pycache__"))
    examples.build_repository(root, ["text_classifier", "text_pipeline"])
    srv = start_server(root, tmp_path_factory.mktemp("text_server") / "server.log", ready_timeout=120)
    yield srv
    srv.stop()


def text_input(module, texts: list[bytes]):
    tensor = module.InferInput("TEXT", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object).reshape(-1, 1))
    return [tensor]


def test_every_step_and_the_pipeline_are_ready(client) -> None:
    for name in PIPELINE:
        assert client.is_model_ready(name), name
    config = client.get_model_config("text_pipeline")
    if client.module is grpcclient:
        config = {"platform": config.config.platform}
    assert config["platform"] == "ensemble"


def test_the_pipeline_labels_a_batch_of_texts(client) -> None:
    texts = [t.encode() for t in TEXTS]
    result = client.infer("text_pipeline", text_input(client.module, texts))
    labels = result.as_numpy("LABEL")
    confidence = result.as_numpy("CONFIDENCE")
    assert labels.shape == (len(texts), 1) and confidence.shape == (len(texts), 1)
    assert [row[0].decode() for row in labels] == list(TEXTS.values())
    assert confidence.dtype == np.float32 and ((confidence > 1 / 3) & (confidence <= 1)).all()
    assert confidence[0, 0] > 0.9 and confidence[1, 0] > 0.9  # two opinion words each


def test_the_steps_compute_what_the_pipeline_reports(client) -> None:
    """The tokenizer's ids are the lines of vocab.txt; the classifier's scores pick the post-processing's
    label: the ensemble's answer is the composition of its steps' answers."""
    m = client.module
    tokens = client.infer("text_tokenizer", text_input(m, [b"great day, bad food"])).as_numpy("TOKENS")
    vocab = examples.TEXT_VOCAB
    assert tokens.dtype == np.int64 and tokens.shape == (1, examples.TEXT_LENGTH)
    assert [vocab[i] for i in tokens[0][:4]] == ["great", "day", "bad", "food"]
    assert not tokens[0][4:].any()
    feed = m.InferInput("TOKENS", list(tokens.shape), "INT64")
    feed.set_data_from_numpy(tokens)
    scores = client.infer("text_classifier", [feed]).as_numpy("SCORES")
    assert scores.shape == (1, 3) and abs(float(scores.sum()) - 1) < 1e-5
    piped = client.infer("text_pipeline", text_input(m, [b"great day, bad food"]))
    assert piped.as_numpy("LABEL")[0][0].decode() == examples.TEXT_LABELS[int(scores.argmax())]
    np.testing.assert_allclose(piped.as_numpy("CONFIDENCE")[0][0], scores.max(), rtol=1e-6)


def test_text_that_is_not_utf8_fails_that_request_with_the_tokenizers_error(client) -> None:
    with pytest.raises(InferenceServerException, match="TEXT must be UTF-8") as e:
        client.infer("text_pipeline", text_input(client.module, [b"\xff\xfe not text"]))
    assert str(e.value.status()) in ("400", "StatusCode.INVALID_ARGUMENT")
    result = client.infer("text_pipeline", text_input(client.module, [b"love it"]))
    assert result.as_numpy("LABEL")[0][0] == b"positive"  # the pipeline serves on
