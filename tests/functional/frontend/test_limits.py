"""Limits that hold, each configurable and each with a clear error in its protocol's form: JSON nesting depth,
elements per tensor, BYTES element size, HTTP/2 concurrent streams, connections in all and per client address
(engine/frontend/wire.py TensorLimits, engine/frontend/connections.py).

One server with every limit set low, driven with tritonclient over both protocols and raw sockets; after
each refusal the server answers a correct inference. The connection limits are counted exactly with one
process; with `--workers 2` each frontend holds its share (the limit halved, rounded up), checked apart.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import assert_simple_over_grpc, build_test_repository, start_server
from engine.frontend.connections import ConnectionCounter, ConnectionLimits
from h2_client import RawClient

LOW = ("--max-json-depth", "6", "--max-tensor-elements", "1000", "--max-bytes-element-size", "1024",
       "--grpc-max-concurrent-streams", "4")
FEW = ("--max-connections", "5", "--max-connections-per-client", "3")
GOAWAY, RST_STREAM = 0x7, 0x3
ENHANCE_YOUR_CALM, REFUSED_STREAM = 0xB, 0x7


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_test_repository(tmp_path_factory.mktemp("limits_repository"))


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory):
    srv = start_server(repo, tmp_path_factory.mktemp("limits_server") / "server.log", *LOW,
                       "--canary-interval-secs", "0", wait_ready=False)
    yield srv
    srv.stop()


@pytest.fixture
def few(repo: Path, tmp_path: Path):
    """A server of its own, holding five connections, three per client address: only the test's own count."""
    srv = start_server(repo, tmp_path / "server.log", *FEW, "--workers", "1", "--canary-interval-secs", "0",
                       wait_ready=False)
    _wait_open(srv)
    yield srv
    srv.stop()


def _post(server, path: str, doc: object) -> tuple[int, str]:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    req = urllib.request.Request(f"http://{server.http_url}{path}", data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _identity(data: object, shape: list[int], datatype: str = "INT32", model: str = "identity_int32",
              parameters: dict | None = None) -> dict:
    doc: dict = {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": shape, "data": data}]}
    if parameters is not None:
        doc["parameters"] = parameters
    return doc


# ------------------------------------------------------------------------------------------ JSON depth

def test_json_depth_counts_data_nesting(server) -> None:
    ok = _post(server, "/v2/models/identity_int32/infer", _identity([[1, 2, 3, 4]], [1, 4]))
    assert ok[0] == 200, ok  # data of rank 2: its rows at depth 5
    at_limit = _identity([[[1, 2, 3, 4]]], [1, 1, 4])  # rank 3: its innermost lists at depth 6
    assert "nested deeper" not in _post(server, "/v2/models/identity_int32/infer", at_limit)[1]
    too_deep = _identity([[[[1, 2, 3, 4]]]], [1, 1, 1, 4])  # rank 4: depth 7
    status, body = _post(server, "/v2/models/identity_int32/infer", too_deep)
    assert status == 400 and "nested deeper than" in body and "6 (--max-json-depth)" in body, body
    assert_simple_over_grpc(server)


def test_json_depth_counts_parameters_and_other_endpoints(server) -> None:
    nested = {"a": {"b": {"c": {"d": {"e": {"f": 1}}}}}}  # its innermost object at depth 7
    status, body = _post(server, "/v2/models/identity_int32/infer",
                         _identity([[1, 2, 3, 4]], [1, 4], parameters=nested))
    assert status == 400 and "(--max-json-depth)" in body, body
    status, body = _post(server, "/v2/repository/index", {"x": [[[[[[1]]]]]]})
    assert status == 400 and "(--max-json-depth)" in body, body
    assert_simple_over_grpc(server)


# ----------------------------------------------------------------------------------- tensor elements

def test_elements_per_tensor_over_both_protocols(server) -> None:
    status, body = _post(server, "/v2/models/identity_int32/infer", _identity([0] * 1004, [251, 4]))
    assert status == 400 and "more than 1000 elements, the limit (--max-tensor-elements)" in body, body
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("INPUT0", [251, 4], "INT32")
    inp.set_data_from_numpy(np.zeros((251, 4), np.int32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("identity_int32", [inp])
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "--max-tensor-elements" in e.value.message()
    client.close()
    assert_simple_over_grpc(server)


# ----------------------------------------------------------------------------------- BYTES elements

@pytest.mark.parametrize("protocol", ["http-json", "http-binary", "grpc"])
def test_bytes_element_size(server, protocol: str) -> None:
    module = grpcclient if protocol == "grpc" else httpclient
    client = module.InferenceServerClient(server.grpc_url if protocol == "grpc" else server.http_url)

    def infer(value: bytes):
        inp = module.InferInput("INPUT0", [1, 4], "BYTES")
        data = np.array([[value, b"a", b"b", b"c"]], dtype=object)
        if protocol == "grpc":
            inp.set_data_from_numpy(data)
        else:
            inp.set_data_from_numpy(data, binary_data=protocol == "http-binary")
        return client.infer("identity_bytes", [inp])

    assert infer(b"x" * 1024).as_numpy("OUTPUT0")[0, 0] == b"x" * 1024  # at the limit: served
    with pytest.raises(InferenceServerException) as e:
        infer(b"x" * 1025)
    assert "BYTES element 0 is 1025 bytes, more than the limit of 1024 (--max-bytes-element-size)" \
        in e.value.message()
    client.close()
    assert_simple_over_grpc(server)


# ------------------------------------------------------------------------------ HTTP/2 stream limit

def test_concurrent_streams_per_connection(server) -> None:
    c = RawClient(server.grpc_port)
    c.handshake()
    assert c.server_settings[0x3] == 4  # SETTINGS_MAX_CONCURRENT_STREAMS as configured
    for stream_id in (1, 3, 5, 7, 9):  # open, never finished: the fifth is over the limit
        c.send(c.headers(stream_id))
    got = c.read_until(RST_STREAM)
    assert got[2] == 9 and int.from_bytes(got[3], "big") == REFUSED_STREAM
    c.close()
    assert_simple_over_grpc(server)


# ------------------------------------------------------------------------------------- connections

def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=20, source_address=(source, 0))


def _http_answer(sock: socket.socket) -> bytes:
    sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + _length(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


def _refused_http(sock: socket.socket) -> str:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    assert data.startswith(b"HTTP/1.1 503 "), data
    return json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]


def _wait_open(server) -> None:
    """Wait until the server takes a connection again: it counts a close when the close reaches it."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        probe = _connect(server.http_port)
        try:
            if _http_answer(probe).startswith(b"HTTP/1.1 200"):
                return
        except OSError:  # refused and closed before our request went out
            pass
        finally:
            probe.close()
        time.sleep(0.05)
    raise AssertionError("the server did not take connections again")


def test_connections_per_client_and_in_all(few) -> None:
    server = few
    held = [_connect(server.http_port) for _ in range(2)] + [_connect(server.grpc_port)]  # 3: HTTP+gRPC
    for sock in held[:2]:
        assert _http_answer(sock).startswith(b"HTTP/1.1 200")
    try:
        fourth = _connect(server.http_port)
        assert "too many connections from 127.0.0.1: 3 at most per client address " \
               "(--max-connections-per-client)" in _refused_http(fourth)
        fourth.close()
        c = RawClient(server.grpc_port)  # gRPC: the preface, then GOAWAY ENHANCE_YOUR_CALM saying why
        got = c.read_until(GOAWAY)
        assert int.from_bytes(got[3][4:8], "big") == ENHANCE_YOUR_CALM and b"--max-connections-per-client" \
            in got[3][8:]
        c.close()
        # Another address on the loopback: its own three, but the server holds five in all.
        other = [_connect(server.http_port, "127.0.0.2") for _ in range(2)]
        for sock in other:
            assert _http_answer(sock).startswith(b"HTTP/1.1 200")
        sixth = _connect(server.http_port, "127.0.0.2")
        assert "too many connections: the server holds 5 at most (--max-connections)" in _refused_http(sixth)
        sixth.close()
        held += other
    finally:
        for sock in held:
            sock.close()
    _wait_open(server)
    assert_simple_over_grpc(server)


def test_a_flood_of_connections_is_refused_and_costs_nothing_after(few) -> None:
    server = few
    before = server.rss_bytes()
    held = [_connect(server.http_port) for _ in range(3)]
    refused = 0
    for _ in range(300):
        sock = _connect(server.http_port)
        try:
            refused += _refused_http(sock).startswith("too many connections")
        finally:
            sock.close()
    for sock in held:
        sock.close()
    assert refused == 300
    _wait_open(server)
    assert_simple_over_grpc(server)
    assert server.rss_bytes() < before + (32 << 20)


def test_each_frontend_holds_its_share_with_workers(repo: Path, tmp_path: Path) -> None:
    # Which connections are refused depends on which frontend each lands on, so none sends anything: each
    # refused one is answered 503 and closed at once, each admitted one is closed when its request head does
    # not come within the idle timeout. Every connection ends either way, and says which it was.
    srv = start_server(repo, tmp_path / "server.log", "--workers", "2", "--max-connections-per-client", "3",
                       "--idle-timeout-secs", "1", "--canary-interval-secs", "0", wait_ready=False)
    try:
        socks = [_connect(srv.http_port) for _ in range(6)]
        answers = []
        for sock in socks:
            data = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := sock.recv(65536):
                    data += chunk
            answers.append(data)
            sock.close()
        refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
        # Two frontends hold two each at most (3 / 2 rounded up), however the six were spread: four admitted
        # at most, and more refused when the spread was uneven.
        assert len(refused) >= 2, answers
        assert all(b"--max-connections-per-client" in a for a in refused)
    finally:
        srv.stop()


# ----------------------------------------------------------------------------------- the policy itself

def test_counter_policy() -> None:
    counter = ConnectionCounter(ConnectionLimits(max_connections=3, max_per_client=2))
    assert counter.admit("a") == "" and counter.admit("a") == ""
    assert "per client address" in counter.admit("a")
    assert counter.admit("b") == ""
    assert "the server holds 3 at most" in counter.admit("c")
    counter.release("a")
    assert counter.admit("c") == "" and counter.open == 3
    unlimited = ConnectionCounter(ConnectionLimits(0, 0))
    assert all(unlimited.admit("a") == "" for _ in range(10_000))


def test_shares_round_up() -> None:
    assert ConnectionLimits(5, 3).share(2) == ConnectionLimits(3, 2)
    assert ConnectionLimits(0, 1).share(4) == ConnectionLimits(0, 1)
