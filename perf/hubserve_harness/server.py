"""A real hubserve process on free loopback ports, for tests and benchmarks.

The server runs in its own process: our generated protos and tritonclient's both define package `inference`,
and a separate process is also the honest way to test a server. It runs `python -m engine` with the
repository root as its working directory, so it serves this checkout's code.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .checkout import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(count: int) -> list[int]:
    """`count` different free ports. Picked one after another, the kernel may hand back a port it has just
    released, and a server given one port for two flags refuses to start; held open together, they differ."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]


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

    def rss_bytes(self) -> int:
        """The server's resident size (VmRSS), for tests whose point is memory given back: the process's,
        plus its children's with `--workers N` (the frontend processes hold what their connections hold)."""
        pid = self.process.pid
        total = _rss(pid)
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                children = [int(p) for p in f.read().split()]
        except FileNotFoundError:
            children = []
        for child in children:
            with contextlib.suppress(FileNotFoundError, AssertionError):  # exited meanwhile
                total += _rss(child)
        return total

    def metric(self, name: str, model: str, version: str = "1") -> float:
        """One model's value of a Prometheus family, read from /metrics."""
        return self.metric_values([name], model, version)[name]

    def metric_values(self, names: Sequence[str], model: str, version: str = "1") -> dict[str, float]:
        """One model's values of several families from one read of /metrics, so they agree with each other
        (each `metric` call is its own read, and the server moves on between two)."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as r:
            assert r.status == 200
            text = r.read().decode()
        values = {}
        for name in names:
            match = re.search(rf'^{name}\{{model="{model}",version="{version}"\}} (\S+)$', text, re.MULTILINE)
            assert match, f"{name} for {model} v{version} missing from /metrics:\n{text[:2000]}"
            values[name] = float(match.group(1))
        return values

    def stop(self, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return int(self.process.returncode)


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def start_server(repository: Path, log_path: Path, *extra: str, ready_timeout: float = 60.0,
                 wait_ready: bool = True, env: dict[str, str] | None = None,
                 https: ssl.SSLContext | None = None) -> RunningServer:
    """Start `python -m engine serve` and wait until it answers /v2/health/live (and ready, if asked). `env`
    adds to (or overrides) the server's environment, e.g. TMPDIR. `https`: the server's HTTP port speaks
    TLS (`--http-use-ssl`); the client context the wait connects with.

    The process layout is `--workers` from `extra` if given, else HUBSERVE_TEST_WORKERS (default 1, one
    process), so a suite can be run against the multi-process server unchanged.

    The ports are free ones picked here, so another process can take one before the server binds it: a
    server that exits for a port already in use is started again on new ports (three tries)."""
    for attempt in range(3):
        try:
            return _start_server(repository, log_path, *extra, ready_timeout=ready_timeout,
                                 wait_ready=wait_ready, env=env, https=https)
        except _PortTaken:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


class _PortTaken(RuntimeError):
    pass


def _bound(server: RunningServer) -> bool:
    """Whether this server's process holds the listening socket of its HTTP port. An answer on that port may
    be another process's: a concurrent test's server handed the same free port, which this one then fails to
    bind (and is started again on new ports). Read from /proc (Linux); elsewhere the answer is taken."""
    tables = [Path("/proc/net/tcp"), Path("/proc/net/tcp6")]
    if not tables[0].is_file():
        return True
    port = f":{server.http_port:04X}"
    listening = set()
    for table in tables:
        with contextlib.suppress(OSError):
            for row in table.read_text().splitlines()[1:]:
                fields = row.split()
                if fields[1].endswith(port) and fields[3] == "0A":  # local address, state LISTEN
                    listening.add(f"socket:[{fields[9]}]")  # the socket's inode
    return not listening.isdisjoint(fd_links(server.process.pid))


def fd_links(pid: int) -> list[str]:
    """What process `pid`'s open descriptors point to (`socket:[<inode>]`, paths), one entry per descriptor
    (a dup'd one counts again), read from /proc/<pid>/fd; empty once the process is gone."""
    links = []
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):  # closed since the listing
                links.append(os.readlink(fd))
    return links


def _start_server(repository: Path, log_path: Path, *extra: str, ready_timeout: float, wait_ready: bool,
                  env: dict[str, str] | None, https: ssl.SSLContext | None) -> RunningServer:
    http, grpc_port, metrics = free_ports(3)
    workers = () if "--workers" in extra else ("--workers", os.environ.get("HUBSERVE_TEST_WORKERS", "1"))
    cmd = [sys.executable, "-m", "engine", "serve", "--model-repository", str(repository),
           "--host", "127.0.0.1", "--http-port", str(http), "--grpc-port", str(grpc_port),
           "--metrics-port", str(metrics), *workers, *extra]
    with open(log_path, "wb") as log:  # the server holds its own copy of the descriptor
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    server = RunningServer(proc, http, grpc_port, metrics, repository, log_path)
    path = "/v2/health/ready" if wait_ready else "/v2/health/live"
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = server.log()
            if "address already in use" in text.lower():  # EADDRINUSE, in uvloop's words or the OS's
                raise _PortTaken(f"server exited with {proc.returncode}:\n{text}")
            raise RuntimeError(f"server exited with {proc.returncode}:\n{text}")
        try:
            scheme = "https" if https is not None else "http"
            with urllib.request.urlopen(f"{scheme}://127.0.0.1:{http}{path}", timeout=1,
                                        context=https) as r:
                if r.status == 200 and _bound(server):
                    return server
        except OSError:
            pass
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"server not ready within {ready_timeout}s:\n{server.log()}")
