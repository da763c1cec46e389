"""The one way an HTTP/1.1 answer streams (engine/frontend/http/types.py ResponseStream), seen from raw
sockets, for both of its users: generate_stream (the decoupled example `repeat_stream`) and the OpenAI API
(`tiny_decoder`).
- framing: chunked on a connection that stays open, close-delimited for an HTTP/1.0 client (RFC 9112 §6.3);
- the access policy's admission lives as long as the stream: a key's max_concurrent counts open streams;
- back-pressure: a client that reads slowly gets every event, in order, and its connection serves on; one
  that stops reading is dropped after --client-timeout-secs, and its stream is cancelled (the model's
  instance is free again; the generation's KV blocks are freed).
Every test holds under HUBSERVE_TEST_WORKERS=2 (then /v1 streams come back from the engine process and the
key's max_concurrent is split between the two frontends).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time

import pytest

from conftest import EXAMPLES, RunningServer, start_server
from engine.frontend.http.sse import EventReader
from hubserve_models import examples

MODEL = "tiny_decoder"
WORKERS = int(os.environ.get("HUBSERVE_TEST_WORKERS", "1"))
CLIENT_TIMEOUT_SECS = 3
ONE = "Bearer one-at-a-time"  # max_concurrent: one stream per frontend process
FREE = "Bearer free"
KEYS = f"""
keys:
  - key: "one-at-a-time"
    groups: [inference]
    max_concurrent: {WORKERS}
  - key: "free"
    groups: ["*"]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("http_streams")
    repo = root / "repo"
    (repo / MODEL).mkdir(parents=True)
    shutil.copy(EXAMPLES / MODEL / "config.pbtxt", repo / MODEL / "config.pbtxt")
    examples.build_repository(repo, [MODEL])
    shutil.copytree(EXAMPLES / "repeat_stream", repo / "repeat_stream")
    (root / "keys.yaml").write_text(KEYS)
    (root / "keys.yaml").chmod(0o600)  # private, or the server refuses it
    srv = start_server(repo, root / "server.log", "--canary-interval-secs", "0", "--api-keys",
                       str(root / "keys.yaml"), "--client-timeout-secs", str(CLIENT_TIMEOUT_SECS),
                       ready_timeout=120)
    yield srv
    srv.stop()


def _request(server: RunningServer, path: str, doc: dict, key: str = FREE, version: bytes = b"HTTP/1.1",
             extra: bytes = b"", rcvbuf: int = 0) -> socket.socket:
    body = json.dumps(doc).encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:  # set before connecting, so the window the server sees is small from the start
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", server.http_port))
    sock.sendall(b"POST %s %s\r\nHost: x\r\nAuthorization: %s\r\nContent-Type: application/json\r\n%s"
                 b"Content-Length: %d\r\n\r\n%s"
                 % (path.encode(), version, key.encode(), extra, len(body), body))
    return sock


def _chat(max_tokens: int, **more) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
            "stream": True, "ignore_eos": True, **more}


def _read_until(sock: socket.socket, got: bytes, end: bytes, pause_s: float = 0.0,
                size: int = 65536) -> bytes:
    while not got.endswith(end):
        piece = sock.recv(size)
        assert piece, got[-300:]
        got += piece
        if pause_s:
            time.sleep(pause_s)  # a slow reader (what is tested), not synchronisation
    return got


def _dechunk(body: bytes) -> bytes:
    out, rest = b"", body
    while True:
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            assert rest == b"\r\n", rest[:100]
            return out
        out, rest = out + rest[:size], rest[size + 2:]


def _events(body: bytes) -> list[bytes]:
    return list(EventReader().feed(body))


def _wait_for(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _metric(server: RunningServer, name: str) -> float:
    return server.metric(name, MODEL)


@pytest.mark.parametrize("connection", [b"", b"Connection: keep-alive\r\n"], ids=["plain", "keep-alive"])
def test_an_http10_client_gets_a_close_delimited_chat_stream(server: RunningServer, connection: bytes):
    """HTTP/1.0 has no chunks (RFC 9112 §7.1): even one that asked to keep the connection gets the stream
    close-delimited, and the connection closed after it."""
    sock = _request(server, "/v1/chat/completions", _chat(12), version=b"HTTP/1.0", extra=connection)
    got = b""
    while piece := sock.recv(65536):  # the body ends with our FIN
        got += piece
    sock.close()
    head, body = got.split(b"\r\n\r\n", 1)
    lower = head.lower()
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"text/event-stream" in lower, head
    assert b"transfer-encoding" not in lower and b"content-length" not in lower, head
    assert b"connection: close" in lower and b"x-request-id: chatcmpl-" in lower, head
    events = _events(body)
    assert events[-1] == b"[DONE]" and body.endswith(b"data: [DONE]\n\n"), body[-200:]
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_a_keep_alive_chat_stream_is_chunked_and_the_connection_serves_on(server: RunningServer):
    sock = _request(server, "/v1/chat/completions", _chat(6))
    got = _read_until(sock, b"", b"\r\n0\r\n\r\n")
    head, body = got.split(b"\r\n\r\n", 1)
    assert b"Transfer-Encoding: chunked" in head and b"Connection: close" not in head, head
    assert _events(_dechunk(body))[-1] == b"[DONE]"
    body2 = json.dumps({"IN": [4, 5]}).encode()
    sock.sendall(b"POST /v2/models/repeat_stream/generate_stream HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (FREE.encode(), len(body2), body2))
    got = _read_until(sock, b"", b"\r\n0\r\n\r\n")
    sock.close()
    assert [json.loads(e)["OUT"] for e in _events(_dechunk(got.split(b"\r\n\r\n", 1)[1]))] == [4, 5]


def test_a_keys_concurrency_slot_is_held_for_a_streams_life(server: RunningServer):
    """max_concurrent 1 per frontend process: while a key's streams run, no more of them than that are
    served; the one past it is refused 429; once they have ended, the key is served again. (Before, the
    OpenAI path gave the slot back when the stream's head went out, so any number of streams ran at once.)
    With --workers 2 connections usually spread over both frontends, but the engine's view of who has
    fewest may lag, so the test asks for one stream more than the key's limit and counts."""
    streams, refusals = [], []
    for _ in range(WORKERS + 1):
        # ~1 MB of events into a 4 KiB receive window, read only later: each stream outlasts the check
        sock = _request(server, "/v1/chat/completions", _chat(480, n=8), key=ONE, rcvbuf=4096)
        got = _read_until(sock, b"", b"\r\n\r\n", size=1)  # its head is out: the stream has begun
        if got.startswith(b"HTTP/1.1 200 OK\r\n"):
            streams.append((sock, got))
            continue
        length = int(got.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
        while len(got.split(b"\r\n\r\n", 1)[1]) < length:
            got += sock.recv(65536)
        sock.close()
        refusals.append(got)
    assert 1 <= len(streams) <= WORKERS and refusals, (len(streams), refusals)
    for answer in refusals:
        assert answer.startswith(b"HTTP/1.1 429 "), answer
        assert b"Retry-After:" in answer and b"max_concurrent" in answer, answer
    for sock, got in streams:  # each stream runs to its end, then gives its slot back
        got = _read_until(sock, got, b"\r\n0\r\n\r\n", size=1 << 20)
        assert _events(_dechunk(got.split(b"\r\n\r\n", 1)[1]))[-1] == b"[DONE]"
        sock.close()
    for _ in range(WORKERS):  # the slots are free again (one stream at a time, on a fresh connection)
        sock = _request(server, "/v1/chat/completions", _chat(3), key=ONE)
        got = _read_until(sock, b"", b"\r\n0\r\n\r\n")
        sock.close()
        assert got.startswith(b"HTTP/1.1 200 OK\r\n"), got[:300]


def test_a_slow_reader_of_a_generate_stream_gets_every_event_in_order(server: RunningServer):
    values = list(range(3000))  # ~300 KB of events: far more than a small receive window holds
    sock = _request(server, "/v2/models/repeat_stream/generate_stream", {"IN": values}, rcvbuf=4096)
    got = _read_until(sock, b"", b"\r\n0\r\n\r\n", pause_s=0.001, size=4096)
    events = [json.loads(e) for e in _events(_dechunk(got.split(b"\r\n\r\n", 1)[1]))]
    assert [e["OUT"] for e in events] == values and [e["IDX"] for e in events] == values
    body = json.dumps({"IN": [7]}).encode()  # the connection serves on after the stream
    sock.sendall(b"POST /v2/models/repeat_stream/generate_stream HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (FREE.encode(), len(body), body))
    got = _read_until(sock, b"", b"\r\n0\r\n\r\n")
    sock.close()
    assert [json.loads(e)["OUT"] for e in _events(_dechunk(got.split(b"\r\n\r\n", 1)[1]))] == [7]


def test_a_slow_reader_of_a_chat_stream_gets_every_event_in_order(server: RunningServer):
    sock = _request(server, "/v1/chat/completions", _chat(480, n=4), rcvbuf=4096)
    got = _read_until(sock, b"", b"\r\n0\r\n\r\n", pause_s=0.001, size=4096)
    sock.close()
    chunks = [json.loads(e) for e in _events(_dechunk(got.split(b"\r\n\r\n", 1)[1]))[:-1]]
    finished = sorted(c["index"] for chunk in chunks for c in chunk["choices"] if c["finish_reason"])
    assert finished == [0, 1, 2, 3] and all(c["finish_reason"] == "length" for chunk in chunks
                                            for c in chunk["choices"] if c["finish_reason"])


def test_a_generate_stream_reader_that_stops_is_dropped_and_the_model_freed(server: RunningServer):
    drops = _drops(server)
    sock = _request(server, "/v2/models/repeat_stream/generate_stream",
                    {"IN": list(range(50_000))}, rcvbuf=4096)  # ~5 MB of events, as fast as it can
    assert sock.recv(1024).startswith(b"HTTP/1.1 200 OK\r\n")
    started = time.monotonic()
    # We read no more: the server's writes back up, and after --client-timeout-secs it drops us.
    _wait_for_drop(server, sock, drops)
    assert time.monotonic() - started >= CLIENT_TIMEOUT_SECS - 1
    # The model's request was cancelled: its one instance answers the next one.
    again = _request(server, "/v2/models/repeat_stream/generate_stream", {"IN": [1, 2]})
    got = _read_until(again, b"", b"\r\n0\r\n\r\n")
    again.close()
    assert [json.loads(e)["OUT"] for e in _events(_dechunk(got.split(b"\r\n\r\n", 1)[1]))] == [1, 2]


def test_a_completion_stream_reader_that_stops_is_dropped_and_the_stream_let_go(server: RunningServer):
    """Megabytes of events (4 prompts × 16 choices × 480 tokens, more than the kernel's buffers hold), none
    read: the stream waits on the client, which is dropped after the client timeout; the generation (stopped,
    or done by then: the example model is fast) holds no KV blocks, and the server streams on."""
    drops = _drops(server)
    doc = {"model": MODEL, "prompt": ["a", "b", "c", "d"], "n": 16, "max_tokens": 480, "ignore_eos": True,
           "stream": True}
    sock = _request(server, "/v1/completions", doc, rcvbuf=4096)
    assert sock.recv(1024).startswith(b"HTTP/1.1 200 OK\r\n")
    started = time.monotonic()
    _wait_for_drop(server, sock, drops)
    assert time.monotonic() - started >= CLIENT_TIMEOUT_SECS - 1
    _wait_for(lambda: _metric(server, "hubserve_generation_running_sequences") == 0, "still running")
    _wait_for(lambda: _metric(server, "hubserve_generation_kv_blocks_used") == 0, "blocks not freed")
    sock = _request(server, "/v1/chat/completions", _chat(3))
    got = _read_until(sock, b"", b"\r\n0\r\n\r\n")
    sock.close()
    assert _events(_dechunk(got.split(b"\r\n\r\n", 1)[1]))[-1] == b"[DONE]"


def _wait_for_drop(server: RunningServer, sock: socket.socket, drops_before: int) -> None:
    """Wait, reading nothing, until the server has dropped the connection (bounded). The server says so in
    its log: the client cannot see it, since the kernel still holds the bytes it could not send, and their
    FIN behind them, for a window that never opens."""
    _wait_for(lambda: _drops(server) > drops_before, "the server never dropped a client that stopped reading",
              timeout=CLIENT_TIMEOUT_SECS * 10)
    sock.close()


def _drops(server: RunningServer) -> int:
    return server.log().count("left unread for over")
