"""What a gRPC ModelStreamInfer stream and an HTTP generate_stream may hold, against a real server:
- each request on a stream holds its message's bytes of `--max-inflight-bytes` until it is answered, and a
  message that does not fit waits (the stream is not read) instead of failing;
- each request on a stream takes a slot of its key's `max_concurrent` as a unary request does: over it, that
  request is answered with an error on the stream, and the stream goes on;
- a stream with `--grpc-max-stream-requests` requests in flight is not read until one is answered: its
  HTTP/2 window is held (raw h2), the connection's other streams are served meanwhile; a sequence's requests
  are not counted (they wait for slots that only the stream's later messages free), so a stream that
  interleaves more sequences than the cap is read to the end;
- a decoupled model whose client does not read stops sending (its response sender waits), over gRPC and
  HTTP generate_stream: the server's memory stays bounded while the stream is unread and comes back when it
  ends; a client that reads gets every response in order.
After each hostile case the server answers a correct inference on both protocols. Every test holds under
HUBSERVE_TEST_WORKERS=2 (each frontend process then holds its share of the budget and of a key's
max_concurrent, and a connection lands in one of them).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import socket
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb

from conftest import RunningServer, assert_serves_simple, start_server, wait_until
from h2_client import DATA, HEADERS, INITIAL_WINDOW_SIZE, WINDOW_UPDATE, RawClient, frame, grpc_message
from hubserve_harness import EXAMPLES
from python_models import add_simple, write_model

WORKERS = int(os.environ.get("HUBSERVE_TEST_WORKERS", "1"))
MESSAGE_BYTES = 1_000_000
BUDGET_BYTES = 3_500_000  # per frontend process: three messages of MESSAGE_BYTES in flight, not four
STREAM_REQUESTS = 4  # --grpc-max-stream-requests
FREE = "Bearer free"
TWO = "Bearer two"  # max_concurrent: two per frontend process
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
INFER = "/inference.GRPCInferenceService/ModelInfer"

# Answers each request 0.2 s after its batch starts, one batch at a time: what a stream sends stays in flight.
SLOW = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.2)
        sizes = [pb_utils.get_input_tensor_by_name(r, "IN").as_numpy().size for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("N", np.array([n], dtype=np.int64))])
                for n in sizes]
'''
SLOW_CONFIG = '''max_batch_size: 0
input [ { name: "IN" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "N" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("stream_backpressure")
    repo = root / "repo"
    shutil.copytree(EXAMPLES / "repeat_stream", repo / "repeat_stream")
    shutil.copytree(EXAMPLES / "sequence_accumulator", repo / "sequence_accumulator")
    write_model(repo, "slow", SLOW, SLOW_CONFIG)
    add_simple(repo)
    keys = root / "keys.yaml"
    keys.write_text(f'keys:\n  - key: "free"\n    groups: ["*"]\n'
                    f'  - key: "two"\n    groups: ["*"]\n    max_concurrent: {2 * WORKERS}\n')
    keys.chmod(0o600)
    srv = start_server(repo, root / "server.log", "--canary-interval-secs", "0", "--api-keys", str(keys),
                       "--max-inflight-bytes", str(BUDGET_BYTES * WORKERS),
                       "--grpc-max-stream-requests", str(STREAM_REQUESTS), ready_timeout=120)
    yield srv
    srv.stop()


# ------------------------------------------------------------------------------------------------ helpers
class Stream:
    """A tritonclient stream whose answers land in a queue."""

    def __init__(self, server: RunningServer, key: str = FREE) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.results: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)),
                                 headers={"authorization": key})

    def send_slow(self, size: int, request_id: str) -> None:
        x = grpcclient.InferInput("IN", [size], "UINT8")
        x.set_data_from_numpy(np.zeros(size, dtype=np.uint8))
        self.client.async_stream_infer("slow", [x], request_id=request_id)

    def take(self, n: int, during=lambda: None) -> list:
        """`n` answers, calling `during()` while waiting for each (bounded)."""
        got = []
        deadline = time.monotonic() + 60
        while len(got) < n:
            assert time.monotonic() < deadline, f"{len(got)} of {n} answers"
            during()
            with contextlib.suppress(queue.Empty):
                got.append(self.results.get(timeout=0.05))
        return got

    def close(self) -> None:
        self.client.stop_stream(cancel_requests=True)
        self.client.close()


class Peak:
    """The most requests the server had in flight at `slow`, sampled from /metrics."""

    def __init__(self, server: RunningServer) -> None:
        self.server = server
        self.value = 0

    def __call__(self) -> None:
        self.value = max(self.value, int(self.server.metric("nv_inference_pending_request_count", "slow")))


def slow_request(size: int, request_id: str) -> bytes:
    request = pb.ModelInferRequest(model_name="slow", id=request_id)
    request.inputs.add(name="IN", datatype="UINT8", shape=[size])
    request.raw_input_contents.append(bytes(size))
    return request.SerializeToString()


def next_frame(c: RawClient) -> tuple[int, int, int, bytes]:
    got = c.read()
    assert got is not None, "the server closed the connection"
    return got


def response_stats(server: RunningServer, model: str) -> dict:
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/{model}/stats",
                                     headers={"Authorization": FREE})
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.load(r)["model_stats"][0]["response_stats"]


def responses_sent(server: RunningServer) -> int:
    """repeat_stream's responses the engine has seen from the model, all requests together (Triton's
    response_stats: a count per response index)."""
    return sum(v.get("success", {}).get("count", 0) for v in response_stats(server, "repeat_stream").values())


def until_it_stops(count, what: str, every_s: float = 1.0, timeout_s: float = 30.0) -> int:
    """`count()` once two readings `every_s` apart agree (bounded)."""
    deadline = time.monotonic() + timeout_s
    last = count()
    while True:
        time.sleep(every_s)  # the readings are what is tested: does the count stop
        now = count()
        if now == last:
            return now
        assert time.monotonic() < deadline, f"{what}: still growing ({now})"
        last = now


# ------------------------------------------------------------------------------------ hole 5: the budgets

def test_a_stream_holds_each_message_in_the_budget_until_it_is_answered(server: RunningServer) -> None:
    """8 messages of 1 MB on one stream, a budget of 3.5 MB: at most three are in flight at once, the rest
    wait in the client (the stream is not read), and every one is answered, none refused."""
    stream = Stream(server)
    peak = Peak(server)
    try:
        for i in range(8):
            stream.send_slow(MESSAGE_BYTES, f"big-{i}")
        got = stream.take(8, during=peak)
    finally:
        stream.close()
    assert [e for _, e in got if e is not None] == []
    assert sorted(r.get_response().id for r, _ in got) == sorted(f"big-{i}" for i in range(8))
    assert all(int(r.as_numpy("N")[0]) == MESSAGE_BYTES for r, _ in got)
    assert peak.value <= 3, f"{peak.value} messages of 1 MB in flight under a 3.5 MB budget"
    assert_serves_simple(server, FREE)


def test_each_request_on_a_stream_takes_a_slot_of_its_keys_max_concurrent(server: RunningServer) -> None:
    """A key with max_concurrent 2: six requests sent at once on one stream, two are run and the others are
    answered on the stream with the key's refusal, each with its id; the stream goes on, and once the two
    are answered their slots are free again."""
    stream = Stream(server, TWO)
    try:
        for i in range(6):
            stream.send_slow(16, f"r-{i}")
        got = stream.take(6)
        ok = [r.get_response().id for r, e in got if e is None]
        refused = [e for _, e in got if e is not None]
        assert len(ok) == 2 and len(refused) == 4, (ok, [str(e) for e in refused])
        words = f"max_concurrent {2 * WORKERS}"  # the key's limit, of which this process holds 2
        assert all(words in e.message() for e in refused), [e.message() for e in refused]
        stream.send_slow(16, "after")  # same stream, the slots given back
        [(result, error)] = stream.take(1)
        assert error is None and result.get_response().id == "after"
    finally:
        stream.close()
    assert_serves_simple(server, FREE)


def test_a_stream_at_its_request_cap_waits_and_every_request_is_answered(server: RunningServer) -> None:
    stream = Stream(server)
    peak = Peak(server)
    try:
        for i in range(12):
            stream.send_slow(16, f"c-{i}")
        got = stream.take(12, during=peak)
    finally:
        stream.close()
    assert [e for _, e in got if e is not None] == []
    assert sorted(r.get_response().id for r, _ in got) == sorted(f"c-{i}" for i in range(12))
    assert peak.value <= STREAM_REQUESTS, f"{peak.value} requests of one stream in flight"
    assert_serves_simple(server, FREE)


def test_a_stream_interleaving_more_sequences_than_its_cap_is_read_to_the_end(server: RunningServer) -> None:
    """20 sequences of 3 steps, round-robin on one stream with a cap of 4: sequence_accumulator has 8 slots,
    so 12 sequences wait in the backlog while the slotted ones need their next steps, which come 20 messages
    later. Counted against the cap, the stream would wait on itself until the slots went idle (5 s) and the
    later steps failed; every answer must be its own sequence's running sum, with no error."""
    n, steps = 20, 3
    stream = Stream(server)
    try:
        for step in range(steps):
            for s in range(n):
                x = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                x.set_data_from_numpy(np.full((1, 1), s * 10 + step, dtype=np.int32))
                stream.client.async_stream_infer("sequence_accumulator", [x], request_id=f"{s}:{step}",
                                                 sequence_id=1000 + s, sequence_start=step == 0,
                                                 sequence_end=step == steps - 1)
        got = stream.take(n * steps)
    finally:
        stream.close()
    assert [str(e) for _, e in got if e is not None] == []
    sums = {r.get_response().id: int(r.as_numpy("OUTPUT")[0, 0]) for r, _ in got}
    assert sums == {f"{s}:{step}": sum(s * 10 + k for k in range(step + 1))
                    for s in range(n) for step in range(steps)}
    assert_serves_simple(server, FREE)


def test_a_stream_closed_while_held_at_its_cap_answers_every_request_first(server: RunningServer) -> None:
    """The client half-closes right after sending more than the cap: what waited unread is still read and
    answered before the stream ends OK."""
    stream = Stream(server)
    for i in range(10):
        stream.send_slow(16, f"h-{i}")
    stream.client.stop_stream()  # half-close, then wait for the answers and the status
    stream.client.close()
    got = [stream.results.get_nowait() for _ in range(stream.results.qsize())]
    assert [e for _, e in got if e is not None] == []
    assert sorted(r.get_response().id for r, _ in got) == sorted(f"h-{i}" for i in range(10))


def test_the_cap_holds_the_streams_window_and_the_connection_serves_on(server: RunningServer) -> None:
    """Raw HTTP/2: with STREAM_REQUESTS requests in flight the stream is not read, so the rest of a large
    message waits in the client: no WINDOW_UPDATE for the stream comes before one of its requests is
    answered, while a unary ModelInfer on the same connection is answered at once."""
    c = RawClient(server.grpc_port)
    try:
        c.handshake()
        auth = (("authorization", FREE),)
        c.send(c.headers(1, STREAM_INFER, auth))
        c.send_data(1, b"".join(grpc_message(slow_request(16, f"s-{i}")) for i in range(STREAM_REQUESTS)),
                    end_stream=False)
        window = c.stream_windows[1]
        big = grpc_message(slow_request(3 * window // 2, "big"))
        c.send(frame(DATA, 0, 1, big[:window]))  # what the window allows of a message larger than it
        c.stream_windows[1] -= window
        c.window -= window
        # a unary request on stream 3 of the same connection
        a = pb.ModelInferRequest(model_name="simple", id="unary")
        for name in ("INPUT0", "INPUT1"):
            a.inputs.add(name=name, datatype="INT32", shape=[1, 16])
            a.raw_input_contents.append(np.ones(16, np.int32).tobytes())
        c.send(c.headers(3, INFER, auth))
        c.send_data(3, grpc_message(a.SerializeToString()))
        order = []
        while "answer" not in order:
            kind, flags, sid, payload = next_frame(c)
            if sid == 3 and kind == HEADERS and flags & 0x1:
                order.append("unary done")
            elif sid == 1 and kind == DATA and payload:
                order.append("answer")
            elif sid == 1 and kind == WINDOW_UPDATE:
                order.append("window")
        assert order[:2] == ["unary done", "answer"], order
        while "window" not in order:  # one answered: the stream is read on and its window granted
            kind, _, sid, _ = next_frame(c)
            if sid == 1 and kind == WINDOW_UPDATE:
                order.append("window")
    finally:
        c.close()
    assert_serves_simple(server, FREE)


# ----------------------------------------------------------------------- unread decoupled streams (item 3)

N_VALUES = 100_000  # 100k responses: ~50 MB held by the server, before its sends waited for the client
RSS_BOUND = 25 << 20  # the request (~400 KB, ~1 MB as JSON) parsed, plus allocator slack; 64 queued responses


def _unread_grpc(server: RunningServer) -> RawClient:
    c = RawClient(server.grpc_port, settings={INITIAL_WINDOW_SIZE: 4096})  # small windows; we never read
    c.handshake()
    request = pb.ModelInferRequest(model_name="repeat_stream", id="unread")
    request.inputs.add(name="IN", datatype="INT32", shape=[N_VALUES])
    request.raw_input_contents.append(np.arange(N_VALUES, dtype=np.int32).tobytes())
    c.send(c.headers(1, STREAM_INFER, (("authorization", FREE),)))
    c.send_data(1, grpc_message(request.SerializeToString()), end_stream=False)
    return c


def _unread_http(server: RunningServer) -> socket.socket:
    body = json.dumps({"IN": list(range(N_VALUES))}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.http_port))
    sock.sendall(b"POST /v2/models/repeat_stream/generate_stream HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (FREE.encode(), len(body), body))
    return sock


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_an_unread_decoupled_stream_stops_the_model_and_memory_comes_back(server: RunningServer,
                                                                          protocol: str) -> None:
    """repeat_stream asked for 100k responses by a client that never reads: the model sends what the
    client's windows (gRPC) or the kernel's socket buffers (HTTP) and our window of RESPONSE_WINDOW
    responses hold, then its sender waits: it stops short of the end. The server's memory stays within
    RSS_BOUND of where it was; once the client leaves, the request is cancelled, the model's worker is free
    again and the memory is back within the bound."""
    before_rss = server.rss_bytes()
    before = responses_sent(server)
    client = _unread_grpc(server) if protocol == "grpc" else _unread_http(server)
    try:
        wait_until(lambda: responses_sent(server) > before, "the model's first response")
        sent = until_it_stops(lambda: responses_sent(server), "the model's responses to a client that does "
                              "not read") - before
        assert sent < N_VALUES, "the model sent every response of a stream nobody read"
        held = server.rss_bytes() - before_rss
        assert held < RSS_BOUND, f"{held >> 20} MB held for an unread stream"
    finally:
        client.close()
    again = Stream(server)
    try:  # the model's worker is free again: a new request streams to its end
        values = grpcclient.InferInput("IN", [3], "INT32")
        values.set_data_from_numpy(np.array([7, 8, 9], dtype=np.int32))
        again.client.async_stream_infer("repeat_stream", [values], request_id="again")
        assert [int(r.as_numpy("OUT")[0]) for r, e in again.take(3) if e is None] == [7, 8, 9]
    finally:
        again.close()
    assert_serves_simple(server, FREE)
    wait_until(lambda: server.rss_bytes() - before_rss < RSS_BOUND, "memory back within the bound")


def test_a_client_that_reads_gets_every_response_in_order(server: RunningServer) -> None:
    """Credit keeps coming for a client that reads, slowly at times: 20,000 responses, in order."""
    stream = Stream(server)
    try:
        values = grpcclient.InferInput("IN", [20_000], "INT32")
        values.set_data_from_numpy(np.arange(20_000, dtype=np.int32))
        stream.client.async_stream_infer("repeat_stream", [values], request_id="all",
                                         enable_empty_final_response=True)
        got = []
        while True:
            result, error = stream.results.get(timeout=60)
            assert error is None, error
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            got.append(int(result.as_numpy("OUT")[0]))
            if len(got) % 5000 == 0:
                time.sleep(0.2)  # a slow reader now and then (what is tested)
        assert got == list(range(20_000))
    finally:
        stream.close()
    # response_stats keeps an entry per index up to 1024, which counts that index and every later one
    stats = response_stats(server, "repeat_stream")
    assert max(int(k) for k in stats) == 1024
    assert stats["1024"]["success"]["count"] >= 20_000 - 1024

