"""The CORRID control input end to end, with test models shaped like Triton's "dyna" sequence models
(qa/common/gen_qa_dyna_sequence_models.py, ONNX flavour): the model receives each row's correlation id as an
input. `dyna` (TYPE_UINT64 CORRID, with START, END and READY) answers OUTPUT = INPUT + START + END * CORRID
per row, as Triton's ONNX dyna model, so only a right id in the right row gives the right sum; `dyna_str`
(TYPE_STRING CORRID) answers the id it was given. An id whose type does not suit the control is refused in
Triton's words."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from conftest import start_server
from hubserve_models import examples

CONTROLS = """  control_input [
    { name: "START", control [ { kind: CONTROL_SEQUENCE_START, int32_false_true: [ 0, 1 ] } ] },
    { name: "END", control [ { kind: CONTROL_SEQUENCE_END, int32_false_true: [ 0, 1 ] } ] },
    { name: "READY", control [ { kind: CONTROL_SEQUENCE_READY, int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID", control [ { kind: CONTROL_SEQUENCE_CORRID, data_type: %s } ] }
  ]"""
DYNA = """name: "%s"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "INPUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUTPUT", data_type: TYPE_INT64, dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  direct { max_queue_delay_microseconds: 20000 minimum_slot_utilization: 1.0 }
%s
}
instance_group [ { count: 1, kind: KIND_CPU } ]
"""
DYNA_STR = """name: "dyna_str"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "INPUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUTPUT", data_type: TYPE_STRING, dims: [ 1 ] } ]
sequence_batching {
  control_input [ { name: "CORRID", control [ { kind: CONTROL_SEQUENCE_CORRID, data_type: TYPE_STRING } ] } ]
}
"""


def _graph_model(nodes, inputs, outputs, name) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", examples.OPSET)],
                              ir_version=examples.IR_VERSION)
    onnx.checker.check_model(model)
    return model


def dyna_model(corrid_type: int) -> onnx.ModelProto:
    """OUTPUT (INT64) = INPUT + START + END * CORRID, every tensor [batch, 1]; READY is taken and unused."""
    cast = [helper.make_node("Cast", [n], [f"{n}_64"], to=TensorProto.INT64)
            for n in ("INPUT", "START", "END", "CORRID")]
    nodes = cast + [
        helper.make_node("Add", ["INPUT_64", "START_64"], ["STARTED"]),
        helper.make_node("Mul", ["END_64", "CORRID_64"], ["ENDED"]),
        helper.make_node("Add", ["STARTED", "ENDED"], ["OUTPUT"]),
        helper.make_node("Identity", ["READY"], ["READY_SEEN"]),
    ]
    dims = ["batch", 1]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT32, dims) for n in ("INPUT", "START", "END",
                                                                                  "READY")]
    inputs.append(helper.make_tensor_value_info("CORRID", corrid_type, dims))
    outputs = [helper.make_tensor_value_info("OUTPUT", TensorProto.INT64, dims),
               helper.make_tensor_value_info("READY_SEEN", TensorProto.INT32, dims)]
    return _graph_model(nodes, inputs, outputs, "dyna")


def dyna_str_model() -> onnx.ModelProto:
    """OUTPUT = CORRID (a string per row); INPUT is taken and unused."""
    dims = ["batch", 1]
    return _graph_model(
        [helper.make_node("Identity", ["CORRID"], ["OUTPUT"]),
         helper.make_node("Identity", ["INPUT"], ["IN"])],
        [helper.make_tensor_value_info("INPUT", TensorProto.INT32, dims),
         helper.make_tensor_value_info("CORRID", TensorProto.STRING, dims)],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.STRING, dims),
         helper.make_tensor_value_info("IN", TensorProto.INT32, dims)], "dyna_str")


MODELS = {
    "dyna": (DYNA % ("dyna", CONTROLS % "TYPE_UINT64"), lambda: dyna_model(TensorProto.UINT64)),
    "dyna_i32": (DYNA % ("dyna_i32", CONTROLS % "TYPE_INT32"), lambda: dyna_model(TensorProto.INT32)),
    "dyna_str": (DYNA_STR, dyna_str_model),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("corrid_repo")
    for name, (config, build) in MODELS.items():
        (root / name).mkdir()
        (root / name / "config.pbtxt").write_text(config)
        examples.write_model(build(), root / name / "1" / "model.onnx")
    srv = start_server(root, tmp_path_factory.mktemp("corrid_server") / "server.log")
    yield srv
    srv.stop()


def _infer(client, module, model, v, sid, start=False, end=False):
    inp = module.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.full((1, 1), v, dtype=np.int32))
    result = client.infer(model, [inp], sequence_id=sid, sequence_start=start, sequence_end=end)
    return result.as_numpy("OUTPUT")[0, 0]


def _sequence(client, module, model, sid, values):
    return [int(_infer(client, module, model, v, sid, start=i == 0, end=i == len(values) - 1))
            for i, v in enumerate(values)]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["dyna", "dyna_i32"])
def test_the_model_receives_each_rows_correlation_id(server, protocol, model):
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    sid = 1_000_000_007
    assert _sequence(client, module, model, sid, [5, 6, 7]) == [6, 6, 7 + sid]


def test_parallel_sequences_of_different_lengths_each_get_their_own_id(server):
    """Triton's skip-batch shape: four sequences at once in the four rows (full-slot batches wait up to
    20 ms), two of them shorter, so later batches carry filler rows whose id is 0."""
    corrids = [1001, 1002, 1003, 1004]
    values = [[1, 3], [11, 12, 13, 14], [111, 113], [1111, 1112, 1113, 1114]]
    got: dict[int, list[int]] = {}

    def run(sid, vals):
        client = grpcclient.InferenceServerClient(server.grpc_url)
        got[sid] = _sequence(client, grpcclient, "dyna", sid, vals)

    threads = [threading.Thread(target=run, args=args) for args in zip(corrids, values, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for sid, vals in zip(corrids, values, strict=True):
        want = [v + (i == 0) + (sid if i == len(vals) - 1 else 0) for i, v in enumerate(vals)]
        assert got[sid] == want


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_string_corrid_carries_the_string(server, protocol):
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    for sid in ("sequence-α", "42"):
        answers = [_infer(client, module, "dyna_str", 1, sid, start=i == 0, end=i == 1) for i in range(2)]
        assert answers == [sid.encode()] * 2


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(("model", "sid", "words"), [
    ("dyna", "a-string", "sequence batching control 'CORRID' data-type is 'BYTES', but model 'dyna' "
                         "expects 'UINT64'"),
    ("dyna_str", 123, "sequence batching control 'CORRID' data-type is 'UINT64', but model 'dyna_str' "
                      "expects 'BYTES'"),
    ("dyna_i32", 2**31, "has correlation ID 2147483648, which its sequence batching control 'CORRID' "
                        "(TYPE_INT32) cannot hold"),
])
def test_an_id_of_the_wrong_type_is_invalid_argument(server, protocol, model, sid, words):
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        _infer(client, module, model, 1, sid, start=True)
    assert words in info.value.message()
    assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    assert server.metric("hubserve_sequence_active", model) == 0
