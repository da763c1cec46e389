"""`--workers 2`: one engine process and two frontend processes behave as one server.

Real servers on free ports, real clients (tritonclient HTTP and gRPC, http.client). Where the point is which
frontend a connection reached, the test finds out from /proc: the server's end of the connection is a socket
whose inode appears in /proc/net/tcp, and the frontend holding it has that inode among its fds. The
frontends are the engine's children (/proc/<engine>/task/<engine>/children).
"""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import pickle
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import EXAMPLES, RunningServer, build_test_repository, fd_links, start_server
from engine.ipc.frames import HEAD
from hubserve_models import examples

BATCHER = "batcher"  # identity backend: a batch forms only when 4 requests wait (its window is minutes)
SLOW = "slow"  # identity backend: each execution sleeps 300 ms, so requests are provably in flight
ARENA_MB = 1

BATCHER_CONFIG = f"""
name: "{BATCHER}"
backend: "identity"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
dynamic_batching {{ preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 600000000 }}
"""
BIG = "big"  # identity backend, any length: for tensors larger than the arenas
BIG_CONFIG = f"""
name: "{BIG}"
backend: "identity"
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
"""
SLOW_CONFIG = f"""
name: "{SLOW}"
backend: "identity"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
parameters {{ key: "execute_delay_ms" value: {{ string_value: "300" }} }}
"""


def _identity_model(root: Path, name: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = build_test_repository(tmp_path_factory.mktemp("repository"))
    (root / "simple_string").mkdir()
    shutil.copy(EXAMPLES / "simple_string" / "config.pbtxt", root / "simple_string" / "config.pbtxt")
    examples.build_repository(root, ["simple_string"])
    _identity_model(root, BATCHER, BATCHER_CONFIG)
    _identity_model(root, SLOW, SLOW_CONFIG)
    _identity_model(root, BIG, BIG_CONFIG)
    return root


def _serve(repository: Path, log: Path, workers: int, *extra: str) -> RunningServer:
    return start_server(repository, log, "--workers", str(workers), "--worker-arena-mb", str(ARENA_MB),
                        "--no-strict-readiness", "--model-control-mode", "none", *extra)


@pytest.fixture(scope="module")
def single(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = _serve(repository, tmp_path_factory.mktemp("single") / "server.log", 1)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def multi(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = _serve(repository, tmp_path_factory.mktemp("multi") / "server.log", 2)
    wait_for(lambda: len(frontends(server)) == 2, 30, "two frontends")
    yield server
    server.stop()


# ---------------------------------------------------------------------------------------------- helpers


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def frontends(server: RunningServer) -> list[int]:
    pid = server.process.pid
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between it and the read
        return []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # reaped before the open, or between it and the read
        return False


def _server_inode(client: socket.socket) -> int | None:
    local = client.getsockname()[1]
    remote = client.getpeername()[1]
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[1].endswith(f":{remote:04X}") and fields[2].endswith(f":{local:04X}"):
                return int(fields[9])
    return None


def frontend_of(server: RunningServer, client: socket.socket) -> int:
    """The pid of the frontend that accepted `client`'s connection."""
    def find() -> int | None:
        inode = _server_inode(client)
        if not inode:
            return None
        for pid in frontends(server):
            if f"socket:[{inode}]" in fd_links(pid):
                return pid
        return None

    return int(wait_for(find, 10, "the frontend holding a connection"))


def connections_on_each(server: RunningServer, per_frontend: int
                        ) -> dict[int, list[http.client.HTTPConnection]]:
    """`per_frontend` open HTTP connections on each frontend (extra ones are closed)."""
    by_pid: dict[int, list[http.client.HTTPConnection]] = {pid: [] for pid in frontends(server)}
    for _ in range(60):
        if all(len(c) >= per_frontend for c in by_pid.values()):
            break
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
        conn.connect()
        pid = frontend_of(server, conn.sock)
        if len(by_pid.setdefault(pid, [])) < per_frontend:
            by_pid[pid].append(conn)
        else:
            conn.close()
    assert all(len(c) >= per_frontend for c in by_pid.values()), f"connections: {by_pid}"
    return by_pid


def infer_json(model: str, data: list[list[float]]) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [len(data), 4],
                                   "data": data}]}).encode()


def send(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None) -> None:
    conn.request(method, path, body=body, headers={"Content-Type": "application/json"})


def answer(conn: http.client.HTTPConnection) -> tuple[int, Any]:
    r = conn.getresponse()
    body = r.read()
    return r.status, json.loads(body) if body else None


def stats(server: RunningServer, model: str) -> dict[str, Any]:
    with httpclient.InferenceServerClient(server.http_url) as client:
        return client.get_inference_statistics(model)["model_stats"][0]  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------------- answers


def _http_infer(server: RunningServer, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
        tensors = []
        for name, data in inputs.items():
            datatype = "BYTES" if data.dtype == object else httpclient.np_to_triton_dtype(data.dtype)
            t = httpclient.InferInput(name, list(data.shape), datatype)
            t.set_data_from_numpy(data, binary_data=True)
            tensors.append(t)
        result = client.infer(model, tensors)
        return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}


def _grpc_infer(server: RunningServer, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    options = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    with grpcclient.InferenceServerClient(server.grpc_url, channel_args=options) as client:
        tensors = []
        for name, data in inputs.items():
            datatype = "BYTES" if data.dtype == object else grpcclient.np_to_triton_dtype(data.dtype)
            t = grpcclient.InferInput(name, list(data.shape), datatype)
            t.set_data_from_numpy(data)
            tensors.append(t)
        result = client.infer(model, tensors, client_timeout=60)
        return {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}


rng = np.random.default_rng(13)
CASES = {
    "simple": ("simple", {"INPUT0": np.arange(32, dtype=np.int32).reshape(2, 16),
                          "INPUT1": np.full((2, 16), 7, dtype=np.int32)}),
    "mlp": ("mlp", {"INPUT0": rng.standard_normal((3, 256), dtype=np.float32)}),
    "strings": ("strings", {"TEXT": np.array([b"hello", b"", "\u00e9t\u00e9".encode()], dtype=object)}),
    "simple_string": ("simple_string",
                      {"INPUT0": np.array([[str(i).encode() for i in range(16)]], dtype=object),
                       "INPUT1": np.array([[b"1"] * 16], dtype=object)}),
    # 64 KiB: through the arenas; 3 MiB: more than the 1 MiB arenas hold, so inline over the sockets.
    "arena": (BIG, {"INPUT0": rng.standard_normal(16384, dtype=np.float32)}),
    "inline": (BIG, {"INPUT0": rng.standard_normal(786432, dtype=np.float32)}),
    "bool": ("identity_bool", {"INPUT0": rng.integers(0, 2, (3, 4)).astype(bool)}),
}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_answers_equal_the_single_process(single: RunningServer, multi: RunningServer, protocol: str,
                                          case: str) -> None:
    model, inputs = CASES[case]
    infer = _http_infer if protocol == "http" else _grpc_infer
    want = infer(single, model, inputs)
    got = infer(multi, model, inputs)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    if model.startswith("identity") or model == BIG:
        np.testing.assert_array_equal(got["OUTPUT0"], inputs["INPUT0"])


_I16 = np.zeros((1, 16), np.int32)
BAD_REQUESTS = {
    "unknown model": ("nope", {"INPUT0": _I16, "INPUT1": _I16}),
    "bad input name": ("simple", {"INPUTX": _I16, "INPUT1": _I16}),
    "bad datatype": ("simple", {"INPUT0": _I16.astype(np.float32), "INPUT1": _I16}),
    "bad shape": ("simple", {"INPUT0": np.zeros((1, 15), np.int32), "INPUT1": np.zeros((1, 15), np.int32)}),
    "bad name": ("a/b", {"INPUT0": _I16, "INPUT1": _I16}),
}


def _error(call: Callable[[], Any]) -> tuple[Any, str]:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value.status(), info.value.message()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_errors_are_the_single_process_errors(single: RunningServer, multi: RunningServer, protocol: str,
                                              case: str) -> None:
    model, inputs = BAD_REQUESTS[case]
    infer = _http_infer if protocol == "http" else _grpc_infer
    want = _error(lambda: infer(single, model, inputs))
    got = _error(lambda: infer(multi, model, inputs))
    assert got == want


@pytest.mark.parametrize("path", ["/v2", "/v2/health/ready", "/v2/models/simple", "/v2/models/simple/config",
                                  "/v2/models/nope", "/v2/models/simple/versions/9/ready",
                                  "/v2/systemsharedmemory/status", "/v2/nothing"])
def test_other_endpoints_answer_as_the_single_process(single: RunningServer, multi: RunningServer,
                                                      path: str) -> None:
    def get(server: RunningServer) -> tuple[int, bytes, str | None]:
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
        conn.request("GET", path)
        r = conn.getresponse()
        result = r.status, r.read(), r.getheader("Content-Type")
        conn.close()
        return result

    assert get(multi) == get(single)


# ---------------------------------------------------------------------------------------------- one server


def test_statistics_and_metrics_count_every_frontends_requests(multi: RunningServer) -> None:
    before = stats(multi, "identity_fp32")["inference_stats"]["success"]["count"]
    metric_before = multi.metric("nv_inference_request_success", "identity_fp32")
    per_connection = 5
    by_pid = connections_on_each(multi, 2)
    conns = [c for cs in by_pid.values() for c in cs]
    body = infer_json("identity_fp32", [[1.0, 2.0, 3.0, 4.0]])
    for _ in range(per_connection):
        for conn in conns:
            send(conn, "POST", "/v2/models/identity_fp32/infer", body)
        for conn in conns:
            assert answer(conn)[0] == 200
    total = per_connection * len(conns)
    # One statistics call, through whichever frontend, sees every frontend's requests.
    for conn in conns:
        send(conn, "GET", "/v2/models/identity_fp32/stats")
        status, doc = answer(conn)
        assert status == 200
        assert doc["model_stats"][0]["inference_stats"]["success"]["count"] - before == total
    assert multi.metric("nv_inference_request_success", "identity_fp32") - metric_before == total
    for conn in conns:
        conn.close()


def test_a_batch_forms_across_frontends(multi: RunningServer) -> None:
    by_pid = connections_on_each(multi, 2)
    conns = [c for cs in by_pid.values() for c in cs[:2]]
    assert len(conns) == 4
    for i, conn in enumerate(conns):  # the window is minutes: only 4 waiting requests make a batch
        send(conn, "POST", f"/v2/models/{BATCHER}/infer", infer_json(BATCHER, [[float(i)] * 4]))
    for i, conn in enumerate(conns):
        status, doc = answer(conn)
        assert status == 200 and doc["outputs"][0]["data"] == [float(i)] * 4
        conn.close()
    batches = {b["batch_size"]: b["compute_infer"]["count"] for b in stats(multi, BATCHER)["batch_stats"]}
    assert batches == {4: 1}


def test_a_load_through_one_frontend_is_seen_by_the_other(repository: Path, tmp_path: Path) -> None:
    server = start_server(repository, tmp_path / "server.log", "--workers", "2", "--model-control-mode",
                          "explicit", "--no-strict-readiness")
    try:
        wait_for(lambda: len(frontends(server)) == 2, 30, "two frontends")
        (a, *_), (b, *_) = connections_on_each(server, 1).values()
        send(b, "GET", "/v2/models/simple/ready")
        assert answer(b)[0] != 200
        send(a, "POST", "/v2/repository/models/simple/load", b"{}")
        assert answer(a)[0] == 200
        send(b, "GET", "/v2/models/simple/ready")
        assert answer(b)[0] == 200
        send(b, "POST", "/v2/repository/index", b"{}")
        assert {"name": "simple", "version": "1", "state": "READY", "reason": ""} in answer(b)[1]
        send(b, "POST", "/v2/repository/models/simple/unload", b"{}")
        assert answer(b)[0] == 200
        send(a, "GET", "/v2/models/simple/ready")
        assert answer(a)[0] != 200
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------- processes


def _memfds(pid: int) -> int:
    return sum(link.startswith("/memfd:") for link in fd_links(pid))


def _slow_request(conn: http.client.HTTPConnection, value: float, out: list[Any]) -> threading.Thread:
    def run() -> None:
        try:
            send(conn, "POST", f"/v2/models/{SLOW}/infer", infer_json(SLOW, [[value] * 4]))
            out.append(answer(conn))
        except (OSError, http.client.HTTPException) as e:
            out.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _pending(server: RunningServer) -> float:
    return server.metric("nv_inference_pending_request_count", SLOW)


def test_sigterm_answers_every_request_in_flight(repository: Path, tmp_path: Path) -> None:
    server = _serve(repository, tmp_path / "server.log", 2)
    wait_for(lambda: len(frontends(server)) == 2, 30, "two frontends")
    pids = frontends(server)
    by_pid = connections_on_each(server, 2)
    results: list[list[Any]] = []
    threads = []
    for i, conn in enumerate(c for cs in by_pid.values() for c in cs):
        results.append([])
        threads.append(_slow_request(conn, float(i), results[-1]))
    wait_for(lambda: _pending(server) == len(threads), 30, "4 requests in flight")
    server.process.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    assert server.process.wait(60) == 0, server.log()
    for i, out in enumerate(results):
        assert out and out[0][0] == 200, (out, server.log())
        assert out[0][1]["outputs"][0]["data"] == [float(i)] * 4
    wait_for(lambda: not any(_alive(p) for p in pids), 10, "the frontends to exit")


def test_a_killed_frontend_is_restarted_and_only_its_requests_fail(repository: Path, tmp_path: Path) -> None:
    shm_before = set(os.listdir("/dev/shm"))
    server = _serve(repository, tmp_path / "server.log", 2)
    try:
        wait_for(lambda: len(frontends(server)) == 2, 30, "two frontends")
        # A request and a response arena per frontend (before Python 3.13 a mapping holds a dup of its fd).
        arenas = _memfds(server.process.pid)
        assert arenas in (4, 8)
        (victim, victim_conns), (survivor, survivor_conns) = connections_on_each(server, 1).items()
        lost: list[Any] = []
        kept: list[Any] = []
        threads = [_slow_request(victim_conns[0], 1.0, lost), _slow_request(survivor_conns[0], 2.0, kept)]
        wait_for(lambda: _pending(server) == 2, 30, "2 requests in flight")
        os.kill(victim, signal.SIGKILL)
        for t in threads:
            t.join(60)
        assert isinstance(lost[0], (OSError, http.client.HTTPException)), lost
        assert kept[0][0] == 200 and kept[0][1]["outputs"][0]["data"] == [2.0] * 4, kept
        restarted = wait_for(lambda: [p for p in frontends(server) if p not in (victim, survivor)], 30,
                             "a new frontend")
        assert len(restarted) == 1 and _alive(survivor)
        assert wait_for(lambda: _memfds(server.process.pid) == arenas, 10, "the dead frontend's arenas freed")
        by_pid = connections_on_each(server, 1)  # the new frontend serves on the same port
        assert set(by_pid) == {survivor, restarted[0]}
        for conn in (c for cs in by_pid.values() for c in cs):
            send(conn, "POST", "/v2/models/identity_fp32/infer", infer_json("identity_fp32", [[5.0] * 4]))
            assert answer(conn)[0] == 200
        assert _grpc_infer(server, "simple", CASES["simple"][1])["OUTPUT0"].tolist() == \
            (CASES["simple"][1]["INPUT0"] + 7).tolist()
        # (Triton's Python backend, which benchmarks beside us may be running, makes its own entries there.)
        assert {n for n in os.listdir("/dev/shm") if not n.startswith("triton_")} <= shm_before
    finally:
        server.stop()
    assert set(os.listdir("/dev/shm")) <= shm_before


def test_frontends_exit_when_the_engine_dies(repository: Path, tmp_path: Path) -> None:
    server = _serve(repository, tmp_path / "server.log", 2)
    pids = wait_for(lambda: frontends(server) if len(frontends(server)) == 2 else None, 30, "two frontends")
    server.process.kill()
    server.process.wait(10)
    wait_for(lambda: not any(_alive(p) for p in pids), 15, "the frontends to exit")


def _channel_of(frontend: int) -> socket.socket:
    """The frontend's own end of its channel to the engine, taken from it (pidfd_getfd, Linux >= 5.6): what a
    compromised frontend process could write there, written by the test. Its fd is in the frontend's spec."""
    with open(f"/proc/{frontend}/cmdline", "rb") as f:
        spec = json.loads(f.read().split(b"\0")[3])
    pidfd = os.pidfd_open(frontend)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.syscall(438, pidfd, spec["channel"], 0)  # SYS_pidfd_getfd on x86_64 and arm64
        if fd < 0:
            pytest.skip(f"pidfd_getfd is not available here (errno {ctypes.get_errno()})")
    finally:
        os.close(pidfd)
    return socket.socket(fileno=fd)


class _RunsCode:
    """Unpickled, this makes a directory: proof that the reader ran what the sender chose."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return os.mkdir, (self.path,)


def test_a_frame_whose_metadata_pickles_a_class_is_refused(repository: Path, tmp_path: Path) -> None:
    server = _serve(repository, tmp_path / "server.log", 2)
    try:
        victim, survivor = wait_for(lambda: frontends(server) if len(frontends(server)) == 2 else None, 30,
                                    "two frontends")
        marker = tmp_path / "the engine ran the frame's code"
        body = pickle.dumps(((_RunsCode(marker),), [], [], [], False, -1), protocol=pickle.HIGHEST_PROTOCOL)
        with _channel_of(victim) as channel:
            channel.sendall(HEAD.pack(len(body), len(body)) + body)
        wait_for(lambda: "sent a broken frame" in server.log(), 30, "the engine to refuse the frame")
        assert "unreadable frame metadata" in server.log()  # not a FrontendFrame (workers/messages.py)
        assert not marker.exists()
        wait_for(lambda: not _alive(victim), 30, "the cut-off frontend to exit")
        wait_for(lambda: [p for p in frontends(server) if p not in (victim, survivor)], 30, "a new frontend")
        assert _alive(survivor)
        for conn in (c for cs in connections_on_each(server, 1).values() for c in cs):
            send(conn, "POST", "/v2/models/identity_fp32/infer", infer_json("identity_fp32", [[5.0] * 4]))
            assert answer(conn)[0] == 200
    finally:
        server.stop()
