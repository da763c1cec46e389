"""The servers of the side-by-side benchmark: how each is started, watched, counted and stopped.

Used by `perf/bench_peers.py` (hubserve's venv). Every server listens on 127.0.0.1 only, on free ports picked
here; it is started in its own process (its own session, so a signal meant for the benchmark does not reach
it) and stopped by its own PID, then any of its descendants that outlive it by their PIDs. Nothing here looks
up processes by name: other engineers run servers on this machine.

Server CPU is utime+stime of the server process and all its descendants (Triton's Python-backend stubs,
MLServer's inference worker) plus what they collected from exited children, read from /proc/<pid>/stat.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from hubserve_harness import free_ports
from hubserve_harness.perf_analyzer import perf_analyzer_available

ROOT = Path(__file__).resolve().parents[2]
PEERS_DIR = ROOT / ".peers"
HUBSERVE_REPO = PEERS_DIR / "hubserve_repo"
"""What hubserve serves here: `repos.write_hubserve_repo` writes it from model_repository/ before a run."""
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Ports:
    http: int
    grpc: int
    metrics: int


@dataclass(frozen=True, slots=True)
class ServerKind:
    """How to run one kind of server. `command` gets the ports and the models to serve."""

    name: str
    command: Callable[[Ports, list[str]], list[str]]
    missing: Callable[[], str | None]
    """None when installed, else what to run to install it."""
    count_inferences: Callable[[Ports, str], int]
    """Inferences of a model served so far, from the server's own counters."""
    reports_batches: bool = False
    """Whether `count_executions` works (the statistics extension)."""
    env: dict[str, str] = field(default_factory=dict)

    def with_args(self, extra: list[str]) -> ServerKind:
        """This kind with `extra` appended to its command line (e.g. hubserve's `--workers 2`); a later copy
        of a flag overrides an earlier one."""
        command = self.command
        return replace(self, command=lambda ports, models: [*command(ports, models), *extra])


def _get(url: str, timeout_s: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return bytes(r.read())


def _stats(ports: Ports, model: str) -> list[dict]:
    return list(json.loads(_get(f"http://127.0.0.1:{ports.http}/v2/models/{model}/stats"))["model_stats"])


def _stats_inferences(ports: Ports, model: str) -> int:
    return sum(int(s["inference_count"]) for s in _stats(ports, model))


def count_executions(ports: Ports, model: str) -> int:
    return sum(int(s["execution_count"]) for s in _stats(ports, model))


def _prometheus_sum(url: str, metric: str, label: str, model: str) -> int:
    pattern = re.compile(rf'^{metric}\{{[^}}]*\b{label}="{re.escape(model)}"[^}}]*\}} ([0-9.e+]+)$',
                         re.MULTILINE)
    return int(sum(float(v) for v in pattern.findall(_get(url).decode())))


def _venv_missing(venv: str, setup: str, *files: Path) -> Callable[[], str | None]:
    def missing() -> str | None:
        for path in (PEERS_DIR / venv / "bin" / "python", *files):
            if not path.exists():
                return f"{path.relative_to(ROOT)} is missing: run `bash perf/peers/{setup}`"
        return None

    return missing


HUBSERVE = ServerKind(
    name="hubserve",
    command=lambda p, models: [
        str(ROOT / ".venv/bin/python"), "-m", "engine", "serve",
        "--model-repository", str(HUBSERVE_REPO.relative_to(ROOT)),
        "--model-control-mode", "none", "--host", "127.0.0.1",
        "--http-port", str(p.http), "--grpc-port", str(p.grpc), "--metrics-port", str(p.metrics),
    ],
    missing=lambda: None if (ROOT / ".venv/bin/python").exists() else ".venv is missing: run `make install`",
    count_inferences=_stats_inferences,
    reports_batches=True,
)

TRITON = ServerKind(
    name="triton",
    command=lambda p, models: [
        str(PEERS_DIR / "triton/bin/tritonserver"), "--model-repository", str(PEERS_DIR / "triton_repo"),
        "--backend-directory", str(PEERS_DIR / "triton/backends"),
        "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
        "--http-port", str(p.http), "--grpc-port", str(p.grpc), "--metrics-port", str(p.metrics),
    ],
    missing=_venv_missing("triton", "setup_triton.sh", PEERS_DIR / "triton/bin/tritonserver"),
    count_inferences=_stats_inferences,
    reports_batches=True,
)

ORT_THREADS = 1
"""ONNX Runtime intra-op threads on every server: hubserve's ONNX backend and the Python peers use one."""

TRITON_ORT = ServerKind(
    name="triton-ort",
    # The backend's global thread pool carries the thread counts, so the generated configs stay the same as
    # the stand-in's; sequential execution and graph optimization level ALL are the backend's defaults.
    command=lambda p, models: [
        str(PEERS_DIR / "triton_ort/bin/tritonserver"),
        "--model-repository", str(PEERS_DIR / "triton_ort_repo"),
        "--backend-directory", str(PEERS_DIR / "triton_ort/backends"),
        "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
        "--http-port", str(p.http), "--grpc-port", str(p.grpc), "--metrics-port", str(p.metrics),
        "--backend-config=onnxruntime,enable-global-threadpool=1",
        f"--backend-config=onnxruntime,intra_op_thread_count={ORT_THREADS}",
        "--backend-config=onnxruntime,inter_op_thread_count=1",
    ],
    missing=lambda: None if (PEERS_DIR / "triton_ort/backends/onnxruntime/libtriton_onnxruntime.so").exists()
    else ".peers/triton_ort is missing: run `SOURCES=<folder> bash perf/peers/setup_triton_ort.sh` "
         "(perf/README.md)",
    count_inferences=_stats_inferences,
    reports_batches=True,
)

KSERVE = ServerKind(
    name="kserve",
    command=lambda p, models: [
        str(PEERS_DIR / "kserve/bin/python"), str(ROOT / "perf/peers/kserve_model.py"),
        "--repository", str(PEERS_DIR / "kserve_repo"), "--models", ",".join(models),
        "--http_port", str(p.http), "--grpc_port", str(p.grpc),
        # No per-request log lines (KServe logs two per request by default; hubserve logs none).
        "--enable_latency_logging", "false", "--configure_logging", "false",
    ],
    missing=_venv_missing("kserve", "setup_kserve.sh"),
    count_inferences=lambda p, m: _prometheus_sum(
        f"http://127.0.0.1:{p.http}/metrics", "request_predict_seconds_count", "model_name", m),
)

MLSERVER = ServerKind(
    name="mlserver",
    command=lambda p, models: [
        str(PEERS_DIR / "mlserver/bin/python"), str(ROOT / "perf/peers/mlserver_runtime.py"),
        "--repository", str(PEERS_DIR / "mlserver_repo"),
        "--http-port", str(p.http), "--grpc-port", str(p.grpc), "--metrics-port", str(p.metrics),
    ],
    missing=_venv_missing("mlserver", "setup_mlserver.sh"),
    count_inferences=lambda p, m: _prometheus_sum(
        f"http://127.0.0.1:{p.metrics}/metrics", "model_infer_request_duration_count", "model", m),
)


def hubserve_from(tree: Path) -> ServerKind:
    """hubserve as another checkout's `engine/` has it (e.g. a tag before a refactor), served by this venv
    beside this checkout's, so a before-and-after comparison runs interleaved in one run. The other tree goes
    first on `sys.path`, ahead of the working directory and of the editable install."""
    tree = tree.resolve()
    boot = (f"import runpy, sys; sys.path.insert(0, {str(tree)!r}); "
            "runpy.run_module('engine', run_name='__main__', alter_sys=True)")
    return replace(HUBSERVE, name=f"hubserve@{tree.name}",
                   command=lambda p, models: [str(ROOT / ".venv/bin/python"), "-c", boot,
                                              *HUBSERVE.command(p, models)[3:]],
                   missing=lambda: None if (tree / "engine/__main__.py").exists()
                   else f"{tree}/engine/__main__.py is missing")


# This checkout's engine as pure Python (HUBSERVE_NATIVE=0, engine/native.py) beside `hubserve`, which runs
# the compiled hot path where build/native is fresh (`make native`): `--servers hubserve,hubserve-pure`.
HUBSERVE_PURE = replace(HUBSERVE, name="hubserve-pure", env={"HUBSERVE_NATIVE": "0"})

# hubserve with `--workers N` beside it, so one run can put process layouts side by side.
HUBSERVE_WORKERS = tuple(replace(HUBSERVE.with_args(["--workers", str(n)]), name=f"hubserve-w{n}")
                         for n in (1, 2, 3, 4, 8))
KINDS = {k.name: k for k in (HUBSERVE, HUBSERVE_PURE, *HUBSERVE_WORKERS, TRITON, TRITON_ORT, KSERVE,
                             MLSERVER)}


@dataclass
class RunningServer:
    kind: ServerKind
    process: subprocess.Popen
    ports: Ports
    command: list[str]
    log_path: Path
    version: str = ""

    @property
    def pid(self) -> int:
        return self.process.pid

    def url(self, protocol: str) -> str:
        return f"127.0.0.1:{self.ports.grpc if protocol == 'grpc' else self.ports.http}"

    def cpu_s(self) -> float:
        return sum(_cpu_ticks(pid) for pid in (self.pid, *descendants(self.pid))) / CLOCK_TICKS_PER_S

    def inferences(self, model: str) -> int:
        return self.kind.count_inferences(self.ports, model)

    def executions(self, model: str) -> int | None:
        return count_executions(self.ports, model) if self.kind.reports_batches else None

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to our PID, SIGKILL after `timeout_s`; then SIGKILL to descendants that outlived it."""
        children = {pid: _start_time(pid) for pid in descendants(self.pid)}
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_start_time(p) == t for p, t in children.items()):
            time.sleep(0.1)
        for pid, started in children.items():
            if started is not None and _start_time(pid) == started:  # the same process, not a reused PID
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def start(kind: ServerKind, models: list[str], log_dir: Path,
          ready_timeout_s: float = 180.0) -> RunningServer:
    """Start a server and return once it and every model in `models` answer ready; raise RuntimeError if
    not."""
    ports = Ports(*free_ports(3))
    command = kind.command(ports, models)
    log_path = log_dir / f"{kind.name}.log"
    with open(log_path, "ab") as log:  # appended: a server restarted mid-run keeps its first log
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1", **kind.env},
                                   start_new_session=True)
    server = RunningServer(kind, process, ports, command, log_path)
    urls = [f"http://127.0.0.1:{ports.http}/v2/health/ready",
            *(f"http://127.0.0.1:{ports.http}/v2/models/{m}/ready" for m in models)]
    deadline = time.monotonic() + ready_timeout_s
    while urls:
        if process.poll() is not None:
            raise RuntimeError(f"{kind.name} exited with {process.returncode}; last lines of {log_path}:\n"
                               + _tail(log_path))
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"{kind.name} not ready within {ready_timeout_s:.0f} s ({urls[0]}); "
                               f"last lines of {log_path}:\n" + _tail(log_path))
        try:
            _get(urls[0], timeout_s=2)
            urls.pop(0)
        except OSError:
            time.sleep(0.2)
    server.version = json.loads(_get(f"http://127.0.0.1:{ports.http}/v2")).get("version", "")
    return server


def descendants(pid: int) -> list[int]:
    """Live descendants of `pid`, from the parent links in /proc/<pid>/stat."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name: [0] state, [1] ppid, [11] utime, ...
    (man 5 proc)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def missing_for_bench(names: list[str]) -> str | None:
    """What a perf_analyzer bench over servers `names` cannot run without (perf_analyzer; Triton's own
    install where "triton" is among them), as the line to print; None when nothing is missing."""
    if not perf_analyzer_available():
        return "perf_analyzer is missing: bash tools/install_perf_analyzer.sh"
    return TRITON.missing() if "triton" in names else None


def machine_cpu_ticks() -> tuple[int, int]:
    """The machine's (idle, all) CPU time so far, in clock ticks, over every core (/proc/stat's first line;
    idle counts iowait too)."""
    with open("/proc/stat") as stat:
        ticks = [int(f) for f in stat.readline().split()[1:]]
    return ticks[3] + ticks[4], sum(ticks)


def _cpu_ticks(pid: int) -> int:
    fields = _stat_fields(pid)
    return sum(int(f) for f in fields[11:15]) if fields else 0  # utime, stime, cutime, cstime


def _start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def _tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
