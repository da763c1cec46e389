"""What a model sees of a batch and what becomes of its answers, without a process: the stub's requests
(stub.py `requests_from`, built without pb_utils' constructors), runner.py `convert_response`, and the
loop's `AnswerCheck` (answers.py), whose shape check takes one comparison where the config's dims are fixed
and the general path where one is -1."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.python import pb_utils
from engine.backends.python.answers import AnswerCheck
from engine.backends.python.messages import RequestHeader
from engine.backends.python.runner import convert_response
from engine.backends.python.stub import requests_from
from engine.config import steps as cfg
from engine.config.model_config import ModelConfig
from engine.errors import EngineError
from engine.types import DataType, InferenceRequest


def config_of(max_batch_size: int, dims: str) -> ModelConfig:
    text = (f'backend: "python"\nmax_batch_size: {max_batch_size}\n'
            f'input {{ name: "IN" data_type: TYPE_INT32 dims: {dims} }}\n'
            f'output {{ name: "OUT" data_type: TYPE_INT32 dims: {dims} }}\n')
    msg = cfg.pb.ModelConfig()
    cfg.parse_pbtxt(text, msg)
    cfg.autocomplete(msg, None, "m")
    return cfg.validate(msg, "m/config.pbtxt")


def test_a_batch_reads_as_the_model_expects() -> None:
    a, b = np.arange(4, dtype=np.int32), np.arange(3, dtype=np.float32)
    headers = [RequestHeader("r1", 7, 1, '{"k":1}', ["OUT"], 1, 0),
               RequestHeader("r2", "seq", 2, "{}", ["OUT", "X"], 1, 0)]
    first, second = requests_from(headers, [("IN", DataType.INT32, a), ("IN", DataType.FP32, b)])
    assert (first.request_id(), first.correlation_id(), first.flags(), first.parameters()) == \
        ("r1", 7, 1, '{"k":1}')
    assert (second.correlation_id(), second.requested_output_names()) == ("seq", ["OUT", "X"])
    tensor = pb_utils.get_input_tensor_by_name(second, "IN")
    assert tensor is not None and tensor.datatype() == "FP32" and tensor.as_numpy() is b
    assert tensor.triton_dtype() == pb_utils.numpy_to_triton_type(np.float32)
    assert not first.is_cancelled() and first.model_name == "" and first.timeout() == 0
    with pytest.raises(pb_utils.TritonModelException, match="decoupled"):
        first.get_response_sender()


def test_a_correlation_id_of_another_type_is_still_refused() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="Correlation ID"):
        pb_utils.make_request([], [], "r", True, 0, "{}")  # type: ignore[arg-type]


def test_answers_keep_their_datatypes_and_an_unknown_one_is_an_error() -> None:
    ok = convert_response(pb_utils.InferenceResponse([
        pb_utils.Tensor("A", np.ones((2, 2), np.int32).T),  # not contiguous: made so
        pb_utils.Tensor("B", np.array([b"x"], dtype="S1"), "BYTES")]), 0)
    (name_a, type_a, array_a), (name_b, type_b, array_b) = ok[1]
    assert (name_a, type_a, array_a.flags.c_contiguous) == ("A", DataType.INT32, True)
    assert (name_b, type_b, array_b.dtype) == ("B", DataType.BYTES, np.dtype(object))
    with pytest.raises(EngineError, match="unknown datatype 'NOPE'"):
        convert_response(pb_utils.InferenceResponse([pb_utils.Tensor("C", np.ones(1), "NOPE")]), 0)


@pytest.mark.parametrize(("max_batch_size", "dims", "shape", "fits"), [
    (8, "[ 4 ]", (2, 4), True), (8, "[ 4 ]", (3, 4), False), (8, "[ 4 ]", (2, 5), False),
    (8, "[ 4 ]", (), False), (8, "[ -1 ]", (2, 9), True), (8, "[ -1 ]", (3, 9), False),
    (0, "[ 2, 3 ]", (2, 3), True), (0, "[ 2, 3 ]", (3, 2), False), (0, "[ -1, 3 ]", (5, 3), True),
])
def test_an_output_shape_is_checked_against_the_config(max_batch_size: int, dims: str,
                                                        shape: tuple[int, ...], fits: bool) -> None:
    check = AnswerCheck(config_of(max_batch_size, dims), "1")
    answer = ("ok", [("OUT", DataType.INT32, np.zeros(shape, np.int32))], "{}")
    result = check.response(InferenceRequest("m", "", [], "r"), answer, 2)
    if fits:
        assert not isinstance(result, EngineError) and result.outputs[0].shape == shape
    else:
        assert isinstance(result, EngineError) and "returned output 'OUT' with shape" in result.message
