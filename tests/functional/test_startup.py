"""What `hubserve serve` says and does as it starts, on real processes: a port it cannot have fails the start
at once, before any model loads, with one line naming the flag (engine/frontend/listeners.py), in both
process layouts; once up, one line says it is ready, with the models ready and not, the ports and the time
taken (engine/lifecycle_log.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ROOT, free_ports, start_server, wait_until
from python_models import add_simple, write_model

# A model that takes a minute to load: were the ports checked after loading, the start would take that long.
SLOW = """
import time

class TritonPythonModel:
    def initialize(self, args):
        time.sleep(60)

    def execute(self, requests):
        return []
"""
SLOW_CONFIG = ('input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
               'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')
FAILS_WITHIN_S = 20.0  # a start on this 2-core machine's busiest day, far below the slow model's minute


@pytest.fixture(scope="module")
def slow_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("slow_repository")
    write_model(root, "slow", SLOW, SLOW_CONFIG)
    return root


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another process listens on (a real bound, listening socket)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def serve(repository: Path, ports: dict[str, int], workers: str) -> tuple[int, str, float]:
    """Run `hubserve serve` to its exit; its exit code, its output (stdout and stderr) and how long it ran."""
    flags = [item for flag, port in ports.items() for item in (flag, str(port))]
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "engine", "serve", "--model-repository", str(repository),
                           "--host", "127.0.0.1", "--workers", workers, *flags], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("flag", ["--http-port", "--grpc-port", "--metrics-port"])
def test_a_taken_port_fails_at_once_in_one_line_naming_the_flag(slow_repository, taken_port, flag, workers):
    ports = {**dict(zip(("--http-port", "--grpc-port", "--metrics-port"), free_ports(3), strict=True)),
             flag: taken_port}
    code, output, took_s = serve(slow_repository, ports, workers)
    assert code == 2, output
    assert output.splitlines() == [f"hubserve: {flag} {taken_port} (on 127.0.0.1): address already in use by "
                                   f"another process; stop it, or give {flag} another port (0: any free one)"]
    assert took_s < FAILS_WITHIN_S, f"{took_s:.1f} s: did a model load first?"


@pytest.mark.parametrize(("flags", "workers"), [(("--http-port", "--grpc-port"), "1"),
                                                (("--http-port", "--grpc-port"), "2"),
                                                (("--grpc-port", "--metrics-port"), "1"),
                                                (("--http-port", "--metrics-port"), "2")])
def test_one_port_for_two_flags_fails_at_once_naming_both(slow_repository, flags, workers):
    port, *others = free_ports(4)
    ports = {**dict(zip(("--http-port", "--grpc-port", "--metrics-port"), others, strict=True)),
             **dict.fromkeys(flags, port)}
    code, output, took_s = serve(slow_repository, ports, workers)
    first, second = flags
    assert code == 2, output
    assert output.splitlines() == [f"hubserve: {second} {port} is also {first}: each port serves one "
                                   f"protocol, so give {second} a port of its own"]
    assert took_s < FAILS_WITHIN_S, f"{took_s:.1f} s: did a model load first?"


def test_one_line_says_the_server_is_ready_with_its_models_and_ports(tmp_path):
    root = tmp_path / "repo"
    add_simple(root)
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.onnx").write_bytes(b"this is not an ONNX file")
    server = start_server(root, tmp_path / "server.log", wait_ready=False)  # strict: never ready with broken
    try:
        line = wait_until(lambda: next((x for x in server.log().splitlines() if "ready in" in x), ""),
                          "the ready line")
        assert " INFO hubserve: ready in " in line, line
        where = (f"HTTP on 127.0.0.1:{server.http_port}, gRPC on 127.0.0.1:{server.grpc_port}, metrics on "
                 f"127.0.0.1:{server.metrics_port}")
        # (then "; 2 frontend processes" with HUBSERVE_TEST_WORKERS=2)
        assert f" s: 1 model ready, 1 failed to load (broken; the reasons are above); {where}" in line, line
        took = float(line.split("ready in ")[1].split(" s:")[0])
        assert 0 < took < 60, line
        assert sum("ready in" in x for x in server.log().splitlines()) == 1
    finally:
        server.stop()


def test_the_harness_never_takes_another_servers_answer_for_its_own(tmp_path, monkeypatch):
    """The suite runs three pytest processes side by side, each picking free ports: a port one picked and let
    go may be bound by another's server a moment later. The server started on it then fails to bind, but the
    other server answers its health check; the harness must not return it (its test would talk to the other
    server: a keys test got 401 from one with other keys). It waits until the server's own process holds the
    port (perf/hubserve_harness/server.py `_bound`) and starts it again on new ports."""
    from hubserve_harness import server as harness

    root = tmp_path / "repo"
    add_simple(root)
    other = start_server(root, tmp_path / "other.log")
    try:
        picks = [[other.http_port, *free_ports(2)]]
        real = harness.free_ports
        monkeypatch.setattr(harness, "free_ports", lambda n: picks.pop() if picks else real(n))
        ours = start_server(root, tmp_path / "ours.log")
        try:
            assert ours.http_port != other.http_port and ours.process.poll() is None
            assert harness._bound(ours)
        finally:
            ours.stop()
    finally:
        other.stop()
