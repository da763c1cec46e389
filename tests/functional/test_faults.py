"""Faults below the API (issue 16 item 9): a backend that raises, one that hangs, a model file deleted while
serving, SIGTERM under gRPC load, and clients that disconnect mid-request over both protocols. After each
case the server answers a correct inference over HTTP and gRPC (`still_serves`), and no request is left
pending; every case counts towards "faults: N cases tried" at the end of the run.

What other suites already cover is not repeated here:
* test_canary.py — a hung Python instance turns its version not-ready and back (canaries), a model
  that raises on the operator's warm-up data fails its canary;
* test_shutdown.py — SIGTERM with 8 requests in flight on a slow model: each answered, exit 0;
* test_http_limits.py — SIGTERM while 32 HTTP keep-alive clients loop: no request sent on an open
  connection is lost;
* test_h2.py — RST_STREAM mid-request and in flight, a gRPC client gone after its request (cancelled);
* test_lifecycle.py — a model file corrupted while serving in poll mode: the loaded version serves on;
* test_completion.py — success, failure and cancel each accounted once.

The module's server runs in explicit mode (so a reload happens only when asked), with canaries every 0.2 s.
Each wait is for a condition, bounded.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from case_counts import tried
from conftest import RunningServer, assert_simple_over_grpc, start_server
from engine.proto import grpc_service_pb2 as gpb
from h2_client import DATA, RawClient, frame, grpc_message
from python_models import add_simple, write_model
from test_canary import FLAGGED, IO
from test_http_limits import assert_good_inference, post
from test_shutdown import SLOW_CONFIG, SLOW_MODEL

BOUND_S = 30.0
CANARY = ("--canary-interval-secs", "0.2", "--canary-timeout-secs", "2")
MODELS = ("simple", "flagged", "doomed", SLOW_MODEL)


def build_repository(root: Path) -> Path:
    add_simple(root)
    shutil.copytree(root / "simple", root / "doomed")  # an ONNX model of its own, to delete files from
    config = root / "doomed" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "simple"', 'name: "doomed"'))
    write_model(root, "flagged", FLAGGED, IO)  # raises while flagged/fail exists, hangs while flagged/hang
    (root / SLOW_MODEL / "1").mkdir(parents=True)
    (root / SLOW_MODEL / "config.pbtxt").write_text(SLOW_CONFIG)  # identity, 300 ms per execution
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = build_repository(tmp_path_factory.mktemp("faults_repository"))
    loads = [arg for name in MODELS for arg in ("--load-model", name)]
    srv = start_server(root, tmp_path_factory.mktemp("faults") / "server.log", "--model-control-mode",
                       "explicit", *loads, *CANARY, ready_timeout=120)
    yield srv
    srv.stop()


def wait_until(condition, what: str, seconds: float = BOUND_S):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {seconds} s waiting for {what}")


def metrics(server: RunningServer) -> str:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
        return r.read().decode()


def pending(server: RunningServer, model: str) -> int:
    match = re.search(rf'^nv_inference_pending_request_count\{{model="{model}",version="1"\}} (\d+)$',
                      metrics(server), re.MULTILINE)
    return int(match.group(1)) if match else 0


def none_pending(server: RunningServer) -> bool:
    text = metrics(server)
    counts = re.findall(r'^nv_inference_pending_request_count\{[^}]*\} (\d+)$', text, re.MULTILINE)
    return bool(counts) and all(int(c) == 0 for c in counts)


@pytest.fixture(autouse=True)
def still_serves(server):
    """After each case: nothing left pending, and a correct inference over each protocol."""
    yield
    assert server.process.poll() is None, server.log()[-3000:]
    wait_until(lambda: none_pending(server), "no request left pending")
    assert_good_inference(server)
    assert_simple_over_grpc(server, BOUND_S)


def infer_flagged(module, url: str, x: np.ndarray, **options) -> np.ndarray:
    with module.InferenceServerClient(url) as c:
        tensor = module.InferInput("IN", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return c.infer("flagged", [tensor], **options).as_numpy("OUT")


CLIENTS = [(httpclient, "http_url"), (grpcclient, "grpc_url")]


# ------------------------------------------------------------------------------------------------ backends

def test_a_backend_that_raises_fails_its_requests_in_tritons_words_then_serves(server):
    """Each protocol's request to a model whose execute raises gets the error (HTTP 500 / gRPC INTERNAL) in
    Triton's words; once it stops raising, the same model answers correctly."""
    folder = server.repository / "flagged"
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    (folder / "fail").touch()
    try:
        for module, url in CLIENTS:
            with pytest.raises(InferenceServerException) as info:
                infer_flagged(module, getattr(server, url), x)
            message = info.value.message()
            assert "Failed to process the request(s) for model 'flagged_0_0'" in message, message
            assert "the weights went bad" in message, message
            tried("faults")
    finally:
        (folder / "fail").unlink()
    for module, url in CLIENTS:
        np.testing.assert_array_equal(infer_flagged(module, getattr(server, url), x), x * 2)


def test_a_backend_that_hangs_times_its_callers_out_turns_not_ready_and_recovers(server):
    """A request to a hung instance ends at its client's deadline; the canary turns the version not-ready
    (test_canary.py checks the reason in every place), so new requests are refused at once, not queued
    behind the hang; once the instance answers again, so does the model, and nothing stays pending."""
    folder = server.repository / "flagged"
    x = np.ones((1, 4), dtype=np.float32)
    (folder / "hang").touch()
    try:
        with pytest.raises(InferenceServerException) as info:
            infer_flagged(grpcclient, server.grpc_url, x, client_timeout=1.0)
        assert "Deadline" in info.value.message() or "DEADLINE" in str(info.value.status()), info.value
        tried("faults")
        wait_until(lambda: http_status(server, "/v2/models/flagged/ready") == 503, "flagged not ready")
        started = time.monotonic()
        for module, url in CLIENTS:
            with pytest.raises(InferenceServerException) as info:
                infer_flagged(module, getattr(server, url), x)
            assert "canary failed" in info.value.message(), info.value.message()
            tried("faults")
        assert time.monotonic() - started < 10, "refused at once, not queued behind the hang"
    finally:
        (folder / "hang").unlink()
    wait_until(lambda: http_status(server, "/v2/models/flagged/ready") == 200, "flagged ready again")
    for module, url in CLIENTS:
        np.testing.assert_array_equal(infer_flagged(module, getattr(server, url), x), x * 2)


def http_status(server: RunningServer, path: str, body: bytes | None = None) -> int:
    return http_call(server, path, body)[0]


def http_call(server: RunningServer, path: str, body: bytes | None = None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=body,
                                     method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=BOUND_S) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


# ------------------------------------------------------------------------------------------------ model files

def infer_doomed(module, url: str) -> np.ndarray:
    with module.InferenceServerClient(url) as c:
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            tensor = module.InferInput(name, [1, 16], "INT32")
            tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
            inputs.append(tensor)
        return c.infer("doomed", inputs).as_numpy("OUTPUT0")


def test_a_model_file_deleted_while_serving_stays_resident_and_its_reload_fails_cleanly(server):
    """The ONNX session is in memory: deleting model.onnx changes nothing for requests. A reload asked for
    then fails with an error naming the file inside the repository (never its absolute path), and the
    loaded version keeps serving, over both protocols."""
    model_file = server.repository / "doomed" / "1" / "model.onnx"
    saved = model_file.read_bytes()
    model_file.unlink()
    try:
        for module, url in CLIENTS:
            assert infer_doomed(module, getattr(server, url)).tolist() == [list(range(0, 32, 2))]
            tried("faults")
        status, body = http_call(server, "/v2/repository/models/doomed/load", b"{}")
        assert status >= 400, (status, body)
        message = json.loads(body)["error"]
        assert "doomed" in message and str(server.repository) not in message, message
        tried("faults")
        with grpcclient.InferenceServerClient(server.grpc_url) as c:
            with pytest.raises(InferenceServerException) as info:
                c.load_model("doomed")
            assert str(server.repository) not in info.value.message(), info.value.message()
        tried("faults")
        for module, url in CLIENTS:
            assert infer_doomed(module, getattr(server, url)).tolist() == [list(range(0, 32, 2))]
    finally:
        model_file.write_bytes(saved)
    status, body = http_call(server, "/v2/repository/models/doomed/load", b"{}")
    assert status == 200, body  # the file back: the reload works again


# ------------------------------------------------------------------------------------------------ disconnects

def slow_body(value: float) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                                   "data": [value] * 4}]}).encode()


def slow_message(value: float) -> bytes:
    """A serialized ModelInferRequest for the slow model, for the raw HTTP/2 client."""
    request = gpb.ModelInferRequest(model_name=SLOW_MODEL,
                                    raw_input_contents=[np.full(4, value, "<f4").tobytes()])
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    return request.SerializeToString()


def cancelled(server: RunningServer) -> float:
    return server.metric("hubserve_inference_request_cancelled_total", SLOW_MODEL)


def test_http_clients_that_disconnect_mid_request_leave_nothing_pending(server):
    """Clients of the slow model gone mid-head, mid-body, while their request waits in the queue, and while
    it executes: the server is left with no pending request, and the slow model answers correctly."""
    path = f"/v2/models/{SLOW_MODEL}/infer"
    request = post(path, slow_body(1.0))
    head_end = request.index(b"\r\n\r\n") + 4
    for cut in (10, head_end - 3, head_end + 5):  # mid-head, end of head, mid-body
        s = socket.create_connection(("127.0.0.1", server.http_port), timeout=BOUND_S)
        s.sendall(request[:cut])
        s.close()
        tried("faults")
    # One executes (300 ms), three wait behind it; all four clients leave after the server has them.
    socks = []
    for _ in range(4):
        s = socket.create_connection(("127.0.0.1", server.http_port), timeout=BOUND_S)
        s.sendall(request)
        socks.append(s)
    wait_until(lambda: pending(server, SLOW_MODEL) == 4, "four requests pending")
    for s in socks:
        s.close()
    tried("faults", 4)
    wait_until(lambda: pending(server, SLOW_MODEL) == 0, "the gone clients' requests dropped or done")
    status, body = http_call(server, path, slow_body(2.0))
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2.0] * 4, body


def test_grpc_clients_that_disconnect_mid_request_leave_nothing_pending(server):
    """gRPC clients of the slow model gone mid-message, while queued and while executing (test_h2.py has
    the one-request case): cancelled, none pending, and the model answers correctly after."""
    message = grpc_message(slow_message(1.0))
    c = RawClient(server.grpc_port)
    c.handshake()
    c.send(c.headers(1), frame(DATA, 0, 1, message[:12]))  # a message cut short, then gone
    c.close()
    tried("faults")
    before = cancelled(server)
    clients = []
    for _ in range(4):
        c = RawClient(server.grpc_port)
        c.handshake()
        c.call(1, slow_message(1.0))
        clients.append(c)
    wait_until(lambda: pending(server, SLOW_MODEL) == 4, "four requests pending")
    for c in clients:
        c.sock.shutdown(socket.SHUT_WR)  # FIN once the server has them; then the sockets are closed
        c.close()
    tried("faults", 4)
    wait_until(lambda: pending(server, SLOW_MODEL) == 0, "the gone clients' requests dropped or done")
    assert cancelled(server) >= before + 3  # the queued three at least; the executing one may finish
    with grpcclient.InferenceServerClient(server.grpc_url) as g:
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.full((1, 4), 3.0, np.float32))
        out = g.infer(SLOW_MODEL, [tensor], client_timeout=BOUND_S).as_numpy("OUTPUT0")
    assert out.tolist() == [[3.0] * 4]


# ------------------------------------------------------------------------------------------------ SIGTERM

def test_sigterm_under_grpc_load_answers_every_accepted_request(tmp_path: Path):
    """8 gRPC clients loop on the fast `simple` and 4 on the slow model, each on its own channel, when the
    server gets SIGTERM. Every request either gets its correct answer or is refused as UNAVAILABLE (the
    server's GOAWAY, or no listener); every request sent at least a second before the signal (so surely
    read by then: the slow model's queue holds them) gets its answer. Then the process exits 0."""
    root = build_repository(tmp_path / "repository")
    srv = start_server(root, tmp_path / "server.log", "--model-control-mode", "explicit",
                       "--load-model", "simple", "--load-model", SLOW_MODEL, ready_timeout=120)
    outcomes: list[tuple[float, str]] = []  # (when the request was sent, what became of it)
    lock = threading.Lock()
    answered = [0] * 12
    signalled: list[float] = []

    def loop(i: int) -> None:
        slow = i >= 8
        with grpcclient.InferenceServerClient(srv.grpc_url) as c:
            for n in range(10_000):
                if signalled and time.monotonic() > signalled[0] + BOUND_S:
                    return
                x = np.full((1, 4) if slow else (1, 16), i * 1000 + n % 1000,
                            np.float32 if slow else np.int32)
                inputs = ([grpcclient.InferInput("INPUT0", [1, 4], "FP32")] if slow else
                          [grpcclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")])
                for t in inputs:
                    t.set_data_from_numpy(x)
                sent = time.monotonic()
                try:
                    result = c.infer(SLOW_MODEL if slow else "simple", inputs, client_timeout=BOUND_S)
                    out = result.as_numpy("OUTPUT0")
                    ok = out.tolist() == (x if slow else x + x).tolist()
                    outcome = "ok" if ok else f"wrong answer {out.tolist()}"
                except InferenceServerException as e:
                    outcome = "refused" if e.status() == "StatusCode.UNAVAILABLE" else f"{e.status()}: {e}"
                with lock:
                    outcomes.append((sent, outcome))
                if outcome != "ok":
                    return
                answered[i] += 1

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(12)]
    try:
        for t in threads:
            t.start()
        wait_until(lambda: min(answered) >= 2, "every client answered twice")
        wait_until(lambda: pending(srv, SLOW_MODEL) >= 3, "the slow model's queue filled")
        signalled.append(time.monotonic())
        srv.process.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(BOUND_S + 30)
        assert not any(t.is_alive() for t in threads), "a client hung after SIGTERM"
        returncode = srv.process.wait(BOUND_S)
    finally:
        srv.stop()
    lost = [o for sent, o in outcomes if o not in ("ok", "refused")]
    assert not lost, f"requests failed otherwise than refused in shutdown: {lost[:5]}\n{srv.log()[-3000:]}"
    early = [o for sent, o in outcomes if sent < signalled[0] - 1.0]
    assert early and all(o == "ok" for o in early), [o for o in early if o != "ok"][:5]
    in_flight = [o for sent, o in outcomes if signalled[0] - 1.0 <= sent < signalled[0] and o == "ok"]
    assert returncode == 0, srv.log()[-3000:]
    tried("faults")
    print(f"SIGTERM under load: {len(outcomes)} requests, {len(in_flight)} answered from the last second")
