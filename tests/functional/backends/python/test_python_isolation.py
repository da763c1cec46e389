"""Python models run each instance in a process of their own: a model that blocks stalls nobody else, and an
instance that crashes or hangs is detected, fails its requests with the reason, shows not-ready with that
reason while it restarts, and serves again. A model's EXECUTION_ENV_PATH venv runs its instances.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import start_server
from python_models import (
    ASYNC,
    COUNTER,
    COUNTER_CONFIG,
    ENV_CONFIG,
    ENV_REPORT,
    FRAGILE,
    FRAGILE_CONFIG,
    ONE_IN_ONE_OUT,
    write_model,
)

MODELS = {
    "fragile": "",
    "hangs": 'parameters { key: "instance_unresponsive_secs" value: { string_value: "2" } }\n',
    "overruns": 'parameters { key: "execute_timeout_secs" value: { string_value: "1" } }\n',
    "other": "",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("isolation_repository")
    for name, extra in MODELS.items():
        write_model(repo, name, FRAGILE, FRAGILE_CONFIG + extra)
    write_model(repo, "echo", ASYNC, ONE_IN_ONE_OUT)
    write_model(repo, "echo_small_shm", ASYNC, ONE_IN_ONE_OUT +
                'parameters { key: "shm_region_mb" value: { string_value: "1" } }\n')
    write_model(repo, "counter", COUNTER, COUNTER_CONFIG +
                'parameters { key: "shm_region_mb" value: { string_value: "1" } }\n'
                'parameters { key: "instance_unresponsive_secs" value: { string_value: "120" } }\n')
    args = ["--model-control-mode", "explicit"] + [a for n in [*MODELS, "echo", "echo_small_shm", "counter"]
                                                   for a in ("--load-model", n)]
    srv = start_server(repo, tmp_path_factory.mktemp("isolation_server") / "server.log", *args,
                       ready_timeout=120)
    yield srv
    srv.stop()


def call(server, model: str, value: float, protocol: str = "http") -> float:
    module = httpclient if protocol == "http" else grpcclient
    with module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url) as c:
        i = module.InferInput("IN", [1], "FP32")
        i.set_data_from_numpy(np.array([value], np.float32))
        return float(c.infer(model, [i]).as_numpy("OUT")[0])


def wait_for(condition, timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} not met within {timeout_s} s")


def index_row(server, model: str) -> dict:
    with httpclient.InferenceServerClient(server.http_url) as c:
        return next(r for r in c.get_model_repository_index() if r["name"] == model)


def ready(server, model: str) -> bool:
    with httpclient.InferenceServerClient(server.http_url) as c:
        return bool(c.is_model_ready(model))


def test_a_blocked_model_stalls_no_other_model(server) -> None:
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(call, server, "fragile", 3.0)
        started = time.monotonic()
        for _ in range(5):
            call(server, "other", 0.0)
        assert time.monotonic() - started < 2.5
        assert not slow.done()  # the other model was answered while this one still slept
        assert slow.result(30) > 0


def restarts(server, model: str) -> list[str]:
    starts = server.repository / model / "starts.txt"
    return starts.read_text().split() if starts.exists() else []


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_crashed_instance_fails_its_request_shows_why_and_restarts(server, protocol: str) -> None:
    before = call(server, "fragile", 0.0, protocol)
    count = len(restarts(server, "fragile"))
    with pytest.raises(InferenceServerException, match="'fragile_0_0' exited with code 3 while running"):
        call(server, "fragile", -1, protocol)
    wait_for(lambda: not ready(server, "fragile"), 10, "not ready while restarting")
    row = index_row(server, "fragile")
    assert row["state"] == "UNAVAILABLE" and "exited with code 3; restarting it" in row["reason"]
    with pytest.raises(InferenceServerException, match="exited with code 3; restarting it"):
        call(server, "fragile", 0.0, protocol)
    wait_for(lambda: ready(server, "fragile"), 30, "ready after the restart")
    after = call(server, "fragile", 0.0, protocol)
    assert after != before and len(restarts(server, "fragile")) == count + 1
    assert index_row(server, "fragile")["state"] == "READY"
    assert "fragile_0_0" in server.log() and "exited with code 3" in server.log()


def test_a_frozen_instance_is_detected_as_hung(server) -> None:
    started = time.monotonic()
    with pytest.raises(InferenceServerException, match="unresponsive for 2 s"):
        call(server, "hangs", -2)
    assert time.monotonic() - started < 15
    wait_for(lambda: ready(server, "hangs"), 30, "ready after the restart")
    assert call(server, "hangs", 0.0) > 0


def test_an_execute_past_its_timeout_is_killed(server) -> None:
    started = time.monotonic()
    with pytest.raises(InferenceServerException, match="execute_timeout_secs"):
        call(server, "overruns", 60.0)
    assert time.monotonic() - started < 15
    wait_for(lambda: ready(server, "overruns"), 30, "ready after the restart")
    assert call(server, "overruns", 0.0) > 0


def test_requests_queued_during_a_restart_are_served_after_it(server) -> None:
    with pytest.raises(InferenceServerException):
        call(server, "other", -1)
    wait_for(lambda: not ready(server, "other"), 10, "not ready while restarting")
    wait_for(lambda: ready(server, "other"), 30, "ready after the restart")
    with ThreadPoolExecutor(3) as pool:
        pids = list(pool.map(lambda _: call(server, "other", 0.0), range(3)))
    assert len(set(pids)) == 1


@pytest.mark.parametrize("model", ["echo", "echo_small_shm"])
def test_large_tensors_cross_and_their_memory_is_reused(server, model: str) -> None:
    """2 MiB each way, 60 times: through the shared-memory arenas (`echo`), or inline where the 1 MiB
    region is too small (`echo_small_shm`); answers are right and the server's memory stays flat."""
    x = np.random.default_rng(1).random(1 << 19, dtype=np.float32)
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as c:
        i = httpclient.InferInput("IN", [x.size], "FP32")
        i.set_data_from_numpy(x, binary_data=True)
        for _ in range(10):
            c.infer(model, [i])
        anon = memory(server, "RssAnon")
        for _ in range(50):
            np.testing.assert_array_equal(c.infer(model, [i]).as_numpy("OUT"), x + 1)
    assert memory(server, "RssAnon") - anon < 32 << 20  # nothing kept per request
    regions = shared_mappings(server)
    own = {label: rss for label, rss in regions.items() if re.fullmatch(rf"{model}_0_\d+-(in|out)", label)}
    region_bytes = (1 if model == "echo_small_shm" else 16) << 20
    assert len(own) == 2 and sum(own.values()) <= 2 * region_bytes, regions  # at most its instance's regions
    # The engine's shared memory less the frontends' arenas (the transport of the multi-process layout; none
    # with one process, so there this is the whole RssShmem): at most one instance's regions, and a little.
    transport = sum(rss for label, rss in regions.items() if label.startswith("hubserve-frontend-"))
    assert memory(server, "RssShmem") - transport <= 2 * (16 << 20) + (4 << 20), regions


def count(server, x: np.ndarray) -> list[int]:
    with httpclient.InferenceServerClient(server.http_url, network_timeout=120) as c:
        i = httpclient.InferInput("IN", [x.size], "FP32")
        i.set_data_from_numpy(x, binary_data=True)
        return [int(v) for v in c.infer("counter", [i]).as_numpy("OUT")]


def batches_started(server, model: str) -> int:
    """The model's queue count: it grows when a batch leaves the queue for an instance."""
    with httpclient.InferenceServerClient(server.http_url, network_timeout=10) as c:
        stats = c.get_inference_statistics(model)["model_stats"][0]
    return int(stats["inference_stats"]["queue"].get("count", 0))


def test_a_model_sent_more_than_its_arena_stalls_no_other_model(server) -> None:
    """24 MiB for a model whose region is 1 MiB travel inline through its socket. With its process paused
    (SIGSTOP) nothing drains that socket; the engine must still serve other models at once (a blocking write
    from the event loop stalled them all until the watchdog killed the process), and the paused model must
    get its whole request once it goes on."""
    pid, _ = count(server, np.ones(4, np.float32))
    big = np.ones(6 << 20, np.float32)
    before = batches_started(server, "counter")
    with ThreadPoolExecutor(1) as pool:
        os.kill(pid, signal.SIGSTOP)
        try:
            pending = pool.submit(count, server, big)
            wait_for(lambda: batches_started(server, "counter") > before, 30, "the large batch was started")
            for value in range(5):
                started = time.monotonic()
                assert call(server, "echo", float(value)) == value + 1
                assert time.monotonic() - started < 2.0
            assert not pending.done()
        finally:
            os.kill(pid, signal.SIGCONT)
        assert pending.result(60) == [pid, big.size]
    assert count(server, np.ones(3, np.float32)) == [pid, 3]  # the same process, still in step


def test_an_instance_has_its_own_process_group_in_its_servers_session(server) -> None:
    """Its own process group, so a Ctrl-C (SIGINT to the terminal's foreground group) or a signal to the
    server's group reaches the server alone, which finalizes its instances in order; the server's session,
    so that where the kernel groups CPU time by session (Linux autogroup) an instance shares its server's
    group, as Triton's stubs do, rather than being scheduled as a group of its own."""
    pid, _ = count(server, np.ones(2, np.float32))
    assert pid != server.process.pid
    assert os.getsid(pid) == os.getsid(server.process.pid)
    assert os.getpgid(pid) == pid != os.getpgid(server.process.pid)


def memory(server, field: str) -> int:
    """One line of the server's /proc status (RssAnon: its own memory; RssShmem: shared memory it touched)."""
    with open(f"/proc/{server.process.pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{server.process.pid}/status")


def shared_mappings(server) -> dict[str, int]:
    """The resident bytes of each memfd region the server's (engine) process maps, by the region's label
    (engine/shm/regions.py `Region.create`: `<instance>-in` / `-out` for a Python instance,
    `hubserve-frontend-<n>-...` for a frontend process's arenas), from /proc/<pid>/smaps."""
    totals: dict[str, int] = {}
    label = None
    with open(f"/proc/{server.process.pid}/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's first line: range ... path
                path = fields[5] if len(fields) > 5 else ""
                label = path[len("/memfd:"):] if path.startswith("/memfd:") else None
            elif label is not None and fields[0] == "Rss:":
                totals[label] = totals.get(label, 0) + int(fields[1]) * 1024
    return totals


def make_venv(path: Path) -> None:
    """A venv without pip that sees this checkout's packages (numpy) through a .pth file."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    purelib = sysconfig.get_paths()["purelib"]
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (path / "lib" / version / "site-packages" / "checkout.pth").write_text(purelib + "\n")


def test_execution_env_path_runs_the_model_in_its_venv(tmp_path: Path) -> None:
    model = write_model(tmp_path / "repo", "env_model", ENV_REPORT, ENV_CONFIG +
                        'parameters { key: "EXECUTION_ENV_PATH" value: '
                        '{ string_value: "$$TRITON_MODEL_DIRECTORY/venv" } }\n')
    make_venv(model / "venv")
    srv = start_server(tmp_path / "repo", tmp_path / "server.log", "--model-control-mode", "explicit",
                       "--load-model", "env_model")
    try:
        with httpclient.InferenceServerClient(srv.http_url) as c:
            i = httpclient.InferInput("IN", [1], "FP32")
            i.set_data_from_numpy(np.zeros(1, np.float32))
            prefix = c.infer("env_model", [i]).as_numpy("OUT")[0].decode()
        assert os.path.realpath(prefix) == os.path.realpath(model / "venv")
    finally:
        srv.stop()
