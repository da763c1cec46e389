"""Tests of protos/*.proto and the generated modules in engine/proto.

* engine/proto is up to date with protos/ and generation is deterministic.
* Our protocol is wire compatible with tritonclient's: same messages, fields,
  numbers, types, oneofs, enums and RPCs; messages round-trip both ways; and
  tritonclient's own client talks to a server built on our stubs.
* Our modules and tritonclient's coexist in one process (private pool).
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import textwrap
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import pytest

# Ours and tritonclient's, deliberately imported into the same process.
import tritonclient.grpc as triton_grpc
from google.protobuf import descriptor_pool, text_format
from tritonclient.grpc import model_config_pb2 as triton_mc
from tritonclient.grpc import service_pb2 as triton_svc
from tritonclient.utils import InferenceServerException

from conftest import ROOT
from engine.proto import _pool, health_pb2, health_pb2_grpc
from engine.proto import grpc_service_pb2 as svc
from engine.proto import grpc_service_pb2_grpc as svc_grpc
from engine.proto import model_config_pb2 as mc

GENERATED_DIR = ROOT / "engine" / "proto"
GENERATE = ROOT / "protos" / "generate.py"
REGENERATE_HINT = "run `python protos/generate.py` and include engine/proto in the change"

# (tritonclient module, our module) for each .proto file of the protocol.
FILE_PAIRS = [(triton_svc, svc), (triton_mc, mc)]


# ---------------------------------------------------------------------------
# Generated code
# ---------------------------------------------------------------------------


def _generate(out_dir: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(GENERATE), "--out", str(out_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.fail(f"protos/generate.py failed (rc={proc.returncode}):\n{proc.stdout}{proc.stderr}")


def _generated_files(directory: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in sorted(directory.iterdir())
        if p.is_file() and p.suffix not in (".pyc", ".pyo")
    }


def test_generated_code_is_up_to_date(tmp_path):
    _generate(tmp_path)
    expected = _generated_files(tmp_path)
    actual = _generated_files(GENERATED_DIR)
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    stale = sorted(name for name in set(expected) & set(actual) if expected[name] != actual[name])
    problems = []
    if missing:
        problems.append(f"missing: {missing}")
    if extra:
        problems.append(f"not produced by the generator: {extra}")
    if stale:
        problems.append(f"out of date: {stale}")
    assert not problems, (
        "engine/proto does not match protos/*.proto (" + "; ".join(problems) + f"); {REGENERATE_HINT}"
    )


def test_generation_is_deterministic(tmp_path):
    _generate(tmp_path / "a")
    _generate(tmp_path / "b")
    assert _generated_files(tmp_path / "a") == _generated_files(tmp_path / "b")


def test_generated_modules_use_package_and_private_pool():
    for module in (svc, mc, health_pb2):
        assert module.DESCRIPTOR.pool is _pool.POOL
        assert module.__name__.startswith("engine.proto.")
    assert svc.ModelInferRequest.__module__ == "engine.proto.grpc_service_pb2"
    assert svc_grpc.grpc__service__pb2 is svc
    assert svc.model__config__pb2 is mc
    assert health_pb2_grpc.health__pb2 is health_pb2


# ---------------------------------------------------------------------------
# Descriptor-level compatibility with tritonclient
# ---------------------------------------------------------------------------


def _walk_messages(container):
    """All message descriptors of a file or message, nested ones included."""
    children = (
        container.message_types_by_name.values()
        if hasattr(container, "message_types_by_name")
        else container.nested_types
    )
    for message in children:
        yield message
        yield from _walk_messages(message)


def _walk_enums(file_descriptor):
    yield from file_descriptor.enum_types_by_name.values()
    for message in _walk_messages(file_descriptor):
        yield from message.enum_types


def _full_name(descriptor):
    return descriptor.full_name if descriptor is not None else None


def _field_signature(field):
    return {
        "number": field.number,
        "type": field.type,
        "repeated": field.is_repeated,
        "has_presence": field.has_presence,
        "json_name": field.json_name,
        "message_type": _full_name(field.message_type),
        "enum_type": _full_name(field.enum_type),
        "oneof": field.containing_oneof.name if field.containing_oneof else None,
    }


def _message_signature(message):
    return {
        "file": message.file.name,
        "map_entry": message.GetOptions().map_entry,
        "fields": {f.name: _field_signature(f) for f in message.fields},
        "oneofs": {o.name: sorted(f.name for f in o.fields) for o in message.oneofs},
        "nested_types": sorted(m.name for m in message.nested_types),
        "enum_types": sorted(e.name for e in message.enum_types),
    }


def _enum_signature(enum):
    return {"file": enum.file.name, "values": {v.name: v.number for v in enum.values}}


TRITON_MESSAGES = sorted(m.full_name for theirs, _ in FILE_PAIRS for m in _walk_messages(theirs.DESCRIPTOR))
TRITON_ENUMS = sorted(e.full_name for theirs, _ in FILE_PAIRS for e in _walk_enums(theirs.DESCRIPTOR))


@pytest.mark.parametrize("theirs, ours", FILE_PAIRS, ids=lambda m: m.DESCRIPTOR.name)
def test_same_files_messages_and_enums(theirs, ours):
    assert ours.DESCRIPTOR.name == theirs.DESCRIPTOR.name
    assert ours.DESCRIPTOR.package == theirs.DESCRIPTOR.package == "inference"
    assert [d.name for d in ours.DESCRIPTOR.dependencies] == [d.name for d in theirs.DESCRIPTOR.dependencies]
    assert sorted(m.full_name for m in _walk_messages(ours.DESCRIPTOR)) == sorted(
        m.full_name for m in _walk_messages(theirs.DESCRIPTOR)
    )
    assert sorted(e.full_name for e in _walk_enums(ours.DESCRIPTOR)) == sorted(
        e.full_name for e in _walk_enums(theirs.DESCRIPTOR)
    )


@pytest.mark.parametrize("full_name", TRITON_MESSAGES)
def test_message_matches_tritonclient(full_name):
    theirs = descriptor_pool.Default().FindMessageTypeByName(full_name)
    try:
        ours = _pool.POOL.FindMessageTypeByName(full_name)
    except KeyError:
        pytest.fail(f"message {full_name} is missing from protos/")
    assert _message_signature(ours) == _message_signature(theirs)


@pytest.mark.parametrize("full_name", TRITON_ENUMS)
def test_enum_matches_tritonclient(full_name):
    theirs = descriptor_pool.Default().FindEnumTypeByName(full_name)
    try:
        ours = _pool.POOL.FindEnumTypeByName(full_name)
    except KeyError:
        pytest.fail(f"enum {full_name} is missing from protos/")
    assert _enum_signature(ours) == _enum_signature(theirs)


def _service_signature(service):
    return {
        m.name: {
            "input": m.input_type.full_name,
            "output": m.output_type.full_name,
            "client_streaming": m.client_streaming,
            "server_streaming": m.server_streaming,
        }
        for m in service.methods
    }


def test_service_matches_tritonclient():
    theirs = triton_svc.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    ours = svc.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert ours.full_name == theirs.full_name == "inference.GRPCInferenceService"
    assert _service_signature(ours) == _service_signature(theirs)
    assert _service_signature(ours)["ModelStreamInfer"]["client_streaming"]
    assert _service_signature(ours)["ModelStreamInfer"]["server_streaming"]


def test_health_service_follows_grpc_health_v1():
    health = health_pb2.DESCRIPTOR
    assert health.package == "grpc.health.v1"
    assert _service_signature(health.services_by_name["Health"]) == {
        "Check": {
            "input": "grpc.health.v1.HealthCheckRequest",
            "output": "grpc.health.v1.HealthCheckResponse",
            "client_streaming": False,
            "server_streaming": False,
        },
        "Watch": {
            "input": "grpc.health.v1.HealthCheckRequest",
            "output": "grpc.health.v1.HealthCheckResponse",
            "client_streaming": False,
            "server_streaming": True,
        },
    }
    assert {f.name: (f.number, f.type) for f in health_pb2.HealthCheckRequest.DESCRIPTOR.fields} == {
        "service": (1, 9)  # TYPE_STRING
    }
    status = health_pb2.HealthCheckResponse.DESCRIPTOR.fields_by_name["status"]
    assert status.number == 1
    assert status.enum_type.full_name == "grpc.health.v1.HealthCheckResponse.ServingStatus"
    assert _enum_signature(status.enum_type)["values"] == {
        "UNKNOWN": 0,
        "SERVING": 1,
        "NOT_SERVING": 2,
        "SERVICE_UNKNOWN": 3,
    }


# ---------------------------------------------------------------------------
# Wire round trips
# ---------------------------------------------------------------------------


DIRECTIONS = [(svc, triton_svc), (triton_svc, svc)]
DIRECTION_IDS = ["ours-to-triton", "triton-to-ours"]


def _build_infer_request(module):
    request = module.ModelInferRequest(model_name="resnet", model_version="2", id="req-1")
    request.parameters["sequence_id"].uint64_param = 2**63 + 5
    request.parameters["priority"].int64_param = -3
    request.parameters["note"].string_param = "hello"
    request.parameters["sequence_start"].bool_param = True
    request.parameters["ratio"].double_param = 0.25
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 3])
    tensor.contents.fp32_contents.extend([1.0, 2.5, -3.0])
    tensor.parameters["shared_memory_region"].string_param = "region0"
    text = request.inputs.add(name="TEXT", datatype="BYTES", shape=[2])
    text.contents.bytes_contents.extend([b"a", b"\x00\xff"])
    output = request.outputs.add(name="OUTPUT0")
    output.parameters["classification"].int64_param = 3
    request.raw_input_contents.append(b"\x01\x02\x03\x04")
    return request


def _check_infer_request(request):
    assert (request.model_name, request.model_version, request.id) == ("resnet", "2", "req-1")
    params = request.parameters
    assert params["sequence_id"].WhichOneof("parameter_choice") == "uint64_param"
    assert params["sequence_id"].uint64_param == 2**63 + 5
    assert params["priority"].int64_param == -3
    assert params["note"].string_param == "hello"
    assert params["sequence_start"].bool_param is True
    assert params["ratio"].double_param == 0.25
    assert [t.name for t in request.inputs] == ["INPUT0", "TEXT"]
    tensor = request.inputs[0]
    assert (tensor.datatype, list(tensor.shape)) == ("FP32", [1, 3])
    assert list(tensor.contents.fp32_contents) == [1.0, 2.5, -3.0]
    assert tensor.parameters["shared_memory_region"].string_param == "region0"
    assert list(request.inputs[1].contents.bytes_contents) == [b"a", b"\x00\xff"]
    assert request.outputs[0].name == "OUTPUT0"
    assert request.outputs[0].parameters["classification"].int64_param == 3
    assert list(request.raw_input_contents) == [b"\x01\x02\x03\x04"]


@pytest.mark.parametrize("writer, reader", DIRECTIONS, ids=DIRECTION_IDS)
def test_infer_request_round_trip(writer, reader):
    sent = _build_infer_request(writer)
    data = sent.SerializeToString(deterministic=True)
    received = reader.ModelInferRequest.FromString(data)
    assert type(received).DESCRIPTOR.file is reader.DESCRIPTOR
    _check_infer_request(received)
    assert received.SerializeToString(deterministic=True) == data


@pytest.mark.parametrize("writer, reader", DIRECTIONS, ids=DIRECTION_IDS)
def test_stream_response_round_trip(writer, reader):
    sent = writer.ModelStreamInferResponse(error_message="")
    response = sent.infer_response
    response.model_name = "m"
    response.id = "7"
    response.parameters["triton_final_response"].bool_param = True
    out = response.outputs.add(name="OUT", datatype="INT64", shape=[2])
    out.contents.int64_contents.extend([-1, 2**40])
    response.raw_output_contents.append(b"\xff" * 16)
    data = sent.SerializeToString(deterministic=True)
    received = reader.ModelStreamInferResponse.FromString(data)
    assert received.HasField("infer_response")
    assert received.infer_response.parameters["triton_final_response"].bool_param is True
    assert list(received.infer_response.outputs[0].contents.int64_contents) == [-1, 2**40]
    assert received.SerializeToString(deterministic=True) == data


MODEL_CONFIG_TEXT = """
name: "densenet"
backend: "onnxruntime"
max_batch_size: 8
version_policy { specific { versions: [1, 3] } }
input { name: "x" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [3, -1, -1] }
output { name: "y" data_type: TYPE_BF16 dims: [1000] label_filename: "labels.txt" }
instance_group { kind: KIND_GPU count: 2 gpus: [0, 1] rate_limiter { resources { name: "r" count: 1 } } }
dynamic_batching {
  preferred_batch_size: [4, 8]
  max_queue_delay_microseconds: 100
  priority_levels: 2
  priority_queue_policy { key: 1 value { timeout_action: DELAY max_queue_size: 16 } }
}
optimization {
  cuda { graphs: true graph_spec { batch_size: 4 input { key: "x" value { dim: [3, 224, 224] } } } }
}
parameters { key: "intra_op_thread_count" value { string_value: "4" } }
model_warmup {
  name: "w"
  batch_size: 1
  inputs { key: "x" value { data_type: TYPE_FP32 dims: [3, 8, 8] zero_data: true } }
}
model_transaction_policy { decoupled: true }
response_cache { enable: true }
"""


def test_model_config_round_trip():
    ours = text_format.Parse(MODEL_CONFIG_TEXT, mc.ModelConfig())
    theirs = triton_mc.ModelConfig.FromString(ours.SerializeToString(deterministic=True))
    assert text_format.MessageToString(theirs) == text_format.MessageToString(ours)
    assert theirs.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert theirs.dynamic_batching.priority_queue_policy[1].max_queue_size == 16
    assert theirs.output[0].data_type == triton_mc.TYPE_BF16
    back = mc.ModelConfig.FromString(theirs.SerializeToString(deterministic=True))
    assert back == ours
    response = svc.ModelConfigResponse(config=ours)
    assert triton_svc.ModelConfigResponse.FromString(response.SerializeToString()).config.name == "densenet"


# ---------------------------------------------------------------------------
# Live gRPC: tritonclient's client against a server built on our stubs
# ---------------------------------------------------------------------------


def _echo(request):
    """Answer a request by returning each input as output "ECHO_<name>"."""
    response = svc.ModelInferResponse(model_name=request.model_name, model_version="1", id=request.id)
    response.parameters["echo"].bool_param = True
    for tensor in request.inputs:
        response.outputs.add(name="ECHO_" + tensor.name, datatype=tensor.datatype, shape=tensor.shape)
    response.raw_output_contents.extend(request.raw_input_contents)
    return response


class _EchoInferenceService(svc_grpc.GRPCInferenceServiceServicer):
    def ServerLive(self, request, context):
        return svc.ServerLiveResponse(live=True)

    def ServerReady(self, request, context):
        return svc.ServerReadyResponse(ready=True)

    def ServerMetadata(self, request, context):
        return svc.ServerMetadataResponse(name="hubserve-test", version="0.0", extensions=["statistics"])

    def ModelConfig(self, request, context):
        config = text_format.Parse(MODEL_CONFIG_TEXT, mc.ModelConfig())
        config.name = request.name
        return svc.ModelConfigResponse(config=config)

    def ModelInfer(self, request, context):
        if request.model_name != "echo":
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model '{request.model_name}'")
        return _echo(request)

    def ModelStreamInfer(self, request_iterator, context):
        for request in request_iterator:
            if request.model_name != "echo":
                yield svc.ModelStreamInferResponse(error_message=f"unknown model '{request.model_name}'")
            else:
                yield svc.ModelStreamInferResponse(infer_response=_echo(request))


class _Health(health_pb2_grpc.HealthServicer):
    def Check(self, request, context):
        if request.service not in ("", "inference.GRPCInferenceService"):
            context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    def Watch(self, request, context):
        yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


@pytest.fixture(scope="module")
def server_address():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    svc_grpc.add_GRPCInferenceServiceServicer_to_server(_EchoInferenceService(), server)
    health_pb2_grpc.add_HealthServicer_to_server(_Health(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


@pytest.fixture
def triton_client(server_address):
    client = triton_grpc.InferenceServerClient(url=server_address)
    try:
        yield client
    finally:
        client.close()


def _inputs():
    floats = np.arange(6, dtype=np.float32).reshape(2, 3)
    words = np.array([b"hub", b"", b"serve"], dtype=np.object_)
    x = triton_grpc.InferInput("X", list(floats.shape), "FP32")
    x.set_data_from_numpy(floats)
    s = triton_grpc.InferInput("S", list(words.shape), "BYTES")
    s.set_data_from_numpy(words)
    return [x, s], floats, words


def test_tritonclient_unary_calls(triton_client):
    assert triton_client.is_server_live()
    assert triton_client.is_server_ready()
    metadata = triton_client.get_server_metadata()
    assert (metadata.name, list(metadata.extensions)) == ("hubserve-test", ["statistics"])
    config = triton_client.get_model_config("densenet").config
    assert config.name == "densenet" and config.max_batch_size == 8

    inputs, floats, words = _inputs()
    result = triton_client.infer("echo", inputs, request_id="r1")
    np.testing.assert_array_equal(result.as_numpy("ECHO_X"), floats)
    assert list(result.as_numpy("ECHO_S")) == list(words)
    response = result.get_response()
    assert (response.id, response.parameters["echo"].bool_param) == ("r1", True)

    with pytest.raises(InferenceServerException, match="unknown model"):
        triton_client.infer("nope", inputs)


def test_tritonclient_stream(triton_client):
    results: queue.Queue = queue.Queue()
    triton_client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        inputs, floats, _ = _inputs()
        triton_client.async_stream_infer("echo", inputs, request_id="s1")
        triton_client.async_stream_infer("nope", inputs, request_id="s2")
        first, error = results.get(timeout=10)
        assert error is None
        assert first.get_response().id == "s1"
        np.testing.assert_array_equal(first.as_numpy("ECHO_X"), floats)
        result, error = results.get(timeout=10)
        assert result is None and "unknown model" in str(error)
    finally:
        triton_client.stop_stream()


def test_health_stub(server_address):
    with grpc.insecure_channel(server_address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        serving = health_pb2.HealthCheckResponse.SERVING
        assert stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status == serving
        assert [r.status for r in stub.Watch(health_pb2.HealthCheckRequest(), timeout=10)] == [serving]
        with pytest.raises(grpc.RpcError) as excinfo:
            stub.Check(health_pb2.HealthCheckRequest(service="other"), timeout=10)
        assert excinfo.value.code() == grpc.StatusCode.NOT_FOUND


def test_our_stub_against_our_server(server_address):
    with grpc.insecure_channel(server_address) as channel:
        stub = svc_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerLive(svc.ServerLiveRequest(), timeout=10).live
        request = svc.ModelInferRequest(model_name="echo", id="x")
        request.inputs.add(name="A", datatype="UINT8", shape=[4])
        request.raw_input_contents.append(b"\x00\x01\x02\x03")
        responses = list(stub.ModelStreamInfer(iter([request, request]), timeout=10))
        assert [r.infer_response.outputs[0].name for r in responses] == ["ECHO_A", "ECHO_A"]
        assert responses[0].infer_response.raw_output_contents == [b"\x00\x01\x02\x03"]


# ---------------------------------------------------------------------------
# Coexistence in one process
# ---------------------------------------------------------------------------


def test_coexistence_in_this_process():
    # Both sets are imported at the top of this module.
    assert svc.ModelInferRequest is not triton_svc.ModelInferRequest
    assert svc.DESCRIPTOR.pool is _pool.POOL
    assert triton_svc.DESCRIPTOR.pool is descriptor_pool.Default()
    default = descriptor_pool.Default()
    assert default.FindMessageTypeByName("inference.ModelConfig") is triton_mc.ModelConfig.DESCRIPTOR
    assert _pool.POOL.FindMessageTypeByName("inference.ModelConfig") is mc.ModelConfig.DESCRIPTOR
    with pytest.raises(KeyError):
        default.FindFileByName("health.proto")


COEXIST_SCRIPT = textwrap.dedent(
    """
    import sys
    from google.protobuf import descriptor_pool
    from google.protobuf.internal import api_implementation

    def import_ours():
        global ours, health_pb2, pool
        from engine.proto import grpc_service_pb2 as ours, health_pb2, _pool as pool
        from engine.proto import grpc_service_pb2_grpc, health_pb2_grpc  # noqa: F401

    def import_theirs():
        global theirs
        import tritonclient.grpc  # noqa: F401
        from tritonclient.grpc import service_pb2 as theirs

    if sys.argv[1] == "ours-first":
        import_ours(); import_theirs()
    else:
        import_theirs(); import_ours()

    default = descriptor_pool.Default()
    assert ours.DESCRIPTOR.pool is pool.POOL
    assert default.FindMessageTypeByName("inference.ModelInferRequest") is theirs.ModelInferRequest.DESCRIPTOR
    assert pool.POOL.FindMessageTypeByName("inference.ModelInferRequest") is ours.ModelInferRequest.DESCRIPTOR
    try:
        default.FindMessageTypeByName("grpc.health.v1.HealthCheckRequest")
    except KeyError:
        pass
    else:
        raise AssertionError("our health.proto leaked into the default pool")
    request = ours.ModelInferRequest(model_name="m")
    request.parameters["p"].int64_param = 5
    parsed = theirs.ModelInferRequest.FromString(request.SerializeToString())
    assert parsed.parameters["p"].int64_param == 5
    print("OK", api_implementation.Type())
    """
)


@pytest.mark.parametrize("order", ["ours-first", "triton-first"])
@pytest.mark.parametrize("implementation", ["default", "python"])
def test_coexistence_fresh_process(order, implementation):
    """Import order and protobuf implementation must not matter."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", None)
    if implementation != "default":
        env["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = implementation
    proc = subprocess.run(
        [sys.executable, "-c", COEXIST_SCRIPT, order], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("OK")
    if implementation == "python":
        assert proc.stdout.split() == ["OK", "python"]
