"""A running server under abuse (issue 16 item 9): slowloris over both protocols, oversized requests at every
endpoint and RPC, the HTTP/2 floods not covered elsewhere, and garbage bodies to every endpoint of both
protocols. After each case the server must answer a correct inference over HTTP and gRPC (`still_serves`),
and every case counts towards "abuse: N cases tried" at the end of the run.

What other suites already cover is not repeated here:
* test_http_limits.py — one trickled head (408), declared and chunked bodies over the limit on infer
  (413), heads too large (431), stalled bodies, idle connections, unread answers, pipelining, memory;
* test_h2_limits.py — rapid reset, CONTINUATION floods, PING and SETTINGS floods from a client that
  never reads, unread ACKs, abandoned uploads, buffered requests, zero windows, no preface, stalls;
* test_h2.py — a message over the limit on ModelInfer, oversized header lists, decompression bombs;
* test_limits.py — JSON depth, tensor elements, BYTES sizes, concurrent streams, connection floods;
* test_bad_input.py — each malformed inference request, one by one, with its message.

Everything is bounded in count and time; randomness comes from a fixed seed.
"""

from __future__ import annotations

import contextlib
import random
import select
import socket
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from case_counts import tried
from conftest import RunningServer, assert_simple_over_grpc, start_server
from engine.proto import grpc_service_pb2 as gpb
from h2_client import (
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PREFACE,
    PRIORITY,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    RawClient,
    frame,
    grpc_message,
    status_of,
    unwrap,
)
from test_h2 import simple_request
from test_http_limits import RawConnection, assert_good_inference, post

BODY_LIMIT = 1_000_000
MESSAGE_MB = 2
CLIENT_TIMEOUT_S = 1.0
IDLE_TIMEOUT_S = 60.0  # longer than any case's bound: no case is ended by it
ENHANCE_YOUR_CALM = 0xB
SERVICE = "/inference.GRPCInferenceService/"
RPCS = [m.name for m in gpb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods]
SEED = 16


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory):
    srv = start_server(repository, tmp_path_factory.mktemp("abuse") / "server.log", "--no-strict-readiness",
                       "--model-control-mode", "none", "--http-max-input-size", str(BODY_LIMIT),
                       "--max-message-mb", str(MESSAGE_MB), "--client-timeout-secs", str(CLIENT_TIMEOUT_S),
                       "--idle-timeout-secs", str(IDLE_TIMEOUT_S))
    yield srv
    srv.stop()


def both_serve(server: RunningServer) -> None:
    assert server.process.poll() is None, server.log()[-3000:]
    assert_good_inference(server)
    assert_simple_over_grpc(server)


@pytest.fixture(autouse=True)
def still_serves(server):
    """After each case: a correct inference over each protocol, on fresh connections."""
    yield
    both_serve(server)


def wait_closed(sock: socket.socket, seconds: float = 15) -> bytes:
    """Everything the server sends until it closes `sock` (EOF or reset), within `seconds`."""
    got = b""
    deadline = time.monotonic() + seconds
    sock.settimeout(0.5)
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(1 << 16)
        except TimeoutError:
            continue
        except OSError:  # reset: closed with bytes of ours unread
            return got
        if not chunk:
            return got
        got += chunk
    raise AssertionError(f"not closed within {seconds} s; got {got[:200]!r}")


# ------------------------------------------------------------------------------------------------ slowloris

def dribble(socks: list[socket.socket], streams: list[bytes], seconds: float, during) -> list[bytes | None]:
    """Send each socket its bytes one at a time, round-robin, every 50 ms (the attack's own pace; the last
    byte repeats), until the server closes it; `during()` runs once, while all of them are still open.
    Returns, per socket, what the server sent before it closed it, or None if it was still open after
    `seconds`."""
    got = [b""] * len(socks)
    ended = [False] * len(socks)
    sent = [0] * len(socks)
    ran = False
    deadline = time.monotonic() + seconds
    while not all(ended) and time.monotonic() < deadline:
        for i, s in enumerate(socks):
            if not ended[i]:
                try:
                    s.send(streams[i][sent[i]:sent[i] + 1])
                    sent[i] = min(sent[i] + 1, len(streams[i]) - 1)
                except OSError:
                    ended[i] = True
        if not ran:
            during()  # the server serves others while every slow connection is held open
            ran = True
        readable, _, _ = select.select([s for i, s in enumerate(socks) if not ended[i]], [], [], 0.05)
        for s in readable:
            i = socks.index(s)
            try:
                chunk = s.recv(1 << 16)
            except OSError:  # reset: closed with bytes of ours unread
                chunk = b""
            got[i] += chunk
            ended[i] = not chunk
    return [g if e else None for g, e in zip(got, ended, strict=True)]


def test_slowloris_http_many_heads_byte_by_byte_are_each_408_and_others_are_served(server):
    """24 connections each trickle a head that never ends; each gets 408 and is closed within the client
    timeout (plus slack for a loaded machine), while inferences from other clients are answered meanwhile."""
    n = 24
    head = b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: test\r\nX-Pad: " + b"a" * 10_000
    socks = [socket.create_connection(("127.0.0.1", server.http_port), timeout=15) for _ in range(n)]
    started = time.monotonic()
    try:
        answers = dribble(socks, [head] * n, CLIENT_TIMEOUT_S + 15, lambda: both_serve(server))
    finally:
        for s in socks:
            s.close()
    assert None not in answers, f"{answers.count(None)} of {n} slow heads were never answered"
    for answer in answers:
        assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert time.monotonic() - started < CLIENT_TIMEOUT_S + 15
    tried("abuse", n)


def test_slowloris_grpc_prefaces_and_frames_byte_by_byte_are_closed_and_others_are_served(server):
    """16 connections trickle the connection preface: each is closed once the client timeout passes without
    it. 8 more finish the handshake, then trickle one HEADERS frame: a frame that keeps arriving is no
    stall, and opens no stream, but a header block must arrive whole within the client timeout, as an
    HTTP/1.1 head must (found by this test: before, only the idle timeout ended them). Closed well before
    the idle timeout; gRPC and HTTP inferences are answered meanwhile."""
    prefaces = [socket.create_connection(("127.0.0.1", server.grpc_port), timeout=15) for _ in range(16)]
    clients = [RawClient(server.grpc_port) for _ in range(8)]
    for c in clients:
        c.handshake()
    request = clients[0].headers(1, extra=(("x-pad", "p" * 2000),))
    socks = prefaces + [c.sock for c in clients]
    try:
        answers = dribble(socks, [PREFACE + frame(SETTINGS, 0, 0)] * 16 + [request] * 8,
                          CLIENT_TIMEOUT_S + 15, lambda: both_serve(server))
    finally:
        for s in socks:
            s.close()
    assert None not in answers, f"{answers.count(None)} of {len(socks)} slow connections were never closed"
    for answer in answers[16:]:  # the GOAWAY's debug data says why
        assert b"header block not complete within the client timeout" in answer, answer[-200:]
    tried("abuse", len(socks))


# ------------------------------------------------------------------------------------------------ oversized

POST_ENDPOINTS = ["/v2/models/simple/infer", "/v2/models/simple/versions/1/infer",
                  "/v2/models/simple/generate", "/v2/models/simple/generate_stream", "/v2/repository/index",
                  "/v2/repository/models/simple/load", "/v2/repository/models/simple/unload"]


@pytest.mark.parametrize("path", POST_ENDPOINTS)
def test_http_a_body_over_the_limit_is_413_at_every_endpoint(server, path):
    """A body that arrives (not only one declared too long: test_http_limits.py) past the limit, at every
    endpoint that reads one."""
    conn = RawConnection(server.http_port)
    try:
        body = b'{"inputs": "' + b"x" * BODY_LIMIT + b'"}'
        with contextlib.suppress(OSError):  # the server may answer and close before it has read it all
            conn.send(post(path, body))
        answer = conn.response()
        assert answer.status == 413, (path, answer.status, answer.body[:200])
        assert "--http-max-input-size" in answer.error()
    finally:
        conn.close()
    tried("abuse")


@pytest.mark.parametrize("rpc", RPCS)
def test_grpc_a_message_over_the_limit_is_resource_exhausted_on_every_rpc(server, rpc):
    """The 5-byte gRPC prefix declares a message one byte over the limit; each RPC refuses it from the prefix
    alone, without the body, and the connection serves on (test_h2.py covers ModelInfer with the body)."""
    c = RawClient(server.grpc_port)
    try:
        c.handshake()
        c.send(c.headers(1, SERVICE + rpc), frame(DATA, 0, 1, struct.pack(">BI", 0, (MESSAGE_MB << 20) + 1)))
        status, message = status_of(c, 1)
        assert status == "8", (rpc, status, message)  # RESOURCE_EXHAUSTED
        c.call(3, simple_request())
        assert status_of(c, 3)[0] == "0"
    finally:
        c.close()
    tried("abuse")


def test_http_many_header_fields_and_one_huge_header_value_over_grpc(server):
    """The HTTP/2 header list over the limit spread across many small fields (test_h2.py sends one large
    one): the stream is refused, the connection serves on."""
    c = RawClient(server.grpc_port)
    try:
        c.handshake()
        extra = tuple((f"x-f{i}", "v" * 40) for i in range(600))  # ~26 KiB of header list, in 600 fields
        c.send(c.headers(1, extra=extra, end_stream=True))
        status, _ = status_of_or_reset(c, 1)
        assert status != "0"
        c.call(3, simple_request())
        assert status_of(c, 3)[0] == "0"
    finally:
        c.close()
    tried("abuse")


def status_of_or_reset(c: RawClient, stream_id: int) -> tuple[str, str]:
    """The stream's grpc-status, or ("RST", code) when the server reset it instead."""
    decoder = c.decoder
    while True:
        got = c.read()
        assert got is not None, "connection closed"
        kind, flags, sid, payload = got
        if sid != stream_id:
            continue
        if kind == RST_STREAM:
            return "RST", str(int.from_bytes(payload, "big"))
        if kind == HEADERS and flags & END_STREAM:
            trailers = dict(decoder.decode(payload))
            return trailers.get("grpc-status", ""), trailers.get("grpc-message", "")
        if kind == HEADERS:
            decoder.decode(payload)


# -------------------------------------------------------------------------------------------- HTTP/2 floods

def flood_until_closed(c: RawClient, chunk: bytes, times: int) -> int:
    for i in range(times):
        try:
            c.sock.sendall(chunk)
        except OSError:
            return i
    return times


def goaway_or_end(c: RawClient, seconds: float = 20) -> int | None:
    """The GOAWAY code the server sent, reading (and so acknowledging nothing) until it or the end; None if
    the connection ended without one, or is still open after `seconds` with nothing more to read."""
    c.sock.settimeout(seconds)
    try:
        while (got := c.read()) is not None:
            if got[0] == GOAWAY:
                return int.from_bytes(got[3][4:8], "big")
    except TimeoutError:
        return None
    return None


FLOODS = {
    # CVE-2019-9513 "resource loop": PRIORITY frames cost nothing to send; they are counted as empty frames
    "PRIORITY": (lambda c: frame(PRIORITY, 0, 1, b"\0\0\0\0\x10"), 2000, ENHANCE_YOUR_CALM),
    # frame types the server does not know are ignored (RFC 9113 §5.5), and counted
    "unknown frame type": (lambda c: frame(0x42, 0, 0, b"x" * 8), 2000, ENHANCE_YOUR_CALM),
    # CVE-2019-9518 "empty frames": DATA without payload on an open stream
    "empty DATA": (lambda c: frame(DATA, 0, 1), 2000, ENHANCE_YOUR_CALM),
}


@pytest.mark.parametrize("make, times, code", FLOODS.values(), ids=FLOODS.keys())
def test_h2_frames_that_carry_nothing_flood_gets_enhance_your_calm(server, make, times, code):
    c = RawClient(server.grpc_port)
    try:
        c.handshake()
        c.send(c.headers(1))  # a stream open, for the floods on a stream
        flood_until_closed(c, make(c) * 50, times // 50 * 2)  # twice the limit; sent before it is read
        assert goaway_or_end(c) in (code, None)  # (None: reset before it was read)
    finally:
        c.close()
    tried("abuse")


def test_h2_window_update_flood_is_harmless(server):
    """20,000 one-byte WINDOW_UPDATEs on the connection (they carry something: credit), then a request on the
    same connection is answered."""
    c = RawClient(server.grpc_port)
    try:
        c.handshake()
        for _ in range(20):
            c.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1)) * 1000)
        c.call(1, simple_request())
        assert status_of(c, 1)[0] == "0"
    finally:
        c.close()
    tried("abuse")


def test_h2_data_dribble_of_one_byte_frames_is_answered(server):
    """CVE-2019-9511 "data dribble": a legal request in one-byte DATA frames is answered correctly."""
    c = RawClient(server.grpc_port)
    try:
        c.handshake()
        c.send(c.headers(1))
        c.send_data(1, grpc_message(simple_request()), frame_bytes=1)
        headers, data, trailers = c.response(1)
        assert trailers.get("grpc-status") == "0", trailers
        response = gpb.ModelInferResponse.FromString(unwrap(data))
        assert np.frombuffer(response.raw_output_contents[0], np.int32).tolist() == list(range(0, 32, 2))
    finally:
        c.close()
    tried("abuse")


def test_h2_zero_length_header_names_are_refused(server):
    """CVE-2019-9516: HPACK literals with empty names and values; the stream or connection is refused."""
    c = RawClient(server.grpc_port)
    try:
        c.handshake()
        block = c.encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", SERVICE + "ModelInfer"),
                                  (":authority", "x"), ("content-type", "application/grpc")])
        empty = b"\x00\x00\x00" * 200  # literal without indexing, new name: name length 0, value length 0
        c.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, block + empty))
        got = status_of_or_reset(c, 1)
        assert got[0] != "0", got
    except AssertionError as e:
        if "connection closed" not in str(e):  # a GOAWAY is as good a refusal
            raise
    finally:
        c.close()
    tried("abuse")


# ------------------------------------------------------------------------------------------------ garbage

GARBAGE_SIZES = (1, 7, 64, 1000, 60_000)
HTTP_ENDPOINTS = [("POST", p) for p in POST_ENDPOINTS] + [
    ("GET", "/v2"), ("GET", "/v2/health/ready"), ("GET", "/v2/models/simple"),
    ("GET", "/v2/models/simple/config"),
    ("GET", "/v2/models/simple/stats"), ("POST", "/v2/systemsharedmemory/register"),
    ("POST", "/v2/cudasharedmemory/register"), ("POST", "/v2/logging"), ("POST", "/v2/trace/setting"),
    ("POST", "/v2/models/simple/trace/setting"), ("POST", "/v2/nonsense")]


def garbage(rng: random.Random, size: int) -> bytes:
    return bytes(rng.getrandbits(8) for _ in range(size))


@pytest.mark.parametrize("method, path", HTTP_ENDPOINTS, ids=[f"{m} {p}" for m, p in HTTP_ENDPOINTS])
def test_http_garbage_bodies_at_every_endpoint_are_answered_not_crashed(server, method, path):
    """Random bytes of several sizes as the body (and as the binary-extension header length, half the
    time): each answered on the same keep-alive connection with a status and a JSON error or a result,
    never the catch-all of a bug (500 "internal error")."""
    rng = random.Random(f"{SEED} {method} {path}")
    conn = RawConnection(server.http_port)
    try:
        for size in GARBAGE_SIZES:
            body = garbage(rng, size)
            extra = (f"Inference-Header-Content-Length: {rng.randrange(size + 2)}\r\n"
                     if rng.random() < 0.5 else "")
            conn.send(f"{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
                      .encode() + body)
            answer = conn.response()
            assert answer.status < 500 or b"internal error" not in answer.body, (size, answer.body[:300])
            assert answer.status != 500, (size, answer.status, answer.body[:300])
            tried("abuse")
    finally:
        conn.close()


@pytest.mark.parametrize("rpc", RPCS)
def test_grpc_garbage_messages_on_every_rpc_are_answered_not_crashed(server, rpc):
    """Random bytes of several sizes as the message of each RPC, on one connection: each ends with a status
    (most often INTERNAL "could not parse the request message", as grpc answers), never the catch-all of
    a bug ("internal error"), and the connection serves on."""
    rng = random.Random(f"{SEED} {rpc}")
    c = RawClient(server.grpc_port)
    try:
        c.handshake()
        for i, size in enumerate(GARBAGE_SIZES):
            sid = 2 * i + 1
            c.call(sid, garbage(rng, size), SERVICE + rpc)
            status, message = status_of(c, sid)
            assert status.isdigit() and status != "2", (rpc, size, status, message)  # 2: UNKNOWN
            assert not message.startswith("internal error"), (rpc, size, message)
            tried("abuse")
        c.call(99, simple_request())
        assert status_of(c, 99)[0] == "0"
    finally:
        c.close()


def test_http_garbage_instead_of_a_request_head(server):
    """Random bytes where a request line should be: answered 400 or closed, and the server serves on."""
    rng = random.Random(SEED)
    for size in GARBAGE_SIZES[:4]:
        s = socket.create_connection(("127.0.0.1", server.http_port), timeout=15)
        try:
            s.sendall(garbage(rng, size) + b"\r\n\r\n")
            answer = wait_closed(s, 15)
            assert answer == b"" or answer.startswith(b"HTTP/1.1 4"), answer[:200]
        finally:
            s.close()
        tried("abuse")
    assert_good_inference(server)


def test_h2_garbage_after_the_preface_is_goaway(server):
    """Random bytes where frames should be: a connection error (GOAWAY) or a close, never a hang."""
    rng = random.Random(SEED)
    for size in GARBAGE_SIZES[:4]:
        c = RawClient(server.grpc_port)
        try:
            c.send(garbage(rng, size))
            code = goaway_or_end(c)
            assert code is None or code != 0, code
        finally:
            c.close()
        tried("abuse")

