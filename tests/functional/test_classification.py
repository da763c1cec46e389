"""The classification extension (engine/classification.py): the top-k formatting as pure functions, then
through Triton's clients over both protocols against a model with a label file (batch-aware, labels,
`score:index` without labels, class counts above the number of classes, types Triton refuses).

This file imports `tritonclient.grpc` and none of our generated modules.
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import ensemble_repository as repo
from conftest import start_server
from engine.classification import top_k
from hubserve_models import examples

# ------------------------------------------------------------------------------------------------ pure


def text(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else x  # tritonclient gives str for JSON BYTES


def strings(array: np.ndarray) -> list:
    return [[text(x) for x in row] for row in array] if array.ndim == 2 else [text(x) for x in array]


def test_six_decimals_highest_first_with_labels() -> None:
    scores = np.array([[0.1, 0.9, 0.3, 0.5]], np.float32)
    assert strings(top_k(scores, 2, True, repo.LABELS)) == [["0.900000:1:dog", "0.500000:3:fish"]]


def test_without_labels_and_past_the_label_file() -> None:
    scores = np.array([0.25, 0.75, 0.5], np.float64)
    assert strings(top_k(scores, 3, False)) == ["0.750000:1", "0.500000:2", "0.250000:0"]
    assert strings(top_k(scores, 2, False, ("a",))) == ["0.750000:1", "0.500000:2"]


def test_a_count_above_the_classes_returns_them_all() -> None:
    assert top_k(np.arange(4, dtype=np.float32), 10, False).shape == (4,)


def test_each_batch_element_is_classified_alone_over_its_flattened_dims() -> None:
    scores = np.array([[[1, 5], [3, 2]], [[7, 0], [0, 8]]], np.int32)  # [batch 2, 2, 2]
    assert strings(top_k(scores, 2, True)) == [["5:1", "3:2"], ["8:3", "7:0"]]  # integers as integers


def test_ties_keep_index_order_and_nan_ranks_last() -> None:
    assert strings(top_k(np.array([1, 3, 3, 2], np.uint8), 3, False)) == ["3:1", "3:2", "2:3"]
    scores = np.array([np.nan, 0.5, np.inf, -np.inf], np.float32)
    assert strings(top_k(scores, 4, False)) == ["inf:2", "0.500000:1", "-inf:3", "nan:0"]


# ------------------------------------------------------------------------------------- through clients

@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("classification_repository")
    repo.write_onnx(root, "scores", examples.identity_model("FP32", (-1, 4)), repo.SCORES,
                    {"labels.txt": "\n".join(repo.LABELS) + "\n"})
    repo.write_onnx(root, "plain", examples.identity_model("FP64", (-1, 3)),
                    'name: "plain"\nbackend: "onnxruntime"\nmax_batch_size: 4\n')
    repo.write_onnx(root, "halves", examples.identity_model("FP16", (-1, 3)),
                    'name: "halves"\nbackend: "onnxruntime"\nmax_batch_size: 4\n')
    srv = start_server(root, tmp_path_factory.mktemp("classification_server") / "server.log")
    yield srv
    srv.stop()


def infer(client, model: str, data: np.ndarray, datatype: str, class_count: int, binary: bool = True):
    tensor = client.module.InferInput("INPUT0", list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    if client.module is httpclient:
        out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary, class_count=class_count)
    else:
        out = grpcclient.InferRequestedOutput("OUTPUT0", class_count=class_count)
    return client.infer(model, [tensor], outputs=[out])


def test_labels_from_the_outputs_label_file_for_each_batch_element(client) -> None:
    data = np.array([[0.1, 0.9, 0.3, 0.5], [0.8, 0.1, 0.05, 0.05]], np.float32)
    result = infer(client, "scores", data, "FP32", 2)
    assert strings(result.as_numpy("OUTPUT0")) == [["0.900000:1:dog", "0.500000:3:fish"],
                                                   ["0.800000:0:cat", "0.100000:1:dog"]]
    output = result.get_output("OUTPUT0")
    datatype, shape = (output["datatype"], output["shape"]) if client.module is httpclient else \
        (output.datatype, list(output.shape))
    assert datatype == "BYTES" and shape == [2, 2]


def test_json_answer_over_http(server) -> None:
    with httpclient.InferenceServerClient(server.http_url) as c:
        c.module = httpclient
        result = infer(c, "scores", np.array([[0.0, 0.0, 1.0, 0.5]], np.float32), "FP32", 1, binary=False)
    assert strings(result.as_numpy("OUTPUT0")) == [["1.000000:2:parrot"]]


def test_without_labels_and_with_more_classes_asked_than_there_are(client) -> None:
    result = infer(client, "plain", np.array([[0.5, 2.0, 1.0]], np.float64), "FP64", 7)
    assert strings(result.as_numpy("OUTPUT0")) == [["2.000000:1", "1.000000:2", "0.500000:0"]]


def test_a_type_triton_does_not_classify_is_refused(client) -> None:
    with pytest.raises(InferenceServerException) as e:
        infer(client, "halves", np.ones((1, 3), np.float16), "FP16", 2)
    words = "class result not available for output 'OUTPUT0' due to unsupported type 'FP16'"
    assert words in e.value.message(), e.value.message()
    assert e.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
