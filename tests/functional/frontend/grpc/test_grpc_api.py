"""Every KServe v2 gRPC RPC, driven by Triton's own `tritonclient.grpc` (and its asyncio client) against a
real server process, plus the standard `grpc.health.v1` check spoken with hand-encoded protobuf bytes.

This file imports `tritonclient.grpc` and none of our generated modules: both define the protobuf package
`inference`.
"""

from __future__ import annotations

import asyncio
import queue
import threading

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpcclient
from tritonclient.utils import InferenceServerException

IDENTITY_DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                      "FP16", "FP32", "FP64", "BYTES")


@pytest.fixture(scope="module")
def client(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        yield c


# --------------------------------------------------------------------------------------------- helpers

def simple_data(batch: int = 1, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    return a, b


def simple_inputs(a: np.ndarray, b: np.ndarray) -> list:
    inputs = []
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        tensor = grpcclient.InferInput(name, list(arr.shape), "INT32")
        tensor.set_data_from_numpy(arr)
        inputs.append(tensor)
    return inputs


def identity_values(datatype: str) -> np.ndarray:
    if datatype == "BOOL":
        return np.array([[True, False, True, True], [False, False, True, False]])
    if datatype == "BYTES":
        return np.array([[b"", b"a", "\u00e9t\u00e9".encode(), "\u65e5\u672c".encode()],
                         [b"x" * 100, b"with space", b"\xf0\x9f\x99\x82", b"0"]], dtype=object)
    floats = {"FP16": "float16", "FP32": "float32", "FP64": "float64"}
    dtype = np.dtype(floats.get(datatype, datatype.lower()))
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array([[info.min, info.max, 0, 1], [info.max - 1, info.min + 1, 7, 42]], dtype=dtype)
    info = np.finfo(dtype)
    return np.array([[info.min, info.max, info.tiny, -0.0], [1.5, -2.25, info.eps, 3.0]], dtype=dtype)


def same_tensor(got: np.ndarray, want: np.ndarray) -> bool:
    if want.dtype == object:
        # JSON BYTES come back as str, binary ones as bytes
        flat = [x.encode("utf-8") if isinstance(x, str) else bytes(x) for x in got.reshape(-1)]
        return got.shape == want.shape and flat == list(want.reshape(-1))
    return got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


def encode_health_request(service: str) -> bytes:
    """grpc.health.v1.HealthCheckRequest: field 1 (string service), wire type 2."""
    data = service.encode()
    assert len(data) < 128  # one-byte varint length
    return b"\x0a" + bytes([len(data)]) + data if data else b""


def decode_health_status(payload: bytes) -> int:
    """grpc.health.v1.HealthCheckResponse: field 1 (enum status), wire type 0; absent means UNKNOWN (0)."""
    status, i = 0, 0
    while i < len(payload):
        key = payload[i]
        i += 1
        assert key & 7 == 0, f"unexpected wire type in {payload!r}"
        value, shift = 0, 0
        while True:
            byte = payload[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if key >> 3 == 1:
            status = value
    return status


# ------------------------------------------------------------------------------------------ health & metadata

def test_server_live_and_ready(client):
    assert client.is_server_live() is True
    assert client.is_server_ready() is True


def test_grpc_health_check(server):
    with grpc.insecure_channel(server.grpc_url) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda b: b, response_deserializer=lambda b: b)
        assert decode_health_status(check(encode_health_request(""), timeout=10)) == 1  # SERVING
        assert decode_health_status(check(encode_health_request("simple"), timeout=10)) == 1
        assert decode_health_status(check(encode_health_request("broken"), timeout=10)) == 2  # NOT_SERVING
        with pytest.raises(grpc.RpcError) as e:  # the health protocol: an unknown service is NOT_FOUND
            check(encode_health_request("no_such_model"), timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_server_metadata(client):
    meta = client.get_server_metadata()
    assert meta.name == "hubserve" and meta.version
    for extension in ("binary_tensor_data", "statistics", "model_repository", "model_configuration"):
        assert extension in meta.extensions
    assert client.get_server_metadata(as_json=True)["name"] == "hubserve"


def test_model_ready(client):
    assert client.is_model_ready("simple") is True
    assert client.is_model_ready("simple", "1") is True
    assert client.is_model_ready("simple", "2") is False
    assert client.is_model_ready("broken") is False
    assert client.is_model_ready("no_such_model") is False


def test_model_metadata(client):
    meta = client.get_model_metadata("simple")
    assert meta.name == "simple" and list(meta.versions) == ["1"]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("INPUT0", "INT32", [-1, 16]), ("INPUT1", "INT32", [-1, 16])]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [
        ("OUTPUT0", "INT32", [-1, 16]), ("OUTPUT1", "INT32", [-1, 16])]
    as_json = client.get_model_metadata("mlp", "1", as_json=True)
    assert as_json["inputs"][0]["shape"][0] in (-1, "-1")  # int64 shapes are strings in MessageToJson
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("no_such_model")
    assert e.value.status() == "StatusCode.NOT_FOUND" and "no_such_model" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("broken")
    assert e.value.status() == "StatusCode.UNAVAILABLE"


def test_model_config(client):
    config = client.get_model_config("simple").config
    assert config.name == "simple" and config.max_batch_size == 8
    assert [i.name for i in config.input] == ["INPUT0", "INPUT1"]
    assert list(config.input[0].dims) == [16]
    assert config.HasField("dynamic_batching")
    as_json = client.get_model_config("simple", as_json=True)["config"]
    assert as_json["max_batch_size"] == 8 and isinstance(as_json["max_batch_size"], int)
    assert "dynamic_batching" in as_json
    assert [i["name"] for i in as_json["input"]] == ["INPUT0", "INPUT1"]
    assert as_json["input"][0]["data_type"] == "TYPE_INT32"
    strings = client.get_model_config("strings", as_json=True)["config"]
    assert strings["name"] == "strings" and strings["backend"] == "onnxruntime"
    assert [(i["name"], i["data_type"]) for i in strings["input"]] == [("TEXT", "TYPE_STRING")]
    assert sorted(o["name"] for o in strings["output"]) == ["ECHO", "UPPER"]
    with pytest.raises(InferenceServerException) as e:
        client.get_model_config("no_such_model")
    assert e.value.status() == "StatusCode.NOT_FOUND"


# ------------------------------------------------------------------------------------ statistics & repository

def test_statistics_grow_with_inference(client):
    before = client.get_inference_statistics("simple").model_stats
    assert [(s.name, s.version) for s in before] == [("simple", "1")]
    a, b = simple_data(2, seed=8)
    for _ in range(3):
        client.infer("simple", simple_inputs(a, b))
    after = client.get_inference_statistics("simple", "1").model_stats[0]
    s0 = before[0]
    assert after.inference_stats.success.count >= s0.inference_stats.success.count + 3
    assert after.inference_stats.success.ns > s0.inference_stats.success.ns
    assert after.inference_stats.queue.count >= s0.inference_stats.queue.count + 3
    assert after.inference_stats.compute_infer.count >= s0.inference_stats.compute_infer.count + 3
    assert after.inference_count >= s0.inference_count + 6
    assert after.execution_count > s0.execution_count
    assert after.last_inference > 0
    assert after.batch_stats and all(1 <= b.batch_size <= 8 for b in after.batch_stats)
    as_json = client.get_inference_statistics("simple", as_json=True)["model_stats"][0]
    assert int(as_json["inference_count"]) >= after.inference_count  # uint64 is a string in protobuf JSON
    names = {s.name for s in client.get_inference_statistics().model_stats}
    assert {"simple", "mlp", "strings"} <= names and "broken" not in names
    with pytest.raises(InferenceServerException) as e:
        client.get_inference_statistics("no_such_model")
    assert e.value.status() == "StatusCode.NOT_FOUND"


def test_repository_index(client):
    rows = {m.name: m for m in client.get_model_repository_index().models}
    expected = {"simple", "mlp", "strings", "broken"} | {f"identity_{d.lower()}" for d in IDENTITY_DATATYPES}
    assert expected <= set(rows)
    assert rows["simple"].state == "READY" and rows["simple"].version == "1"
    assert rows["broken"].state == "UNAVAILABLE" and rows["broken"].reason
    as_json = client.get_model_repository_index(as_json=True)
    assert any(m["name"] == "strings" and m["state"] == "READY" for m in as_json["models"])


# --------------------------------------------------------------------------------------------- inference

def test_infer_simple(client):
    a, b = simple_data(1, seed=11)
    result = client.infer("simple", simple_inputs(a, b), request_id="g-1")
    response = result.get_response()
    assert response.model_name == "simple" and response.model_version == "1" and response.id == "g-1"
    assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert len(response.raw_output_contents) == 2  # raw contents, one per output, in order
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_infer_requested_output_subset_and_batch(client):
    a, b = simple_data(3, seed=12)
    result = client.infer("simple", simple_inputs(a, b), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")],
                          model_version="1")
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT0") is None
    assert result.as_numpy("OUTPUT1").shape == (3, 16)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_infer_errors(client):
    a, b = simple_data(1)
    bad = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    bad.set_data_from_numpy(a.astype(np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("simple", [bad, simple_inputs(a, b)[1]])
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "INT32" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.infer("no_such_model", simple_inputs(a, b))
    assert e.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as e:
        client.infer("simple", simple_inputs(a, b), model_version="7")
    assert e.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as e:
        client.infer("broken", simple_inputs(a, b))
    assert e.value.status() == "StatusCode.UNAVAILABLE"


def test_mlp_matches_onnxruntime(client, server):
    session = ort.InferenceSession(str(server.repository / "mlp" / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    x = np.random.default_rng(6).standard_normal((3, 256), dtype=np.float32)
    (expected,) = session.run(None, {session.get_inputs()[0].name: x})
    tensor = grpcclient.InferInput("INPUT0", [3, 256], "FP32")
    tensor.set_data_from_numpy(x)
    got = client.infer("mlp", [tensor]).as_numpy("OUTPUT0")
    assert got.shape == (3, 256) and got.dtype == np.float32
    assert np.allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_strings_utf8_and_empty(client):
    words = ["hello", "", "caf\u00e9", "\u65e5\u672c\u8a9e", "MiXeD 123"]
    text = np.array([w.encode("utf-8") for w in words], dtype=object)
    tensor = grpcclient.InferInput("TEXT", [len(words)], "BYTES")
    tensor.set_data_from_numpy(text)
    result = client.infer("strings", [tensor])
    assert [bytes(x) for x in result.as_numpy("ECHO").reshape(-1)] == list(text)
    upper = [bytes(x).decode("utf-8") for x in result.as_numpy("UPPER").reshape(-1)]
    assert upper[0] == "HELLO" and upper[1] == "" and upper[4] == "MIXED 123"
    assert upper[2] == "CAF\u00c9" and upper[3] == "\u65e5\u672c\u8a9e"


@pytest.mark.parametrize("datatype", IDENTITY_DATATYPES)
def test_identity_round_trips_exactly(client, datatype):
    values = identity_values(datatype)
    tensor = grpcclient.InferInput("INPUT0", list(values.shape), datatype)
    tensor.set_data_from_numpy(values)
    result = client.infer(f"identity_{datatype.lower()}", [tensor])
    out = result.get_output("OUTPUT0")
    assert out.datatype == datatype and list(out.shape) == [2, 4]
    assert same_tensor(result.as_numpy("OUTPUT0"), values)


def test_fp32_nan_inf_denormals_pass_through(client):
    bits = np.array([0x7FC00000, 0x7F800000, 0xFF800000, 0x00000001,
                     0x807FFFFF, 0x7FC00001, 0x7F7FFFFF, 0x80000000], dtype=np.uint32)
    values = bits.view(np.float32).reshape(2, 4)
    tensor = grpcclient.InferInput("INPUT0", [2, 4], "FP32")
    tensor.set_data_from_numpy(values)
    got = client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0")
    assert got.view(np.uint32).reshape(-1).tolist() == bits.tolist()


# -------------------------------------------------------------------------------- callbacks, streams, asyncio

def test_async_infer_callback(client):
    done: queue.Queue = queue.Queue()
    data = [simple_data(1 + i % 2, seed=300 + i) for i in range(6)]
    for i, (a, b) in enumerate(data):
        client.async_infer("simple", simple_inputs(a, b), request_id=f"cb{i}",
                           callback=lambda result, error, i=i: done.put((i, result, error)))
    seen = set()
    for _ in data:
        i, result, error = done.get(timeout=30)
        assert error is None, error
        a, b = data[i]
        assert result.get_response().id == f"cb{i}"
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        seen.add(i)
    assert seen == set(range(len(data)))


def test_stream_infer(server):
    results: queue.Queue = queue.Queue()
    data = [simple_data(1 + i % 3, seed=400 + i) for i in range(8)]
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        c.start_stream(callback=lambda result, error: results.put((result, error)))
        try:
            for i, (a, b) in enumerate(data):
                c.async_stream_infer("simple", simple_inputs(a, b), request_id=f"s{i}")
            # One bad request on the same stream: its error comes back on the stream, which stays open.
            c.async_stream_infer("no_such_model", simple_inputs(*data[0]), request_id="bad")
            got = [results.get(timeout=30) for _ in range(len(data) + 1)]
        finally:
            c.stop_stream()
    errors = [e for r, e in got if e is not None]
    assert len(errors) == 1 and "no_such_model" in errors[0].message()
    by_id = {r.get_response().id: r for r, e in got if e is None}
    assert set(by_id) == {f"s{i}" for i in range(len(data))}
    for i, (a, b) in enumerate(data):
        np.testing.assert_array_equal(by_id[f"s{i}"].as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(by_id[f"s{i}"].as_numpy("OUTPUT1"), a - b)


def test_aio_client_concurrent_infers(server):
    async def run() -> None:
        async with aiogrpcclient.InferenceServerClient(server.grpc_url) as c:
            assert await c.is_server_live()
            assert await c.is_model_ready("simple")
            assert (await c.get_model_metadata("simple")).name == "simple"
            assert (await c.get_model_config("simple")).config.max_batch_size == 8
            data = [simple_data(1 + i % 4, seed=500 + i) for i in range(16)]
            results = await asyncio.gather(*(
                c.infer("simple", simple_inputs(a, b), request_id=str(i)) for i, (a, b) in enumerate(data)))
            for i, ((a, b), result) in enumerate(zip(data, results, strict=True)):
                assert result.get_response().id == str(i)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)

            async def requests():
                for i, (a, b) in enumerate(data[:4]):
                    yield {"model_name": "simple", "inputs": simple_inputs(a, b), "request_id": f"st{i}"}

            streamed = {}
            async for result, error in c.stream_infer(requests()):
                assert error is None, error
                streamed[result.get_response().id] = result
                if len(streamed) == 4:
                    break
            for i, (a, b) in enumerate(data[:4]):
                np.testing.assert_array_equal(streamed[f"st{i}"].as_numpy("OUTPUT0"), a + b)

    asyncio.run(run())


def test_concurrent_sync_clients_from_threads(server):
    errors: list = []

    def worker(k: int) -> None:
        try:
            with grpcclient.InferenceServerClient(server.grpc_url) as c:
                for j in range(5):
                    a, b = simple_data(1 + (k + j) % 4, seed=600 + 10 * k + j)
                    r = c.infer("simple", simple_inputs(a, b))
                    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
        except Exception as e:  # surfaced below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
