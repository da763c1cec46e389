"""A client that opens a long OpenAI stream and stops reading, against a real server, in one process and with
`--workers 2` (the file runs both; under HUBSERVE_TEST_WORKERS=2 only the latter). In one process the route
awaits the connection's drain, so the rest of the generation waits in the route as the engine's events and
the connection holds at most the transport's mark; with `--workers 2` the route runs in the engine and the
frontend gives credit back as its connection takes the pieces (engine/workers/credit.py), so the frontend
holds no more than a window either. The generation itself runs on to its max_tokens in both (it is not
paused); a client that reads nothing for --client-timeout-secs is dropped, which aborts what is still
generating and frees its KV blocks.

The streams are raw sockets with a small receive buffer, made large (many prompts and choices) so that what
the server holds beyond the kernel's socket buffers (a few MiB on loopback) shows in the frontend's RSS."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import orjson
import pytest

from conftest import RunningServer, start_server, wait_until
from test_openai_api import MODEL, _metric, build_repository, finished

WORKERS = sorted({os.environ.get("HUBSERVE_TEST_WORKERS", "1"), "2"})
# 192 choices, 76,800 tokens: ~18 MiB of events, ~13 s on a loaded 2-core machine. Without credit the frontend
# held what the kernel's socket buffers did not (16 MiB more RSS for 24 MiB of events); with it, ~2 MiB.
PROMPTS, N, MAX_TOKENS = 12, 16, 400
FRONTEND_GROWTH_BOUND = 6 << 20


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.mktemp("slow_reader") / "repo")


@pytest.fixture(scope="module", params=WORKERS, ids=[f"workers{w}" for w in WORKERS])
def server(request: pytest.FixtureRequest, repo: Path, tmp_path_factory: pytest.TempPathFactory):
    running = start_server(repo, tmp_path_factory.mktemp("slow_reader_log") / "server.log",
                           "--workers", request.param)
    yield running
    running.stop()


def _body(prompts: int, n: int, max_tokens: int) -> bytes:
    return orjson.dumps({"model": MODEL, "prompt": [f"Once upon a time {i}" for i in range(prompts)],
                         "n": n, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                         "stream_options": {"include_usage": True}})


def _open_stalled(server: RunningServer, body: bytes) -> socket.socket:
    """A stream whose client reads the head, then nothing."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # keep the backlog on the server's side
    sock.settimeout(60)
    sock.connect(("127.0.0.1", server.http_port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    head = b""
    while b"\r\n\r\n" not in head:
        piece = sock.recv(1)
        assert piece, f"closed before the head: {head!r}"
        head += piece
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"Transfer-Encoding: chunked" in head, head
    return sock


def _read_to_end(sock: socket.socket) -> list[bytes]:
    """The rest of a chunked event stream: the events' data, in order."""
    got = bytearray()
    while not got.endswith(b"\r\n0\r\n\r\n"):
        piece = sock.recv(1 << 20)
        assert piece, "the stream ended before its last chunk"
        got += piece
    body, rest = bytearray(), memoryview(got)
    while True:  # undo the chunked framing
        size_end = bytes(rest[:16]).index(b"\r\n")
        size = int(bytes(rest[:size_end]), 16)
        if size == 0:
            break
        body += rest[size_end + 2:size_end + 2 + size]
        rest = rest[size_end + 4 + size:]
    events = bytes(body).split(b"\n\n")  # each of ours is one `data:` line (sse.py), then a blank line
    assert events[-1] == b"" and all(e.startswith(b"data: ") for e in events[:-1])
    return [e[6:] for e in events[:-1]]


def _frontends_rss(server: RunningServer) -> int:
    pid = server.process.pid
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        children = [int(p) for p in f.read().split()]
    total = 0
    for child in children:
        with open(f"/proc/{child}/status") as f:
            total += next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    return total


def _workers(server: RunningServer) -> int:
    args = server.process.args
    return int(args[args.index("--workers") + 1])  # type: ignore[union-attr]


def test_a_stalled_stream_waits_in_the_engine_and_arrives_whole_when_read(server: RunningServer):
    with _open_stalled(server, _body(2, 2, 32)) as warm:  # the first stream's allocations, before measuring
        _read_to_end(warm)
    tokens = _metric(server, "hubserve_generation_tokens_total")
    lengths = finished(server, "length")
    split = _workers(server) > 1
    before = _frontends_rss(server) if split else 0
    with _open_stalled(server, _body(PROMPTS, N, MAX_TOKENS)) as sock:
        # nobody reads: the generation still runs to its end (as in one process), the events wait
        wait_until(lambda: finished(server, "length") == lengths + PROMPTS * N, "the generation never ended",
                   timeout_s=120)
        assert _metric(server, "hubserve_generation_tokens_total") == tokens + PROMPTS * N * MAX_TOKENS
        if split:
            grown = _frontends_rss(server) - before
            assert grown < FRONTEND_GROWTH_BOUND, f"the frontends grew {grown / 2**20:.1f} MiB, stalled"
        events = _read_to_end(sock)  # reading resumes: everything arrives, in order
    assert events[-1] == b"[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == PROMPTS * N * MAX_TOKENS
    reasons = {c["choices"][0]["index"]: c["choices"][0]["finish_reason"] for c in chunks[:-1]
               if c["choices"][0]["finish_reason"] is not None}
    assert reasons == {i: "length" for i in range(PROMPTS * N)}
    assert _metric(server, "hubserve_generation_kv_blocks_used") == 0


ENGINE_GAUGES = ["hubserve_generation_running_sequences", "hubserve_generation_waiting_sequences",
                 "hubserve_generation_kv_blocks_used"]


@pytest.fixture(scope="module")
def impatient(server: RunningServer, repo: Path,
              tmp_path_factory: pytest.TempPathFactory):
    """A server like `server` whose clients may leave answers unread for one second."""
    running = start_server(repo, tmp_path_factory.mktemp("slow_reader_timeout_log") / "server.log",
                           "--workers", str(_workers(server)), "--client-timeout-secs", "1")
    yield running
    running.stop()


def test_a_stalled_stream_past_the_client_timeout_is_dropped_and_its_blocks_freed(impatient: RunningServer):
    server = impatient
    with _open_stalled(server, _body(1, 1, 8)) as warm:  # the engine is built on first use
        _read_to_end(warm)
    aborts = finished(server, "abort")
    tokens = _metric(server, "hubserve_generation_tokens_total")
    # 1024 choices of 480 tokens: far more than generates before the timeout (tens of seconds on 2 cores)
    with _open_stalled(server, _body(64, 16, 480)) as sock:
        wait_until(lambda: finished(server, "abort") > aborts, "the stalled stream was never aborted")
        # the loop hands the engine thread the 1024 choices' aborts one by one, and the thread may wake
        # between two: it then admits waiting choices whose aborts are still to come, so the blocks can be
        # all free for a moment while seats fill again. What must hold is where it ends: nothing running,
        # nothing waiting, no block held, read together
        wait_until(lambda: set(server.metric_values(ENGINE_GAUGES, MODEL).values()) == {0.0},
                   "the dropped stream's choices still hold seats, places in line or blocks")
        assert _metric(server, "hubserve_generation_tokens_total") - tokens < 64 * 16 * 480
        rest = bytearray()  # the server dropped us: what the kernel held, then the end, cut short
        while piece := sock.recv(1 << 20):
            rest += piece
        assert not rest.endswith(b"\r\n0\r\n\r\n") and b"data: [DONE]" not in rest
    assert "answers left unread for over 1 s, disconnecting" in server.log()
