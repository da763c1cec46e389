"""What the h2 gRPC frontend does to clients that abuse it (issue 10): floods of frames that carry no request,
peers that never read, abandoned uploads, stalls. One hole per test, against a real server started with short
timeouts; after each, another connection still gets a correct inference from `simple`.

The raw client (tests/h2_client.py) sends exactly the frames each attack needs. Where the point is memory, the
server's resident size (/proc/<pid>/status VmRSS) must come back within a bound.
"""

from __future__ import annotations

import socket
import struct
import time

import numpy as np
import pytest

from conftest import assert_simple_over_grpc, start_server, wait_until
from h2_client import (
    CANCEL,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    PING,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    RawClient,
    frame,
    grpc_message,
    status_of,
)
from test_h2 import build_repository, echo_request, simple_request, stats

ENHANCE_YOUR_CALM, NO_ERROR, REFUSED_STREAM = 0xB, 0x0, 0x7
MAX_MESSAGE_BYTES = 8 << 20  # so a connection may buffer 16 MiB of requests, and queue 16 MiB of answers
CLIENT_TIMEOUT_SECS = 1.5
IDLE_TIMEOUT_SECS = 3.0


@pytest.fixture(scope="module")
def server(tmp_path_factory, repository):
    root = build_repository(tmp_path_factory.mktemp("limits_repository"), repository)
    srv = start_server(root, tmp_path_factory.mktemp("limits") / "server.log",
                       "--max-message-mb", str(MAX_MESSAGE_BYTES >> 20), "--model-control-mode", "none",
                       "--client-timeout-secs", str(CLIENT_TIMEOUT_SECS),
                       "--idle-timeout-secs", str(IDLE_TIMEOUT_SECS))
    yield srv
    srv.stop()


@pytest.fixture(autouse=True)
def still_serves(server):
    """After each attack: a correct inference on `simple` from a fresh connection."""
    yield
    assert_simple_over_grpc(server)


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def send_until_closed(c: RawClient, chunk: bytes, times: int) -> int:
    """Send `chunk` up to `times` times; how many went before the server closed the connection."""
    for i in range(times):
        try:
            c.sock.sendall(chunk)
        except OSError:  # reset or broken pipe: the server is gone
            return i
    return times


def goaway_code(c: RawClient) -> int | None:
    """The error code of the server's GOAWAY, reading until it (None if the connection ended without one)."""
    while (got := c.read()) is not None:
        if got[0] == GOAWAY:
            return int.from_bytes(got[3][4:8], "big")
    return None


def closed(c: RawClient) -> bool:
    """Reads what is left; True once the server has closed."""
    c.sock.settimeout(10)
    try:
        while c.sock.recv(1 << 20):
            pass
    except OSError:
        pass
    return True


# ------------------------------------------------------------------------------------------------ floods

def test_rapid_reset_gets_enhance_your_calm_and_counts_no_failures(server):
    failed_before = stats(server, "simple")["fail"]["count"]
    c = RawClient(server.grpc_port)
    c.handshake()
    message = frame(DATA, END_STREAM, 0, grpc_message(simple_request()))[9:]
    rounds = []
    for i in range(5000):  # the limit is 2,000 resets per 10 s
        sid = 2 * i + 1
        rounds.append(c.headers(sid) + frame(DATA, END_STREAM, sid, message) +
                      frame(RST_STREAM, 0, sid, struct.pack(">I", CANCEL)))
    sent = 0
    for start in range(0, len(rounds), 250):
        if send_until_closed(c, b"".join(rounds[start:start + 250]), 1) == 0:
            break
        sent += 250
    assert goaway_code(c) == ENHANCE_YOUR_CALM
    assert sent < 5000 or "streams reset by the client" in server.log()
    assert stats(server, "simple")["fail"]["count"] == failed_before


def test_empty_continuation_flood_gets_enhance_your_calm(server):
    c = RawClient(server.grpc_port)
    c.handshake()
    block = c.headers(1)[9:]
    c.send(frame(HEADERS, 0, 1, block))
    assert send_until_closed(c, frame(CONTINUATION, 0, 1) * 1000, 1000) < 1000
    assert goaway_code(c) in (ENHANCE_YOUR_CALM, None)  # (None: reset before it was read)
    assert "header block in more than" in server.log()


def test_long_continuation_chain_is_refused(server):
    c = RawClient(server.grpc_port)
    c.handshake()
    block = c.headers(1, end_stream=True)[9:]
    frames = [frame(HEADERS, END_STREAM, 1, block[:1])]
    frames += [frame(CONTINUATION, 0, 1, block[i:i + 1]) for i in range(1, len(block) - 1)]
    frames.append(frame(CONTINUATION, END_HEADERS, 1, block[-1:]))
    assert len(frames) > 16
    c.send(*frames)
    assert goaway_code(c) == ENHANCE_YOUR_CALM


@pytest.mark.parametrize("flood, log_text", [(frame(PING, 0, 0, b"12345678"), "PINGs in"),
                                             (frame(SETTINGS, 0, 0), "SETTINGS in")],
                         ids=["PING", "SETTINGS"])
def test_control_flood_from_a_client_that_never_reads_is_closed(server, flood, log_text):
    before = server.rss_bytes()
    c = RawClient(server.grpc_port)  # it never reads: every answer stays with the server
    # 2,000,000 frames at most (36 MB): more than the kernel buffers of a peer that stops reading hold, so
    # a send fails once the server has closed, however late it got to read
    assert send_until_closed(c, flood * 2000, 2000) < 2000
    assert closed(c)
    assert log_text in server.log()
    assert server.rss_bytes() < before + (50 << 20)


def test_acks_queued_for_a_peer_that_does_not_read_are_limited(server):
    """Within the PING rate limit, but while an 7 MiB answer sits unread: after 100 ACKs the server drops the
    connection instead of queueing more."""
    c = RawClient(server.grpc_port, settings={INITIAL_WINDOW_SIZE: 0x7FFFFFFF})
    c.handshake()
    c.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0x7FFFFFFF - 65535)))
    c.call(1, echo_request(np.ones((7 << 20) // 4, np.float32)))  # the answer fills every buffer on the way
    pings_sent = 0
    deadline = time.monotonic() + 5
    while "control frames to answer while our answers are not read" not in server.log():
        assert time.monotonic() < deadline and pings_sent < 900, "ACKs kept being queued"
        if send_until_closed(c, frame(PING, 0, 0, b"12345678") * 20, 1) == 0:
            wait_for(lambda: "are not read" in server.log(), 10, "closed, but not for unread ACKs")
            break
        pings_sent += 20
        time.sleep(0.01)  # a steady trickle, well under the PING rate limit
    assert closed(c)


# ------------------------------------------------------------------------------------------------ memory

def abandon_large_messages(port: int, streams: int, declared: int, sent: int) -> RawClient:
    """A client that declares `declared`-byte messages on `streams` streams and sends `sent` bytes of each."""
    c = RawClient(port)
    c.handshake()
    for i in range(streams):
        sid = 2 * i + 1
        c.send(c.headers(sid))
        c.send_data(sid, struct.pack(">BI", 0, declared) + b"\x01" * sent, end_stream=False)
    return c


def test_abandoned_large_messages_give_their_memory_back(tmp_path, repository):
    """Its own server: the module's resets a stalled message after 1.5 s (--client-timeout-secs), which
    under load freed the first clients' bytes before the last had sent theirs (the 40 MiB was never held at
    once), and a fresh process has no freed heap from earlier tests for the uploads to reuse unseen."""
    srv = start_server(build_repository(tmp_path / "repository", repository), tmp_path / "server.log",
                       "--max-message-mb", str(MAX_MESSAGE_BYTES >> 20), "--model-control-mode", "none",
                       "--client-timeout-secs", "600")
    try:
        before = srv.rss_bytes()
        clients = [abandon_large_messages(srv.grpc_port, 2, 7 << 20, 6 << 20) for _ in range(6)]
        # sendall returns once the kernel has the bytes (a loopback socket buffers megabytes), not once the
        # server has read them: wait for the server to hold what was sent
        wait_until(lambda: srv.rss_bytes() - before > 40 << 20,
                   "the server to hold 40 MiB of the 72 sent (else the test is not testing)", 60)
        for c in clients:
            c.close()
        wait_for(lambda: srv.rss_bytes() < before + (20 << 20), 60,
                 f"RSS stayed at {srv.rss_bytes() >> 20} MiB after the clients left (was {before >> 20})")
    finally:
        srv.stop()


def test_requests_buffered_on_one_connection_are_capped(server):
    c = RawClient(server.grpc_port)
    c.handshake()
    for sid in (1, 3):  # 2 × 7 MiB declared: within the 16 MiB a connection may buffer
        c.send(c.headers(sid), frame(DATA, 0, sid, struct.pack(">BI", 0, 7 << 20) + b"x" * 100))
    c.send(c.headers(5), frame(DATA, 0, 5, struct.pack(">BI", 0, 7 << 20) + b"x" * 100))
    status, message = status_of(c, 5)
    assert status == "8" and "buffered on this connection" in message
    c.send(frame(RST_STREAM, 0, 1, struct.pack(">I", CANCEL)))  # freed: the budget is given back
    c.send(c.headers(7), frame(DATA, 0, 7, struct.pack(">BI", 0, 7 << 20) + b"x" * 100))
    c.call(9, simple_request())  # small messages pass through without being buffered
    assert status_of(c, 9)[0] == "0"
    c.close()


def test_zero_window_client_sending_requests_is_bounded_and_closed(server):
    before = server.rss_bytes()
    c = RawClient(server.grpc_port, settings={INITIAL_WINDOW_SIZE: 0})
    c.handshake()
    request = echo_request(np.ones(8192, np.float32))  # 32 KiB answers that can never leave
    refused = 0
    try:
        for i in range(700):
            c.call(2 * i + 1, request)
            c.sock.setblocking(False)
            try:
                while (got := c.read()) is not None and got[0] == RST_STREAM:
                    refused += int.from_bytes(got[3], "big") == REFUSED_STREAM
            except BlockingIOError:
                pass
            finally:
                c.sock.settimeout(20)
    except (AssertionError, OSError):
        pass  # closed by the server while we were still sending
    assert goaway_code(c) in (ENHANCE_YOUR_CALM, None)
    assert closed(c)
    assert server.rss_bytes() < before + (100 << 20)
    assert refused or "answers left unread" in server.log()


# ---------------------------------------------------------------------------------------------- timeouts

def test_a_connection_without_preface_is_closed_after_the_client_timeout(server):
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=20) as s:
        try:
            while s.recv(4096):  # the server's SETTINGS, then nothing until it closes
                pass
        except ConnectionResetError:
            pass
    took = time.monotonic() - start
    assert CLIENT_TIMEOUT_SECS - 0.1 <= took < CLIENT_TIMEOUT_SECS + 5, took


def test_an_idle_connection_gets_goaway_then_close(server):
    c = RawClient(server.grpc_port)
    c.handshake()
    c.call(1, simple_request())
    assert status_of(c, 1)[0] == "0"
    start = time.monotonic()
    _, _, _, payload = c.read_until(GOAWAY)
    assert struct.unpack(">II", payload[:8]) == (1, NO_ERROR)  # stream 1 was served; nothing is lost
    assert c.read() is None
    assert IDLE_TIMEOUT_SECS - 1.5 <= time.monotonic() - start < IDLE_TIMEOUT_SECS + 5


def test_a_large_frame_that_stalls_ends_the_connection_after_the_client_timeout(server):
    """A DATA frame of 64 KiB or more is read into a buffer of its own; one that stops arriving holds that
    buffer no longer than a pause in any partial frame: GOAWAY, then the close."""
    c = RawClient(server.grpc_port)
    c.handshake()
    c.send(c.headers(1), frame(DATA, 0, 1, struct.pack(">BI", 0, 500_000) + b"x" * 500_000)[:100_000])
    start = time.monotonic()
    assert goaway_code(c) == NO_ERROR
    assert CLIENT_TIMEOUT_SECS - 0.1 <= time.monotonic() - start < CLIENT_TIMEOUT_SECS + 5
    assert closed(c)


def test_a_stalled_partial_message_is_reset(server):
    c = RawClient(server.grpc_port)
    c.handshake()
    c.send(c.headers(1), frame(DATA, 0, 1, struct.pack(">BI", 0, 1000) + b"x" * 100))
    start = time.monotonic()
    _, _, stream_id, payload = c.read_until(RST_STREAM)
    assert stream_id == 1 and int.from_bytes(payload, "big") == CANCEL
    assert time.monotonic() - start < CLIENT_TIMEOUT_SECS + 5
    c.call(3, simple_request())  # the connection serves on
    assert status_of(c, 3)[0] == "0"
