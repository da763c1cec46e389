"""The system shared memory extension (engine/shm/client.py, engine/shm/requests.py) against a real server
started with --allow-client-shm, through tritonclient's own `tritonclient.utils.shared_memory` helpers over
both protocols: inputs and outputs in regions (at offsets, BYTES too), every error in Triton's words and
codes, CUDA shared memory's protocol on a machine without a device, the extension off by default, regions
truncated or removed by the client under the server, the registry shared by the frontends of --workers 2,
and perf_analyzer `--shared-memory system`.

Region keys carry this process's id, so parallel runs on one machine never meet in /dev/shm; every region a
test creates is destroyed (unlinked) when it ends.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import (
    InferenceServerException,
    deserialize_bytes_tensor,
    serialize_byte_tensor,
    serialized_byte_size,
)

from conftest import start_server
from hubserve_harness.perf_analyzer import perf_analyzer_available, run_perf_analyzer_settled

FLAG = "--allow-client-shm"


@pytest.fixture(scope="module")
def shm_server(repository, tmp_path_factory):
    srv = start_server(repository, tmp_path_factory.mktemp("shm") / "server.log", "--no-strict-readiness",
                       "--model-control-mode", "none", FLAG)
    yield srv
    srv.stop()


def make_client(module, server):
    c = module.InferenceServerClient(server.http_url if module is httpclient else server.grpc_url)
    c.module = module
    return c


@pytest.fixture(params=[httpclient, grpcclient], ids=["http", "grpc"])
def client(request, shm_server):
    c = make_client(request.param, shm_server)
    yield c
    try:
        c.unregister_system_shared_memory()
    finally:
        c.close()


@pytest.fixture
def regions() -> Iterator[dict]:
    """name → handle of regions made by the test (keys unique to this process), destroyed afterwards."""
    made: dict = {}

    def create(name: str, size: int):
        made[name] = shm.create_shared_memory_region(name, key(name), size)
        return made[name]

    made["create"] = create
    yield made
    for name, handle in made.items():
        if name != "create":
            with contextlib.suppress(shm.SharedMemoryException):  # the test removed it itself
                shm.destroy_shared_memory_region(handle)


def key(name: str) -> str:
    return f"/hubserve_test_{os.getpid()}_{name}"


def error_of(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as e:
        call()
    return e.value


def status(client, http: str, grpc: str) -> str:
    return http if client.module is httpclient else grpc


def region_names(client) -> list[str]:
    if client.module is grpcclient:
        return sorted(client.get_system_shared_memory_status(as_json=True).get("regions", {}))
    return sorted(r["name"] for r in client.get_system_shared_memory_status())


def simple_io(client, in_region: str = "in", out_region: str = "out", out_size: int = 128):
    """simple's inputs from `in_region` (INPUT0 at 0, INPUT1 at 64) and outputs into `out_region` (OUTPUT0
    at 0, OUTPUT1 at 64)."""
    m = client.module
    inputs = [m.InferInput("INPUT0", [1, 16], "INT32"), m.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory(in_region, 64, offset=0)
    inputs[1].set_shared_memory(in_region, 64, offset=64)
    outputs = [m.InferRequestedOutput("OUTPUT0"), m.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory(out_region, min(64, out_size), offset=0)
    outputs[1].set_shared_memory(out_region, 64, offset=64)
    return inputs, outputs


def register_simple(client, regions, in_size: int = 128, out_size: int = 128):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    ins = regions["create"]("in", in_size)
    shm.set_shared_memory_region(ins, [a, b])
    outs = regions["create"]("out", out_size)
    client.register_system_shared_memory("in", key("in"), in_size)
    client.register_system_shared_memory("out", key("out"), out_size)
    return a, b, outs


# ------------------------------------------------------------------------------------------ the happy paths

def test_inputs_and_outputs_in_shared_memory_at_offsets(client, regions):
    a, b, outs = register_simple(client, regions)
    inputs, outputs = simple_io(client)
    for _ in range(3):  # the first request and the codecs' cached plans after it
        result = client.infer("simple", inputs, outputs=outputs)
        if client.module is httpclient:  # in the region, not in the answer: as Triton, no data, no parameters
            assert result.get_output("OUTPUT0") == {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]}
        else:  # one empty raw_output_contents entry per output
            assert [len(raw) for raw in result.get_response().raw_output_contents] == [0, 0]
        np.testing.assert_array_equal(shm.get_contents_as_numpy(outs, np.int32, [1, 16]), a + b)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(outs, np.int32, [1, 16], offset=64), a - b)
    # a mix: inputs from the region, outputs in the answer
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    assert region_names(client) == ["in", "out"]
    client.unregister_system_shared_memory("in")
    e = error_of(lambda: client.infer("simple", inputs, outputs=outputs))
    assert e.message() == "Unable to find shared memory region: 'in'"
    assert e.status() == status(client, "404", "StatusCode.NOT_FOUND")
    assert region_names(client) == ["out"]
    client.unregister_system_shared_memory()  # all
    assert region_names(client) == []


def test_bytes_tensors_in_shared_memory(client, regions):
    data = np.array([[b"a", b"", b"hello", "ü".encode()]], dtype=np.object_)
    wire = serialize_byte_tensor(data)
    size = serialized_byte_size(wire)
    ins = regions["create"]("bin", size + 16)
    outs = regions["create"]("bout", size + 16)
    shm.set_shared_memory_region(ins, [wire], offset=16)
    client.register_system_shared_memory("bin", key("bin"), size + 16)
    client.register_system_shared_memory("bout", key("bout"), size + 16)
    m = client.module
    inp = m.InferInput("INPUT0", [1, 4], "BYTES")
    inp.set_shared_memory("bin", size, offset=16)
    out = m.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("bout", size + 16)
    client.infer("identity_bytes", [inp], outputs=[out])
    raw = shm.get_contents_as_numpy(outs, np.uint8, [size])
    np.testing.assert_array_equal(deserialize_bytes_tensor(raw.tobytes()).reshape(1, 4), data)


def test_status_of_one_region_and_unregister_of_unknown(client, regions):
    regions["create"]("one", 64)
    client.register_system_shared_memory("one", key("one"), 32, offset=16)
    if client.module is grpcclient:
        got = client.get_system_shared_memory_status("one", as_json=True)["regions"]["one"]
        assert got == {"name": "one", "key": key("one"), "offset": "16", "byte_size": "32"}
    else:
        assert client.get_system_shared_memory_status("one") == [
            {"name": "one", "key": key("one"), "offset": 16, "byte_size": 32}]
    e = error_of(lambda: client.get_system_shared_memory_status("nope"))
    assert e.message() == "Unable to find system shared memory region: 'nope'"
    assert e.status() == status(client, "404", "StatusCode.NOT_FOUND")
    client.unregister_system_shared_memory("nope")  # Triton: no error


# ------------------------------------------------------------------------------------------ every error

def test_registration_errors_use_tritons_words(client, regions):
    regions["create"]("r", 64)
    client.register_system_shared_memory("r", key("r"), 64)
    e = error_of(lambda: client.register_system_shared_memory("r", key("r"), 64))
    assert e.message() == "shared memory region 'r' already in manager"
    assert e.status() == status(client, "400", "StatusCode.ALREADY_EXISTS")
    e = error_of(lambda: client.register_system_shared_memory("past", key("r"), 64, offset=8))
    assert e.message() == "failed to register shared memory region 'past': invalid args"
    assert e.status() == status(client, "400", "StatusCode.INVALID_ARGUMENT")
    e = error_of(lambda: client.register_system_shared_memory("missing", key("no_such_object"), 8))
    assert e.message() == f"Unable to open shared memory region: '{key('no_such_object')}'"
    assert e.status() == status(client, "500", "StatusCode.INTERNAL")
    for bad in ("/a/b", "/..", "/", "/triton_python_backend_shm_region_x"):
        e = error_of(lambda bad=bad: client.register_system_shared_memory("bad", bad, 8))
        assert e.status() == status(client, "400", "StatusCode.INVALID_ARGUMENT"), (bad, e)
    assert "reserved prefix" in e.message()


def test_tensor_errors_use_tritons_words(client, regions):
    register_simple(client, regions, out_size=96)
    m = client.module
    inputs, outputs = simple_io(client)

    def infer_with(tensor, region: str, size: int, offset: int, use_outputs=None):
        tensor.set_shared_memory(region, size, offset=offset)
        return error_of(lambda: client.infer("simple", inputs, outputs=use_outputs))

    e = infer_with(inputs[1], "in", 64, 96)
    assert e.message() == "Invalid offset + byte size for shared memory region: 'in'"
    assert e.status() == status(client, "400", "StatusCode.INVALID_ARGUMENT")
    e = infer_with(inputs[1], "in", 8, 128)
    assert e.message() == "Invalid offset for shared memory region: 'in'"
    e = infer_with(inputs[1], "in", 32, 64)
    assert e.message() == ("input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, "
                           "got 32")
    assert e.status() == status(client, "400", "StatusCode.INVALID_ARGUMENT")
    e = infer_with(inputs[1], "nope", 64, 0)
    assert e.message() == "Unable to find shared memory region: 'nope'"
    assert e.status() == status(client, "404", "StatusCode.NOT_FOUND")
    inputs[1].set_shared_memory("in", 64, offset=64)
    small = m.InferRequestedOutput("OUTPUT0")
    small.set_shared_memory("out", 32)
    e = error_of(lambda: client.infer("simple", inputs, outputs=[small]))
    assert e.message() == ("shared memory size specified with the request for output 'OUTPUT0' (32 bytes) "
                           "should be at least 64 bytes to hold the results")
    assert e.status() == status(client, "500", "StatusCode.INTERNAL")
    past = m.InferRequestedOutput("OUTPUT1")
    past.set_shared_memory("out", 64, offset=64)
    e = error_of(lambda: client.infer("simple", inputs, outputs=[past]))
    assert e.message() == "Invalid offset + byte size for shared memory region: 'out'"
    client.infer("simple", inputs)  # the server serves on


HANDLE = bytes(range(64))  # a cudaIpcMemHandle_t's size; no device behind it


def cuda_register(client, name: str, handle: bytes = HANDLE, device_id: int = 0, byte_size: int = 64):
    """tritonclient's register call: the handle in base64 (the gRPC client decodes it again)."""
    return client.register_cuda_shared_memory(name, base64.b64encode(handle).decode(), device_id, byte_size)


def cuda_status(client, name: str = ""):
    if client.module is grpcclient:
        return client.get_cuda_shared_memory_status(name, as_json=True).get("regions", {})
    return client.get_cuda_shared_memory_status(name)


def test_cuda_shared_memory_protocol_without_a_device(client, regions):
    # A well-formed register reaches the device module, which says why it cannot open the handle here (no
    # cuda-bindings, or no device); status and unregister answer as on a GPU server.
    e = error_of(lambda: cuda_register(client, "c"))
    assert e.message().startswith("failed to register CUDA shared memory region: 'c': CUDA shared memory is "
                                  "not available: "), e.message()
    assert e.status() == status(client, "503", "StatusCode.UNAVAILABLE")
    for bad in (HANDLE[:10], HANDLE + b"x"):
        e = error_of(lambda bad=bad: cuda_register(client, "c", bad))
        assert e.message() == "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"
        assert e.status() == status(client, "400", "StatusCode.INVALID_ARGUMENT")
    e = error_of(lambda: cuda_register(client, "c", byte_size=0))
    assert e.message() == "failed to register shared memory region 'c': invalid args (byte_size is 0)"
    # a name is one region's, of either kind, checked before any device is asked
    regions["create"]("taken", 64)
    client.register_system_shared_memory("taken", key("taken"), 64)
    e = error_of(lambda: cuda_register(client, "taken"))
    assert e.message() == "shared memory region 'taken' already in manager"
    e = error_of(lambda: cuda_status(client, "taken"))
    assert e.message() == ("The region named 'taken' is registered as system shared memory, not CUDA shared "
                           "memory")
    client.unregister_cuda_shared_memory()  # perf_analyzer --shared-memory system calls it first
    client.unregister_cuda_shared_memory("c")
    assert region_names(client) == ["taken"]  # a CUDA unregister leaves system regions alone
    assert cuda_status(client) in ([], {})
    e = error_of(lambda: cuda_status(client, "c"))
    assert e.message() == "Unable to find cuda shared memory region: 'c'"
    assert e.status() == status(client, "404", "StatusCode.NOT_FOUND")
    meta = client.get_server_metadata(**({"as_json": True} if client.module is grpcclient else {}))
    assert "system_shared_memory" in meta["extensions"]
    assert "cuda_shared_memory" not in meta["extensions"]  # until its GPU path has passed a device run


def test_cuda_register_body_checked_in_tritons_words(shm_server):
    url = f"http://{shm_server.http_url}/v2/cudasharedmemory/region/c/register"
    b64 = base64.b64encode(HANDLE).decode()
    for body, words in (({"device_id": 0, "byte_size": 64}, "Shared memory register request has no "
                                                            "'raw_handle' field"),
                        ({"raw_handle": {"b64": b64}, "byte_size": 64}, "Shared memory register request has "
                                                                        "no 'device_id' field"),
                        ({"raw_handle": {"b64": "%%%"}, "device_id": 0, "byte_size": 64},
                         "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")):
        request = urllib.request.Request(url, json.dumps(body).encode(), method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(request, timeout=10)
        assert e.value.code == 400 and json.loads(e.value.read()) == {"error": words}


# ------------------------------------------------------------------------------------------ off by default

@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_off_by_default(server, module, regions):
    c = make_client(module, server)  # the session's server: started without the flag
    try:
        regions["create"]("off", 64)
        for call in (lambda: c.register_system_shared_memory("off", key("off"), 64),
                     lambda: c.unregister_system_shared_memory(),
                     lambda: c.register_cuda_shared_memory("c", b"aGFuZGxl", 0, 64)):
            e = error_of(call)
            assert e.message() == ("Client shared memory is disabled. Start the server with "
                                   "'--allow-client-shm' (or '--allow-client-shm=true') to enable.")
            assert e.status() == status(c, "400", "StatusCode.FAILED_PRECONDITION")
        meta = c.get_server_metadata(**({"as_json": True} if module is grpcclient else {}))
        assert "system_shared_memory" not in meta["extensions"]
        assert "cuda_shared_memory" not in meta["extensions"]
    finally:
        c.close()


# ------------------------------------------------------------------------------ the client's object changes

def test_truncated_or_removed_under_the_server_is_a_clean_error(client, regions, shm_server):
    a, b, outs = register_simple(client, regions)
    inputs, outputs = simple_io(client)
    client.infer("simple", inputs, outputs=outputs)
    path = "/dev/shm/" + key("in").lstrip("/")
    os.truncate(path, 64)  # INPUT1 (at 64) is now past the end of the object
    e = error_of(lambda: client.infer("simple", inputs, outputs=outputs))
    assert "region 'in' was truncated by its owner (the object has 64 bytes now" in e.message(), e.message()
    assert e.status() == status(client, "400", "StatusCode.INVALID_ARGUMENT")
    os.truncate(path, 128)
    client.infer("simple", inputs, outputs=outputs)  # grown back: served again
    os.truncate("/dev/shm/" + key("out").lstrip("/"), 0)  # the outputs' object
    e = error_of(lambda: client.infer("simple", inputs, outputs=outputs))
    assert "region 'out' was truncated by its owner (the object has 0 bytes now" in e.message(), e.message()
    shm.destroy_shared_memory_region(regions.pop("in"))  # shm_unlink
    e = error_of(lambda: client.infer("simple", inputs, outputs=outputs))
    assert "shared memory region 'in' is gone" in e.message(), e.message()
    # the same key made again names another object: still refused until registered again
    regions["create"]("in", 128)
    e = error_of(lambda: client.infer("simple", inputs))
    assert "shared memory region 'in' is gone" in e.message(), e.message()
    client.unregister_system_shared_memory("in")
    client.register_system_shared_memory("in", key("in"), 128)
    client.infer("simple", inputs)
    assert shm_server.process.poll() is None
    with urllib.request.urlopen(f"http://{shm_server.http_url}/v2/health/live", timeout=10) as r:
        assert r.status == 200


# ------------------------------------------------------------------------------------------ --workers 2

def test_the_registry_is_global_with_workers_2(repository, tmp_path, regions):
    srv = start_server(repository, tmp_path / "server.log", "--no-strict-readiness", "--model-control-mode",
                       "none", "--workers", "2", FLAG)
    try:
        admin = make_client(httpclient, srv)
        a, b, outs = register_simple(admin, regions)
        # connections held open at once are spread over both frontends (the engine hands each new one to
        # the frontend with the fewest), so these requests cross both
        clients = [make_client(m, srv) for m in (httpclient, grpcclient) * 3]
        for c in clients:
            inputs, outputs = simple_io(c)
            c.infer("simple", inputs, outputs=outputs)
            np.testing.assert_array_equal(shm.get_contents_as_numpy(outs, np.int32, [1, 16]), a + b)
            np.testing.assert_array_equal(c.infer("simple", inputs).as_numpy("OUTPUT1"), a - b)
        assert region_names(clients[1]) == ["in", "out"]
        clients[1].unregister_system_shared_memory()
        assert region_names(admin) == []
        for c in [admin, *clients]:
            c.close()
    finally:
        srv.stop()


# ------------------------------------------------------------------------------------------ perf_analyzer

@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_shared_memory_system(shm_server, protocol):
    if not perf_analyzer_available():
        pytest.fail("perf_analyzer is not installed: run `make perf-analyzer`", pytrace=False)
    url = shm_server.grpc_url if protocol == "grpc" else shm_server.http_url
    extra = ("--concurrency-range", "2", "--shared-memory", "system", "--stability-percentage", "100")
    # perf_analyzer names its regions after the tensors (/INPUT0_0_0, /OUTPUT0, ...), one namespace per
    # machine: `make test` runs this file in both of its pytest processes (the second time with --workers 2),
    # and two runs at once unlink each other's regions. So one at a time on the machine.
    with open(os.path.join(tempfile.gettempdir(), "hubserve-tests-perf-analyzer-shm.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = run_perf_analyzer_settled("simple", url, protocol, *extra, timeout_s=90)
    assert result.returncode == 0, f"command: {' '.join(result.command)}\n{result.output}"
    assert result.throughput > 0, result.output


def post(server, path: str, doc: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://{server.http_url}/v2/{path}", method="POST",
                                     data=json.dumps(doc).encode())
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            body = r.read()
            return r.status, json.loads(body) if body else {}
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_numbers_and_keys_of_any_type_are_checked(shm_server, regions):
    # what tritonclient never sends: negative, fractional, boolean and string numbers, keys of other types
    regions["create"]("raw", 64)
    for doc, words in [({"key": key("raw"), "offset": -1, "byte_size": 8}, "'offset' must be an unsigned"),
                       ({"key": key("raw"), "byte_size": 1.5}, "'byte_size' must be an unsigned"),
                       ({"key": key("raw"), "byte_size": True}, "'byte_size' must be an unsigned"),
                       ({"key": key("raw"), "byte_size": "8"}, "'byte_size' must be an unsigned"),
                       ({"key": 5, "byte_size": 8}, "no 'key' field"),
                       ({"byte_size": 8}, "no 'key' field"),
                       ({"key": key("raw")}, "no 'byte_size' field"),
                       ({"key": key("raw"), "byte_size": 1 << 70}, "'byte_size' must be an unsigned"),
                       ({"key": key("raw"), "offset": 1 << 62, "byte_size": 1 << 62}, "invalid args")]:
        code, body = post(shm_server, "systemsharedmemory/region/raw/register", doc)
        assert code == 400 and words in body["error"], (doc, code, body)
    assert post(shm_server, "systemsharedmemory/region/raw/register",
                {"key": key("raw"), "byte_size": 64})[0] == 200
    tensor = {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16],
              "parameters": {"shared_memory_region": "raw", "shared_memory_byte_size": 64}}
    other = {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
    for params, words in [({"shared_memory_offset": -1}, "Unable to parse 'shared_memory_offset'"),
                          ({"shared_memory_offset": "0"}, "Unable to parse 'shared_memory_offset'"),
                          ({"shared_memory_byte_size": -64}, "Unable to parse 'shared_memory_byte_size'"),
                          ({"shared_memory_region": 7}, "Unable to parse 'shared_memory_region'")]:
        bad = {**tensor, "parameters": {**tensor["parameters"], **params}}
        code, body = post(shm_server, "models/simple/infer", {"inputs": [bad, other]})
        assert code == 400 and body["error"] == words, (params, code, body)
    code, body = post(shm_server, "models/simple/infer", {"inputs": [tensor, other]})
    assert code == 200, body
    assert post(shm_server, "systemsharedmemory/register", {"key": key("raw"), "byte_size": 8}) == \
        (400, {"error": "'region name' is necessary to register system shared memory region"})
    assert post(shm_server, "systemsharedmemory/unregister", {})[0] == 200
    request = urllib.request.Request(f"http://{shm_server.http_url}/v2/systemsharedmemory/status",
                                     method="POST", data=b"{}")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=10)
    assert e.value.code == 405


def test_stream_infer_with_outputs_in_shared_memory(shm_server, regions):
    c = make_client(grpcclient, shm_server)
    answers: list = []
    try:
        a, b, outs = register_simple(c, regions)
        inputs, outputs = simple_io(c)
        c.start_stream(callback=lambda result, error: answers.append((result, error)))
        c.async_stream_infer("simple", inputs, outputs=outputs, request_id="s1")
        c.stop_stream()  # waits for the answers
        assert [(r.get_response().id, e) for r, e in answers] == [("s1", None)]
        np.testing.assert_array_equal(shm.get_contents_as_numpy(outs, np.int32, [1, 16], offset=64), a - b)
    finally:
        c.unregister_system_shared_memory()
        c.close()
