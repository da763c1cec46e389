"""Run NVIDIA's perf_analyzer (2.47.0) from tests and benchmarks.

Part of the harness (perf/hubserve_harness/), not a test file. The binary is installed by
``tools/install_perf_analyzer.sh`` into ``<repo>/.tools``; ``PERF_ANALYZER`` is the wrapper
script there, which puts ``.tools/lib`` (libcudart.so.12) on ``LD_LIBRARY_PATH``.

Typical use::

    from hubserve_harness.perf_analyzer import perf_analyzer_available, run_perf_analyzer

    result = run_perf_analyzer("simple", "localhost:8001", "grpc")
    assert result.returncode == 0, result.output
    assert result.throughput > 0
"""

from __future__ import annotations

import csv
import io
import os
import resource
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .checkout import ROOT as REPO_ROOT

INSTALLER = REPO_ROOT / "tools" / "install_perf_analyzer.sh"
PERF_ANALYZER = REPO_ROOT / ".tools" / "bin" / "perf_analyzer"

# Short, loose measurement settings for a shared 2-core machine: 0.5 s windows (hundreds of
# requests each, even on a loaded machine; a test asks perf_analyzer to accept our answers and
# measure, not for a precise number), a measurement counts as stable when the last 3 windows are
# within 50% of each other (default 10%), at most 10 windows (the default), one fixed concurrency
# level (no sweep). Flags checked against the 2.47.0 usage text. Arguments passed as extra_args
# come after these; for single-valued options such as --concurrency-range the last occurrence wins.
DEFAULT_ARGS: tuple[str, ...] = (
    "--measurement-interval",
    "500",
    "--stability-percentage",
    "50",
    "--max-trials",
    "10",
    "--concurrency-range",
    "1",
)

PROTOCOLS = ("http", "grpc")

# Column of the -f CSV report holding the throughput.
THROUGHPUT_COLUMN = "Inferences/Second"


@dataclass(frozen=True)
class PerfResult:
    returncode: int
    """perf_analyzer's exit status (0 on success; 124 when ``timeout_s`` ran out)."""
    output: str
    """stdout and stderr, interleaved as perf_analyzer wrote them."""
    throughput: float
    """Inferences/Second of the first CSV row; 0.0 when there is no CSV report or no such column."""
    command: tuple[str, ...] = ()
    csv_rows: tuple[dict[str, str], ...] = field(default=(), repr=False)
    """All rows of the CSV report (one per concurrency level), as perf_analyzer wrote them."""
    timed_out: bool = False
    peak_rss_mb: float | None = None
    """perf_analyzer's own peak resident memory (`run_reaped`); why it matters: perf/peers/report.py
    `Measurement.client_peak_rss_mb`."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0


@dataclass(frozen=True, slots=True)
class ChildUsage:
    """What this process's ended children used so far (the perf_analyzer runs; a server still running is not
    counted until it ends): CPU seconds, minor page faults, context switches.
    On a machine the client shares with the server, a client's faults (fresh pages it must zero) and
    switches (each wake-up) are where its CPU per inference differs between servers it loads alike."""

    cpu_s: float
    faults: int
    switches: int

    def __sub__(self, other: ChildUsage) -> ChildUsage:
        return ChildUsage(self.cpu_s - other.cpu_s, self.faults - other.faults,
                          self.switches - other.switches)


def children_usage() -> ChildUsage:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ChildUsage(usage.ru_utime + usage.ru_stime, usage.ru_minflt, usage.ru_nvcsw + usage.ru_nivcsw)


def perf_analyzer_available() -> bool:
    """Whether the installer has been run (for ``pytest.mark.skipif``)."""
    return os.access(PERF_ANALYZER, os.X_OK)


def run_perf_analyzer(
    model: str,
    url: str,
    protocol: str,
    *extra_args: str,
    timeout_s: float = 120,
) -> PerfResult:
    """Run perf_analyzer once against ``model`` and return its exit status, output and throughput.

    ``url`` is ``host:port`` with no scheme (perf_analyzer's ``-u``), e.g. ``localhost:8000``
    for HTTP or ``localhost:8001`` for gRPC. ``protocol`` is ``"http"`` or ``"grpc"``.
    ``extra_args`` are appended to the command line, e.g. ``"-b", "4"`` or
    ``"--shape", "INPUT0:16"``.
    """
    if not perf_analyzer_available():
        raise FileNotFoundError(f"{PERF_ANALYZER} is missing; run {INSTALLER.relative_to(REPO_ROOT)}")
    protocol = protocol.lower()
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, not {protocol!r}")
    if "://" in url:
        raise ValueError(f"url must be host:port without a scheme, not {url!r}")

    with tempfile.TemporaryDirectory(prefix="perf_analyzer.") as tmp:
        report = Path(tmp) / "report.csv"
        command = (
            str(PERF_ANALYZER),
            "-m",
            model,
            "-u",
            url,
            "-i",
            protocol,
            *DEFAULT_ARGS,
            "-f",
            str(report),
            *extra_args,
        )
        returncode, raw, timed_out, peak_rss_kb = run_reaped(command, timeout_s)
        if timed_out:
            raw += f"\n[perf_analyzer timed out after {timeout_s} s]\n".encode()
        output = raw.decode("utf-8", errors="replace")
        rows = _read_csv_report(report)

    return PerfResult(
        returncode=returncode,
        output=output,
        throughput=_throughput(rows),
        command=command,
        csv_rows=rows,
        timed_out=timed_out,
        peak_rss_mb=peak_rss_kb / 1024 if peak_rss_kb else None,
    )


def run_reaped(command: tuple[str, ...], timeout_s: float) -> tuple[int, bytes, bool, int]:
    """Run ``command`` to its end (killed after ``timeout_s``: exit 124) and reap it with wait4(2), which
    returns that one process's resource usage, its peak RSS among it. ``RUSAGE_CHILDREN`` has only the
    largest peak of all children so far. The wrapper script execs the binary, so the PID is
    perf_analyzer's. Linux carries the parent's RSS at the fork into the child's peak, so the number is at
    least this process's RSS then (tens of MB for a bench, against the GBs perf_analyzer grows to).
    Returns (exit status, stdout and stderr, timed out, peak RSS in KiB)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    killed = threading.Event()

    def kill() -> None:
        killed.set()
        proc.kill()

    timer = threading.Timer(timeout_s, kill)
    timer.start()
    try:
        assert proc.stdout is not None
        with proc.stdout:
            raw = proc.stdout.read()  # EOF: it exited (or closed its output and is about to)
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    if killed.is_set() and os.WIFSIGNALED(status):
        return 124, raw, True, usage.ru_maxrss
    return proc.returncode, raw, False, usage.ru_maxrss


def _read_csv_report(path: Path) -> tuple[dict[str, str], ...]:
    """Rows of perf_analyzer's -f report; () if it was not written (perf_analyzer failed)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ()
    # The latency table comes first; with --verbose-csv/--collect-metrics further tables follow
    # after a blank line. Only the first table is read.
    table = text.replace("\r\n", "\n").split("\n\n", 1)[0]
    return tuple(csv.DictReader(io.StringIO(table)))


def _throughput(rows: tuple[dict[str, str], ...]) -> float:
    if not rows:
        return 0.0
    try:
        return float(rows[0].get(THROUGHPUT_COLUMN) or 0.0)
    except ValueError:
        return 0.0


def run_perf_analyzer_settled(model: str, url: str, protocol: str, *extra_args: str,
                              timeout_s: float = 120) -> PerfResult:
    """`run_perf_analyzer` for tests: on exit 2 ("no stable measurement", a shared machine's noise, not the
    protocol, which is 99) once more with a looser stability rule; any protocol problem still fails it."""
    result = run_perf_analyzer(model, url, protocol, *extra_args, timeout_s=timeout_s)
    if result.returncode == 2:
        result = run_perf_analyzer(model, url, protocol, *extra_args, "--stability-percentage", "100",
                                   "--max-trials", "20", timeout_s=timeout_s * 1.5)
    return result
