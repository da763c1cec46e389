"""Every KServe v2 HTTP endpoint, driven by Triton's own `tritonclient.http` (and its asyncio client)
against a real server process; the values are checked, not only the status.
"""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import math
import re
import socket
import zlib

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from tritonclient.utils import InferenceServerException

IDENTITY_DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                      "FP16", "FP32", "FP64", "BYTES")


@pytest.fixture(scope="module")
def client(server):
    with httpclient.InferenceServerClient(server.http_url, network_timeout=30.0) as c:
        yield c


# --------------------------------------------------------------------------------------------- helpers

def simple_data(batch: int = 1, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    return a, b


def simple_inputs(a: np.ndarray, b: np.ndarray, binary: bool = True, module=httpclient) -> list:
    inputs = []
    for name, arr in (("INPUT0", a), ("INPUT1", b)):
        tensor = module.InferInput(name, list(arr.shape), "INT32")
        tensor.set_data_from_numpy(arr, binary_data=binary)
        inputs.append(tensor)
    return inputs


def identity_values(datatype: str) -> np.ndarray:
    """Two rows of four values per datatype, including each type's extremes."""
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


def bytes_list(arr: np.ndarray) -> list[bytes]:
    """BYTES elements as bytes: tritonclient gives str for JSON outputs and bytes for binary ones."""
    return [x.encode("utf-8") if isinstance(x, str) else bytes(x) for x in arr.reshape(-1)]


def same_tensor(got: np.ndarray, want: np.ndarray) -> bool:
    if want.dtype == object:
        return got.shape == want.shape and bytes_list(got) == list(want.reshape(-1))
    return got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


def metric(server, name: str, model: str, version: str = "1") -> float:
    return server.metric(name, model, version)


# ------------------------------------------------------------------------------------------ health & metadata

def test_server_live_and_ready(client):
    assert client.is_server_live() is True
    assert client.is_server_ready() is True


def test_server_metadata(client):
    meta = client.get_server_metadata()
    assert meta["name"] == "hubserve"
    assert isinstance(meta["version"], str) and meta["version"]
    for extension in ("binary_tensor_data", "statistics", "model_repository", "model_configuration"):
        assert extension in meta["extensions"]


def test_model_ready(client):
    assert client.is_model_ready("simple") is True
    assert client.is_model_ready("simple", "1") is True
    assert client.is_model_ready("simple", "2") is False
    assert client.is_model_ready("broken") is False
    assert client.is_model_ready("no_such_model") is False


def test_model_metadata_batching_shapes(client):
    meta = client.get_model_metadata("simple")
    assert meta["name"] == "simple"
    assert meta["versions"] == ["1"]
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("INPUT0", "INT32", [-1, 16]), ("INPUT1", "INT32", [-1, 16])]
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["outputs"]] == [
        ("OUTPUT0", "INT32", [-1, 16]), ("OUTPUT1", "INT32", [-1, 16])]
    versioned = client.get_model_metadata("simple", "1")
    assert versioned["name"] == "simple" and versioned["inputs"] == meta["inputs"]
    mlp = client.get_model_metadata("mlp")
    assert mlp["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 256]}]
    assert mlp["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 256]}]


def test_model_metadata_errors(client):
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("no_such_model")
    assert e.value.status() == "404" and "no_such_model" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("broken")
    assert e.value.status() == "503" and "broken" in e.value.message()


def test_model_config_simple(client):
    config = client.get_model_config("simple")
    assert config["name"] == "simple"
    assert config["max_batch_size"] == 8 and isinstance(config["max_batch_size"], int)
    assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
    assert [o["name"] for o in config["output"]] == ["OUTPUT0", "OUTPUT1"]
    assert config["input"][0]["data_type"] == "TYPE_INT32"
    assert config["input"][0]["dims"] == [16]
    assert "dynamic_batching" in config
    assert client.get_model_config("simple", "1")["name"] == "simple"


def test_model_config_yaml_and_autocompleted(client):
    mlp = client.get_model_config("mlp")
    assert mlp["name"] == "mlp" and isinstance(mlp["max_batch_size"], int) and mlp["max_batch_size"] > 0
    assert [(i["name"], i["data_type"], i["dims"]) for i in mlp["input"]] == [("INPUT0", "TYPE_FP32", [256])]
    # `strings` has no config file: everything below came from the ONNX model.
    strings = client.get_model_config("strings")
    assert strings["name"] == "strings"
    assert strings["max_batch_size"] == 0  # TEXT is 1-D: nothing but a batch dim, so it is served unbatched
    assert strings["input"][0]["dims"] == [-1]
    assert strings["backend"] == "onnxruntime"
    assert [(i["name"], i["data_type"]) for i in strings["input"]] == [("TEXT", "TYPE_STRING")]
    assert sorted(o["name"] for o in strings["output"]) == ["ECHO", "UPPER"]
    assert all(o["data_type"] == "TYPE_STRING" for o in strings["output"])
    assert strings["instance_group"] and strings["instance_group"][0]["count"] >= 1


def test_model_config_errors(client):
    with pytest.raises(InferenceServerException) as e:
        client.get_model_config("no_such_model")
    assert e.value.status() == "404"


# ------------------------------------------------------------------------------------ statistics & repository

def test_statistics_grow_with_inference(client):
    before = client.get_inference_statistics("simple")["model_stats"]
    assert [(s["name"], s["version"]) for s in before] == [("simple", "1")]
    a, b = simple_data(2, seed=7)
    for _ in range(3):
        client.infer("simple", simple_inputs(a, b))
    after = client.get_inference_statistics("simple", "1")["model_stats"][0]
    s0 = before[0]
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output", "fail",
                "cache_hit", "cache_miss"):
        for field in ("count", "ns"):
            assert isinstance(after["inference_stats"][key][field], int), (key, field)
    assert after["inference_stats"]["success"]["count"] >= s0["inference_stats"]["success"]["count"] + 3
    assert after["inference_stats"]["success"]["ns"] > s0["inference_stats"]["success"]["ns"]
    assert after["inference_stats"]["queue"]["count"] >= s0["inference_stats"]["queue"]["count"] + 3
    assert after["inference_count"] >= s0["inference_count"] + 6  # three requests of batch 2
    assert after["execution_count"] > s0["execution_count"]
    assert isinstance(after["inference_count"], int) and isinstance(after["execution_count"], int)
    assert after["last_inference"] > 0
    sizes = {b["batch_size"]: b for b in after["batch_stats"]}
    assert sizes and all(1 <= size <= 8 for size in sizes)
    assert sum(b["compute_infer"]["count"] for b in sizes.values()) == after["execution_count"]


def test_failures_are_counted(client, server):
    def fail_count() -> int:
        return client.get_inference_statistics("simple")["model_stats"][0]["inference_stats"]["fail"]["count"]

    fail_before = fail_count()
    metric_before = metric(server, "nv_inference_request_failure", "simple")
    a, b = simple_data(1)
    with pytest.raises(InferenceServerException):
        client.infer("simple", [simple_inputs(a, b)[0]])  # INPUT1 missing
    assert fail_count() == fail_before + 1
    assert metric(server, "nv_inference_request_failure", "simple") == metric_before + 1


def test_statistics_all_models_and_errors(client):
    names = {s["name"] for s in client.get_inference_statistics()["model_stats"]}
    assert {"simple", "mlp", "strings", "identity_fp32"} <= names
    assert "broken" not in names
    with pytest.raises(InferenceServerException) as e:
        client.get_inference_statistics("no_such_model")
    assert e.value.status() == "404"


def test_repository_index(client):
    index = client.get_model_repository_index()
    rows = {row["name"]: row for row in index}
    expected = {"simple", "mlp", "strings", "broken"} | {f"identity_{d.lower()}" for d in IDENTITY_DATATYPES}
    assert expected <= set(rows)
    assert rows["simple"]["state"] == "READY" and rows["simple"]["version"] == "1"
    assert rows["mlp"]["state"] == "READY"
    assert rows["broken"]["state"] == "UNAVAILABLE"
    assert "ONNX" in rows["broken"]["reason"] or "model.onnx" in rows["broken"]["reason"], rows["broken"]


# --------------------------------------------------------------------------------------------- inference

@pytest.mark.parametrize("binary_in", [True, False], ids=["bin-in", "json-in"])
@pytest.mark.parametrize("binary_out", [True, False], ids=["bin-out", "json-out"])
def test_infer_simple(client, binary_in, binary_out):
    a, b = simple_data(1, seed=1)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary_out) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer("simple", simple_inputs(a, b, binary_in), outputs=outputs)
    response = result.get_response()
    assert response["model_name"] == "simple" and response["model_version"] == "1"
    for out in response["outputs"]:
        assert out["datatype"] == "INT32" and out["shape"] == [1, 16]
        assert ("data" in out) is (not binary_out)
        if binary_out:
            assert out["parameters"]["binary_data_size"] == 64
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0").dtype == np.int32


def test_infer_mixed_binary_and_json_outputs(client):
    a, b = simple_data(2, seed=9)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=False),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=True)]
    result = client.infer("simple", simple_inputs(a, b), outputs=outputs)
    by_name = {o["name"]: o for o in result.get_response()["outputs"]}
    assert by_name["OUTPUT0"]["data"] == (a + b).reshape(-1).tolist()
    assert by_name["OUTPUT1"]["parameters"]["binary_data_size"] == 2 * 16 * 4
    assert "data" not in by_name["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_infer_default_outputs(client):
    a, b = simple_data(1, seed=2)
    result = client.infer("simple", simple_inputs(a, b))  # tritonclient asks binary_data_output: true
    assert all(o["parameters"]["binary_data_size"] == 64 for o in result.get_response()["outputs"])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_infer_requested_output_subset(client):
    a, b = simple_data(1, seed=3)
    result = client.infer("simple", simple_inputs(a, b), outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    assert result.get_output("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_request_id_echoed(client):
    a, b = simple_data(1)
    result = client.infer("simple", simple_inputs(a, b), request_id="req-\u00e9-42")
    assert result.get_response()["id"] == "req-\u00e9-42"
    result = client.infer("simple", simple_inputs(a, b), model_version="1", request_id="second")
    assert result.get_response()["id"] == "second"


def test_batch_of_three(client):
    a, b = simple_data(3, seed=4)
    result = client.infer("simple", simple_inputs(a, b))
    assert result.as_numpy("OUTPUT0").shape == (3, 16)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_infer_errors(client):
    a, b = simple_data(1)
    bad = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    bad.set_data_from_numpy(a.astype(np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("simple", [bad, simple_inputs(a, b)[1]])
    assert e.value.status() == "400" and "INPUT0" in e.value.message() and "INT32" in e.value.message()
    a9, b9 = simple_data(9)
    with pytest.raises(InferenceServerException) as e:
        client.infer("simple", simple_inputs(a9, b9))
    assert e.value.status() == "400" and "max_batch_size" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.infer("simple", simple_inputs(a, b), outputs=[httpclient.InferRequestedOutput("NOPE")])
    assert e.value.status() == "400" and "NOPE" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.infer("no_such_model", simple_inputs(a, b))
    assert e.value.status() == "404"
    with pytest.raises(InferenceServerException) as e:
        client.infer("simple", simple_inputs(a, b), model_version="7")
    assert e.value.status() == "404" and "7" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.infer("broken", simple_inputs(a, b))
    assert e.value.status() == "503"
    # The server still serves after rejecting those.
    np.testing.assert_array_equal(client.infer("simple", simple_inputs(a, b)).as_numpy("OUTPUT0"), a + b)


def test_mlp_matches_onnxruntime(client, server):
    session = ort.InferenceSession(str(server.repository / "mlp" / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    x = np.random.default_rng(5).standard_normal((4, 256), dtype=np.float32)
    (expected,) = session.run(None, {session.get_inputs()[0].name: x})
    tensor = httpclient.InferInput("INPUT0", [4, 256], "FP32")
    tensor.set_data_from_numpy(x)
    got = client.infer("mlp", [tensor]).as_numpy("OUTPUT0")
    assert got.shape == (4, 256) and got.dtype == np.float32
    assert np.allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_strings_utf8_and_empty(client, server, binary):
    words = ["hello", "", "caf\u00e9 na\u00efve", "\u65e5\u672c\u8a9e", "MiXeD 123", "\U0001F600 ok"]
    text = np.array([w.encode("utf-8") for w in words], dtype=object)
    tensor = httpclient.InferInput("TEXT", [len(words)], "BYTES")
    tensor.set_data_from_numpy(text, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("UPPER", "ECHO")]
    result = client.infer("strings", [tensor], outputs=outputs)
    echo = bytes_list(result.as_numpy("ECHO"))
    upper = [x.decode("utf-8") for x in bytes_list(result.as_numpy("UPPER"))]
    assert echo == list(text)
    session = ort.InferenceSession(str(server.repository / "strings" / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    reference = dict(zip([o.name for o in session.get_outputs()],
                         session.run(None, {"TEXT": np.array(words, dtype=object)}), strict=True))
    assert upper == [str(s) for s in reference["UPPER"].reshape(-1)]
    assert upper[0] == "HELLO" and upper[1] == "" and upper[4] == "MIXED 123"


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("datatype", IDENTITY_DATATYPES)
def test_identity_round_trips_exactly(client, datatype, binary):
    values = identity_values(datatype)
    tensor = httpclient.InferInput("INPUT0", list(values.shape), datatype)
    tensor.set_data_from_numpy(values, binary_data=binary)
    result = client.infer(f"identity_{datatype.lower()}", [tensor],
                          outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)])
    out = result.get_response()["outputs"][0]
    assert out["datatype"] == datatype and out["shape"] == [2, 4]
    got = result.as_numpy("OUTPUT0")
    assert same_tensor(got, values), (got, values)


def test_fp32_nan_inf_denormals_pass_through(client):
    specials = np.array([[np.nan, np.inf, -np.inf, 1e-45], [-1e-45, 1.1754942e-38, 3.4028235e38, -0.0]],
                        dtype=np.float32)
    # NaNs with payloads, the smallest denormal and the largest negative denormal
    payload = np.array([0x7FC00001, 0xFFBADBAD, 0x00000001, 0x807FFFFF], dtype=np.uint32).view(np.float32)
    values = np.concatenate([specials, payload.reshape(1, 4)])
    tensor = httpclient.InferInput("INPUT0", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values, binary_data=True)
    got = client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0")
    assert got.tobytes() == values.tobytes()
    assert math.isnan(got[0, 0]) and got[0, 1] == np.inf and got[1, 0] != 0


# --------------------------------------------------------------------------------------------- asyncio client

def test_async_client_concurrent_infers(server):
    async def run() -> None:
        async with aiohttpclient.InferenceServerClient(server.http_url) as c:
            assert await c.is_server_live()
            assert await c.is_model_ready("simple")
            assert (await c.get_server_metadata())["name"] == "hubserve"
            assert (await c.get_model_metadata("simple"))["versions"] == ["1"]
            data = [simple_data(1 + i % 3, seed=100 + i) for i in range(16)]
            results = await asyncio.gather(*(
                c.infer("simple", simple_inputs(a, b, module=aiohttpclient), request_id=str(i))
                for i, (a, b) in enumerate(data)))
            for i, ((a, b), result) in enumerate(zip(data, results, strict=True)):
                assert result.get_response()["id"] == str(i)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
            stats = await c.get_inference_statistics("simple")
            assert stats["model_stats"][0]["inference_stats"]["success"]["count"] >= 16

    asyncio.run(run())


def test_sync_client_async_infer(server):
    with httpclient.InferenceServerClient(server.http_url, concurrency=4) as c:
        data = [simple_data(2, seed=200 + i) for i in range(8)]
        pending = [c.async_infer("simple", simple_inputs(a, b), request_id=f"a{i}")
                   for i, (a, b) in enumerate(data)]
        for i, ((a, b), p) in enumerate(zip(data, pending, strict=True)):
            result = p.get_result(timeout=30)
            assert result.get_response()["id"] == f"a{i}"
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


# --------------------------------------------------------------------------------------------- metrics

def test_prometheus_metrics_grow(client, server):
    before = metric(server, "nv_inference_request_success", "simple")
    count_before = metric(server, "nv_inference_count", "simple")
    a, b = simple_data(2)
    for _ in range(2):
        client.infer("simple", simple_inputs(a, b))
    assert metric(server, "nv_inference_request_success", "simple") >= before + 2
    assert metric(server, "nv_inference_count", "simple") >= count_before + 4
    assert metric(server, "nv_inference_request_success", "mlp") >= 0


# ------------------------------------------------------------------------------------------- compression

SIMPLE_JSON = json.dumps({"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16],
                                      "data": list(range(16))} for n in ("INPUT0", "INPUT1")]}).encode()


def post_infer(server, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        conn.request("POST", "/v2/models/simple/infer", body=body, headers=headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_body_and_response_on_the_wire(server, encoding):
    body = gzip.compress(SIMPLE_JSON) if encoding == "gzip" else zlib.compress(SIMPLE_JSON)
    status, headers, payload = post_infer(server, body, {"Content-Encoding": encoding,
                                                         "Accept-Encoding": f"br;q=1, {encoding};q=0.5"})
    assert status == 200 and headers["content-encoding"] == encoding
    doc = json.loads(gzip.decompress(payload) if encoding == "gzip" else zlib.decompress(payload))
    assert doc["outputs"][0]["data"] == list(range(0, 32, 2))
    status, headers, payload = post_infer(server, SIMPLE_JSON, {"Accept-Encoding": "identity"})
    assert status == 200 and "content-encoding" not in headers and json.loads(payload)["outputs"]


@pytest.mark.parametrize("body, encoding, code", [
    (b"not gzip at all", "gzip", 400), (gzip.compress(SIMPLE_JSON)[:-10], "gzip", 400),
    (SIMPLE_JSON, "br", 415),
], ids=["corrupt", "truncated", "unsupported"])
def test_bad_compressed_bodies(server, body, encoding, code):
    status, _, payload = post_infer(server, body, {"Content-Encoding": encoding})
    assert status == code and json.loads(payload)["error"], payload


def test_decompression_bomb_is_413_without_inflating(server):
    deflater = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = b"".join(deflater.compress(bytes(1 << 20)) for _ in range(512)) + deflater.flush()  # 512 MiB
    before = server.rss_bytes()
    for _ in range(3):
        status, _, payload = post_infer(server, bomb, {"Content-Encoding": "gzip"})
        assert status == 413 and "larger than max" in json.loads(payload)["error"]
    assert server.rss_bytes() - before < 256 << 20  # the limit is 64 MiB, the bomb 512
    assert post_infer(server, SIMPLE_JSON, {})[0] == 200  # and the server serves on


@pytest.mark.parametrize("path", ["/v2/health/ready", "/v2", "/v2/models/simple/config", "/v1/models",
                                  "/metrics"])
def test_head_answers_a_gets_head_without_its_body(server, path: str):
    """RFC 9110 9.3.2: HEAD's answer is GET's head (its Content-Length included) with no body. With a body,
    a client that sends HEAD then GET on one connection (aiperf does, for /metrics) reads the HEAD's body as
    the GET's status line. Both requests go in one write; the answers must be HEAD's head, then at once GET's
    whole answer, then the close the GET asked for."""
    request = f"{{}} {path} HTTP/1.1\r\nHost: x\r\n"
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=60) as sock:
        sock.sendall((request.format("HEAD") + "\r\n" + request.format("GET") + "Connection: close\r\n\r\n")
                     .encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    length = int(re.search(rb"(?i)\r\ncontent-length: (\d+)", head).group(1))
    assert rest.startswith(b"HTTP/1.1 200 "), rest[:80]  # nothing of the HEAD's answer before the GET's
    get_head, _, body = rest.partition(b"\r\n\r\n")
    assert int(re.search(rb"(?i)\r\ncontent-length: (\d+)", get_head).group(1)) == len(body)
    if path != "/metrics":  # a scrape's counters move between the two
        assert len(body) == length
