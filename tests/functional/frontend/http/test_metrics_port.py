"""The metrics port has the frontends' limits (frontend/http/metrics_routes.py): a request head that never
ends is answered 408 and closed after --client-timeout-secs, an idle connection is closed after
--idle-timeout-secs, and connections past --metrics-max-connections (in all) or
--metrics-max-connections-per-client (per address) are answered 503 and closed, while the HTTP and gRPC ports
keep serving. With the server's descriptor limit lowered, a flood of idle metrics connections can no longer
starve the inference ports. Raw sockets throughout: the point is the bytes and the connections.
"""

from __future__ import annotations

import resource
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import RunningServer, assert_simple_over_grpc, start_server

CLIENT_TIMEOUT_S = 1.0
IDLE_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 8
MAX_PER_CLIENT = 4
BOUND_S = 10.0  # the most a timeout may take to act here (the sweeper runs every quarter of the timeout)


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory):
    log_path = tmp_path_factory.mktemp("metrics") / "server.log"
    srv = start_server(repository, log_path, "--no-strict-readiness", "--model-control-mode", "none",
                       "--client-timeout-secs", str(CLIENT_TIMEOUT_S), "--idle-timeout-secs",
                       str(IDLE_TIMEOUT_S), "--metrics-max-connections", str(MAX_CONNECTIONS),
                       "--metrics-max-connections-per-client", str(MAX_PER_CLIENT))
    yield srv
    srv.stop()


def connect(server: RunningServer, source: str = "127.0.0.1") -> socket.socket:
    """A connection to the metrics port from `source` (any 127.0.0.0/8 address is this machine's)."""
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", server.metrics_port))
    sock.settimeout(BOUND_S)
    return sock


def read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took; fails if it never closes."""
    start = time.monotonic()
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            raise AssertionError(f"the connection was still open after {BOUND_S} s; got {data!r}") from None
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data, time.monotonic() - start


def scrape(server: RunningServer, source: str = "127.0.0.1") -> tuple[int, bytes]:
    with connect(server, source) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data, _ = read_until_closed(sock)
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def assert_serving(server: RunningServer) -> None:
    """A correct inference on both protocols, each on a new connection."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    with httpclient.InferenceServerClient(server.http_url) as c:
        inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        assert c.infer("simple", inputs).as_numpy("OUTPUT0").tolist() == (a + a).tolist()
    assert_simple_over_grpc(server)


def test_metrics_are_served(server):
    status, body = scrape(server)
    assert status == 200
    assert b'nv_inference_request_success{model="simple",version="1"}' in body
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
    for path, want in (("/nothing", 404), ("/metrics?x=1", 200)):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}{path}", timeout=10) as r:
                assert r.status == want
        except urllib.error.HTTPError as e:
            assert e.code == want


def test_a_half_sent_head_is_answered_408_and_closed(server):
    with connect(server) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # the blank line never comes
        data, took = read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 408 "), data
    assert b"--client-timeout-secs" in data
    assert took < BOUND_S
    assert_serving(server)


def test_an_idle_connection_is_closed(server):
    with connect(server) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        start = time.monotonic()
        data, _ = read_until_closed(sock)  # the answer (kept alive), then the close once idle
    assert data.startswith(b"HTTP/1.1 200 ")
    assert IDLE_TIMEOUT_S * 0.9 <= time.monotonic() - start < IDLE_TIMEOUT_S + BOUND_S


def test_connections_past_the_caps_are_refused_while_http_and_grpc_serve(server):
    held: list[socket.socket] = []
    try:
        for _ in range(MAX_PER_CLIENT):
            held.append(connect(server, "127.0.0.2"))
        scrape(server)  # the connections above are counted once the server has answered this one
        with connect(server, "127.0.0.2") as sock:  # one more from the same address
            data, _ = read_until_closed(sock)
        assert data.startswith(b"HTTP/1.1 503 ") and b"--metrics-max-connections-per-client" in data, data
        assert scrape(server, "127.0.0.3")[0] == 200  # another address still gets in
        for _ in range(MAX_CONNECTIONS - MAX_PER_CLIENT):
            held.append(connect(server, "127.0.0.3"))
        scrape(server)
        with connect(server, "127.0.0.4") as sock:  # the port is full
            data, _ = read_until_closed(sock)
        assert data.startswith(b"HTTP/1.1 503 ") and b"(--metrics-max-connections)" in data, data
        assert_serving(server)  # the inference ports do not share the metrics port's count
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + BOUND_S
    while scrape(server)[0] != 200:  # the held connections' closes reach the server
        assert time.monotonic() < deadline, "the metrics port did not take connections again"
        time.sleep(0.05)


def test_idle_metrics_connections_cannot_starve_the_inference_ports(repository, tmp_path):
    """The hole: with the server's descriptor limit at 256, 300 idle connections to the metrics port used
    every descriptor, and the HTTP port reset new connections. Now the metrics port holds at most its cap."""
    srv = start_server(repository, tmp_path / "server.log", "--no-strict-readiness", "--model-control-mode",
                       "none")
    held: list[socket.socket] = []
    try:
        resource.prlimit(srv.process.pid, resource.RLIMIT_NOFILE, (256, 256))
        for _ in range(300):
            held.append(connect(srv))
        scrape(srv, "127.0.0.5")  # every connection above has been accepted (and the extra ones refused)
        assert_serving(srv)
        with urllib.request.urlopen(f"http://{srv.http_url}/v2/health/live", timeout=10) as r:
            assert r.status == 200
    finally:
        for sock in held:
            sock.close()
        srv.stop()
