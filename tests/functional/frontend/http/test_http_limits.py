"""What one HTTP/1.1 client cannot do to the server: bodies over the limit (413), heads too large (431),
stalls (408, closed, aborted), memory that stays behind after large bodies, pipelining that piles up, and
requests lost to a shutdown. Raw sockets throughout, so a request can be exactly as malformed or slow as
wanted; after each attack a correct inference on `simple` still works.

The server under test runs with an 8 MB body limit, a 1 s client timeout and a 2 s idle timeout; the memory
and shutdown tests start servers of their own.
"""

from __future__ import annotations

import http.client
import itertools
import json
import select
import signal
import socket
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import RunningServer, start_server

BODY_LIMIT = 8_000_000
CLIENT_TIMEOUT_S = 1.0
IDLE_TIMEOUT_S = 2.0
INFER = "/v2/models/simple/infer"
A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


@pytest.fixture(scope="module")
def limited(repository: Path, tmp_path_factory: pytest.TempPathFactory):
    log_path = tmp_path_factory.mktemp("limited") / "server.log"
    srv = start_server(repository, log_path, "--no-strict-readiness", "--model-control-mode", "none",
                       "--http-max-input-size", str(BODY_LIMIT), "--client-timeout-secs",
                       str(CLIENT_TIMEOUT_S), "--idle-timeout-secs", str(IDLE_TIMEOUT_S))
    yield srv
    srv.stop()


# ---------------------------------------------------------------------------- helpers

class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def error(self) -> str:
        doc = json.loads(self.body)
        assert set(doc) == {"error"}, doc
        return str(doc["error"])


class RawConnection:
    """A socket that reads HTTP/1.1 responses by hand (Content-Length framing only, which is all we send)."""

    def __init__(self, port: int, timeout_s: float = 15.0, rcvbuf: int = 0) -> None:
        self.sock = socket.socket()
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout_s)
        self.sock.connect(("127.0.0.1", port))
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(1 << 20)
        self.buffer += chunk
        return bool(chunk)

    def response(self) -> Response:
        while b"\r\n\r\n" not in self.buffer:
            if not self._fill():
                raise ConnectionError(f"connection closed before a response; got {self.buffer[:200]!r}")
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            if not self._fill():
                raise ConnectionError("connection closed inside a response body")
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return Response(status, headers, body)

    def closed_by_server(self) -> bool:
        """Reads until the server closes; True once it has (EOF or reset), False at the socket timeout."""
        try:
            while self._fill():
                pass
        except (ConnectionResetError, BrokenPipeError):
            pass
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        self.sock.close()


def infer_body(a: np.ndarray = A) -> bytes:
    """A JSON inference request for `simple`: OUTPUT0 = a + B, OUTPUT1 = a - B."""
    return json.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": a.ravel().tolist()},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": B.ravel().tolist()}]}).encode()


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def assert_good_inference(server: RunningServer) -> None:
    assert server.process.poll() is None, f"server died:\n{server.log()}"
    with httpclient.InferenceServerClient(server.http_url, network_timeout=30.0) as client:
        inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(A)
        inputs[1].set_data_from_numpy(B)
        result = client.infer("simple", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


# ---------------------------------------------------------------------------- body limit (413)

def test_declared_length_over_the_limit_is_413_before_the_body(limited):
    conn = RawConnection(limited.http_port)
    try:
        conn.send(f"POST {INFER} HTTP/1.1\r\nHost: test\r\nContent-Length: {BODY_LIMIT + 1}\r\n\r\n".encode())
        answer = conn.response()  # no body byte sent: the server must answer from the head alone
        assert answer.status == 413, answer.body
        message = answer.error()
        assert f"{BODY_LIMIT + 1} bytes exceeds the maximum allowed value of {BODY_LIMIT} bytes" in message
        assert "--http-max-input-size" in message
        assert answer.headers.get("connection") == "close"
        assert conn.closed_by_server()
    finally:
        conn.close()
    assert_good_inference(limited)


def test_chunked_body_passing_the_limit_is_413(limited):
    conn = RawConnection(limited.http_port)
    chunk = b"x" * (1 << 20)
    sent_error: list[BaseException] = []

    def upload() -> None:
        try:
            conn.send(f"POST {INFER} HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
            for _ in range(BODY_LIMIT // len(chunk) + 4):
                conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            conn.send(b"0\r\n\r\n")
        except OSError as e:  # the server may close once it has answered
            sent_error.append(e)

    sender = threading.Thread(target=upload, daemon=True)
    sender.start()
    try:
        answer = conn.response()
        assert answer.status == 413, answer.body
        assert f"exceeds the maximum allowed value of {BODY_LIMIT} bytes" in answer.error()
        assert answer.headers.get("connection") == "close"
        sender.join(30)
    finally:
        conn.close()
    assert_good_inference(limited)


# ---------------------------------------------------------------------------- header limits (431)

@pytest.mark.parametrize("headers", [
    pytest.param("X-Long: " + "a" * 65536 + "\r\n", id="64KiB-line"),
    pytest.param("".join(f"X-Field-{i}: {i}\r\n" for i in range(1000)), id="1000-fields"),
])
def test_head_too_large_is_431(limited, headers):
    conn = RawConnection(limited.http_port)
    try:
        started = time.monotonic()
        conn.send(f"GET /v2/health/ready HTTP/1.1\r\nHost: test\r\n{headers}\r\n".encode())
        answer = conn.response()
        assert answer.status == 431, answer.body
        assert "header" in answer.error()
        assert answer.headers.get("connection") == "close"
        assert time.monotonic() - started < 5.0
    finally:
        conn.close()
    assert_good_inference(limited)


# ---------------------------------------------------------------------------- timeouts

def test_head_trickled_a_byte_at_a_time_is_408(limited):
    conn = RawConnection(limited.http_port)
    try:
        conn.send(b"GET /v2/health/ready HTTP/1.1\r\nHost: test\r\n")
        started = time.monotonic()
        answered = False
        while time.monotonic() - started < CLIENT_TIMEOUT_S + 10:
            if select.select([conn.sock], [], [], 0.1)[0]:
                answered = True
                break
            conn.send(b"X")  # one more byte of an endless header name
        assert answered, "a trickling head was never answered"
        elapsed = time.monotonic() - started
        answer = conn.response()
        assert answer.status == 408, answer.body
        assert "--client-timeout-secs" in answer.error()
        assert CLIENT_TIMEOUT_S * 0.9 <= elapsed < CLIENT_TIMEOUT_S + 8, elapsed
    finally:
        conn.close()
    assert_good_inference(limited)


def test_stalled_body_is_408(limited):
    conn = RawConnection(limited.http_port)
    try:
        conn.send(f"POST {INFER} HTTP/1.1\r\nHost: test\r\nContent-Length: 100\r\n\r\n{{\"inputs\"".encode())
        started = time.monotonic()
        answer = conn.response()
        elapsed = time.monotonic() - started
        assert answer.status == 408, answer.body
        assert CLIENT_TIMEOUT_S * 0.9 <= elapsed < CLIENT_TIMEOUT_S + 8, elapsed
        assert conn.closed_by_server()
    finally:
        conn.close()
    assert_good_inference(limited)


def test_idle_keep_alive_connection_is_closed(limited):
    conn = RawConnection(limited.http_port)
    try:
        conn.send(b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\n\r\n")
        assert conn.response().status == 200
        started = time.monotonic()
        assert conn.closed_by_server(), "an idle connection was kept past --idle-timeout-secs"
        elapsed = time.monotonic() - started
        assert IDLE_TIMEOUT_S * 0.9 <= elapsed < IDLE_TIMEOUT_S + 8, elapsed
    finally:
        conn.close()
    assert_good_inference(limited)


def test_client_leaving_large_answers_unread_is_disconnected(limited):
    """Pipelined 4 MB identity requests whose 4 MB answers the client never reads: once the answers back up,
    the server stops serving this connection and, after the client timeout, drops it."""
    element = b"x" * (1 << 20)  # identity_bytes echoes four 1 MiB strings: 4 MiB in, 4 MiB out
    data = b"".join(struct.pack("<I", len(element)) + element for _ in range(4))
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 4],
                                     "parameters": {"binary_data_size": len(data)}}],
                         "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    body = header + data
    request = post("/v2/models/identity_bytes/infer", body,
                   f"Inference-Header-Content-Length: {len(header)}\r\n")
    conn = RawConnection(limited.http_port, timeout_s=30.0, rcvbuf=16384)
    send_error: list[BaseException] = []

    def pipeline() -> None:
        try:
            for _ in range(12):
                conn.send(request)
        except OSError as e:
            send_error.append(e)

    sender = threading.Thread(target=pipeline, daemon=True)
    sender.start()
    try:
        sender.join(CLIENT_TIMEOUT_S + 30)
        assert not sender.is_alive(), "the server never dropped a client that leaves its answers unread"
        assert send_error, "all 12 requests were accepted although their answers were never read"
        answered = 0
        try:
            while True:
                conn.response()
                answered += 1
        except (ConnectionError, OSError):
            pass
        assert answered < 12
    finally:
        conn.close()
    assert_good_inference(limited)


# ---------------------------------------------------------------------------- pipelining

READY = b"GET /v2/models/simple/ready HTTP/1.1\r\nHost: test\r\n\r\n"


def expect_inference(conn: RawConnection, i: int) -> None:
    """The next answer is `infer_body(A + i)`'s: OUTPUT0 = A + i + B."""
    answer = conn.response()
    assert answer.status == 200, answer.body
    outputs = {o["name"]: o["data"] for o in json.loads(answer.body)["outputs"]}
    assert outputs["OUTPUT0"] == (A + i + B).ravel().tolist(), f"answer {i} out of order"


def expect_ready(conn: RawConnection) -> None:
    ready = conn.response()
    assert ready.status == 200 and ready.body == b""


def test_pipelined_requests_are_answered_in_order(limited):
    conn = RawConnection(limited.http_port)
    try:
        conn.send(b"".join(post(INFER, infer_body(A + i)) + READY for i in range(10)))
        for i in range(10):
            expect_inference(conn, i)
            expect_ready(conn)
    finally:
        conn.close()
    assert_good_inference(limited)


def test_large_bodies_in_uneven_pieces_then_pipelined_requests_are_answered_in_order(limited):
    """Bodies of 64 KiB and more are read straight into their own buffer (reader.py `body_buffer`), out of
    the parser's sight: the requests after one, on the same connection and in the same reads, still parse."""
    padding = b" " * 300_000  # JSON may end in whitespace: a large body for `simple`
    first, second = post(INFER, infer_body(A + 1) + padding), post(INFER, infer_body(A + 2) + padding)
    stream = first + second + READY
    conn = RawConnection(limited.http_port)
    try:
        cuts = [0, 90, 70_001, 200_003, len(first) - 7, len(first) + 5, len(first) + 150_000, len(stream)]
        for start, end in itertools.pairwise(cuts):
            conn.send(stream[start:end])
            time.sleep(0.01)  # (so the pieces arrive as separate reads; the answers do not depend on it)
        for i in (1, 2):
            expect_inference(conn, i)
        expect_ready(conn)
    finally:
        conn.close()
    assert_good_inference(limited)


def test_a_large_body_that_stalls_is_408(limited):
    conn = RawConnection(limited.http_port)
    try:
        conn.send(f"POST {INFER} HTTP/1.1\r\nHost: test\r\nContent-Length: 500000\r\n\r\n".encode())
        conn.send(b" " * 100_000)  # well into the part read in place, then nothing
        started = time.monotonic()
        answer = conn.response()
        assert answer.status == 408, answer.body
        assert time.monotonic() - started >= CLIENT_TIMEOUT_S * 0.9
        assert conn.closed_by_server()
    finally:
        conn.close()
    assert_good_inference(limited)


# ---------------------------------------------------------------------------- memory

def test_large_bodies_leave_no_memory_behind(repository, tmp_path):
    """~200 MB bodies answered with an error, and uploads abandoned half-way, one after another and several
    at once: the server's resident memory comes back to near where it started."""
    size = 200_000_000
    server = start_server(repository, tmp_path / "server.log", "--no-strict-readiness",
                          "--model-control-mode", "none", "--http-max-input-size", "300000000")
    try:
        assert_good_inference(server)
        baseline = server.rss_bytes()
        garbage = b"x" * size
        conn = RawConnection(server.http_port, timeout_s=60.0)
        try:
            for _ in range(2):  # received in full, refused by the codec
                conn.send(post(INFER, garbage))
                assert conn.response().status == 400
        finally:
            conn.close()

        def abandon() -> None:
            c = RawConnection(server.http_port, timeout_s=60.0)
            try:
                c.send(f"POST {INFER} HTTP/1.1\r\nHost: test\r\nContent-Length: {size}\r\n\r\n".encode())
                c.send(memoryview(garbage)[:size // 2])
            finally:
                c.close()

        abandon()
        threads = [threading.Thread(target=abandon) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        bound = baseline + 100_000_000
        wait_for(lambda: server.rss_bytes() <= bound, 30.0,
                 f"server RSS back within 100 MB of its {baseline >> 20} MiB baseline "
                 f"(now {server.rss_bytes() >> 20} MiB)")
        assert_good_inference(server)
    finally:
        server.stop()


# ---------------------------------------------------------------------------- graceful shutdown

def test_sigterm_answers_every_request_sent_on_an_open_connection(repository, tmp_path):
    """32 clients loop keep-alive requests while the server gets SIGTERM. A request on a connection the server
    had already answered on must be answered; a new connection refused (or reset before it was ever served)
    never reached the server and is fine."""
    server = start_server(repository, tmp_path / "server.log", "--no-strict-readiness",
                          "--model-control-mode", "none")
    body = infer_body()
    answered = [0] * 32
    lost: list[str] = []
    stop_at = time.monotonic() + 60

    def client(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
        served_here = 0  # answers on the current connection
        try:
            while time.monotonic() < stop_at:
                try:
                    conn.request("POST", INFER, body=body, headers={"Content-Type": "application/json"})
                    response = conn.getresponse()
                    payload = response.read()
                except ConnectionRefusedError:
                    return  # the listener is gone: this request never reached the server
                except (OSError, http.client.HTTPException) as e:
                    if served_here:
                        lost.append(f"client {i}: {e!r} after {served_here} answers on this connection")
                    return
                if response.status not in (200, 503):
                    lost.append(f"client {i}: HTTP {response.status} {payload[:200]!r}")
                    return
                answered[i] += 1
                served_here = 0 if response.will_close else served_here + 1
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(32)]
    try:
        for t in threads:
            t.start()
        wait_for(lambda: min(answered) >= 3, 60.0, "every client to have been answered a few times")
        server.process.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a client hung after SIGTERM"
        returncode = server.process.wait(60)
        assert not lost, "requests lost during shutdown:\n" + "\n".join(lost) + f"\n{server.log()[-3000:]}"
        assert returncode == 0, server.log()
    finally:
        server.stop()
