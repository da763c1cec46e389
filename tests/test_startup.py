"""What `hubserve serve` says and does as it starts, on real processes: a port it cannot have fails the start
at once, before any model loads, with one line naming the flag (engine/frontend/listeners.py), in both
process layouts."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ROOT, free_port
from python_models import write_model

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
    ports = {"--http-port": free_port(), "--grpc-port": free_port(), "--metrics-port": free_port(),
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
    port = free_port()
    ports = {"--http-port": free_port(), "--grpc-port": free_port(), "--metrics-port": free_port(),
             **dict.fromkeys(flags, port)}
    code, output, took_s = serve(slow_repository, ports, workers)
    first, second = flags
    assert code == 2, output
    assert output.splitlines() == [f"hubserve: {second} {port} is also {first}: each port serves one "
                                   f"protocol, so give {second} a port of its own"]
    assert took_s < FAILS_WITHIN_S, f"{took_s:.1f} s: did a model load first?"
