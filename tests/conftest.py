"""Shared fixtures: a real hubserve process on free loopback ports, serving a repository built for the test
session from the example configs plus test-only models.

The server runs in its own process: our generated protos and tritonclient's both define package `inference`,
and a separate process is also the honest way to test a server.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "model_repository"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningServer:
    process: subprocess.Popen
    http_port: int
    grpc_port: int
    metrics_port: int
    repository: Path
    log_path: Path

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str, model: str, version: str = "1") -> float:
        """One model's value of a Prometheus family, read from /metrics."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as r:
            assert r.status == 200
            text = r.read().decode()
        match = re.search(rf'^{name}\{{model="{model}",version="{version}"\}} (\S+)$', text, re.MULTILINE)
        assert match, f"{name} for {model} v{version} missing from /metrics:\n{text[:2000]}"
        return float(match.group(1))

    def stop(self, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return int(self.process.returncode)


def start_server(repository: Path, log_path: Path, *extra: str, ready_timeout: float = 60.0,
                 wait_ready: bool = True, env: dict[str, str] | None = None) -> RunningServer:
    """Start `python -m engine serve` and wait until it answers /v2/health/live (and ready, if asked). `env`
    adds to (or overrides) the server's environment, e.g. TMPDIR."""
    http, grpc_port, metrics = free_port(), free_port(), free_port()
    cmd = [sys.executable, "-m", "engine", "serve", "--model-repository", str(repository), "--host", "127.0.0.1",
           "--http-port", str(http), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics), *extra]
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    server = RunningServer(proc, http, grpc_port, metrics, repository, log_path)
    path = "/v2/health/ready" if wait_ready else "/v2/health/live"
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}{path}", timeout=1) as r:
                if r.status == 200:
                    return server
        except OSError:
            pass
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"server not ready within {ready_timeout}s:\n{server.log()}")


def build_test_repository(root: Path) -> Path:
    """The example models with their committed configs, plus test-only models."""
    from engine import examples

    for name in ("simple", "mlp", "strings"):
        src = EXAMPLES / name
        dst = root / name
        dst.mkdir(parents=True, exist_ok=True)
        for cfg in src.glob("config.*"):
            shutil.copy(cfg, dst / cfg.name)
    examples.build_repository(root, ["simple", "mlp", "strings"])
    for datatype in ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                     "FP16", "FP32", "FP64", "BYTES"):
        examples.write_model(examples.identity_model(datatype, (-1, 4)),
                             root / f"identity_{datatype.lower()}" / "1" / "model.onnx")
    # A model that never loads: the rest must serve regardless.
    broken = root / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.onnx").write_bytes(b"this is not an ONNX file")
    return root


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_test_repository(tmp_path_factory.mktemp("repository"))


@pytest.fixture(scope="session")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory):
    """One server for the read-mostly functional tests. Non-strict readiness: 'broken' never loads."""
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    srv = start_server(repository, log_path, "--no-strict-readiness", "--model-control-mode", "none")
    yield srv
    srv.stop()
