"""The scaling run (issue 32): hubserve `--workers 1, 2, 4, 8` and `auto` on one machine, each layout alone,
`simple` and `mlp` in their tuned configs (max_batch_size 64, a 1000 µs window), over gRPC and HTTP, driven
by the real perf_analyzer, with the server and the load generator pinned to different cores. Started by
perf/scaling_check.sh (which installs the carried wheels first on a lent machine).

    perf/scaling_check.sh [--dry-run] [--out FILE.json] [--server-cores 0-7] [--client-cores 8-15]

Why each layout alone, not all at once as bench_workers.py does: on the lent machine the point is how far one
layout gets with the server's cores to itself; several servers sharing cores 0-7 would measure each other.

Per layout, model and protocol, one closed-loop point at concurrency 16 · workers (at most --max-concurrency),
so a layout with more frontends gets the requests in flight it needs to be saturated. Around each point: the
utime+stime of the server's processes (engine and frontends, /proc) and the model's inference and execution
counts (statistics extension), so CPU per inference is the server's own, whatever the load tool costs.
Scaling efficiency = throughput ÷ (workers × the 1-worker throughput at the same model and protocol).

The load tool: perf_analyzer (.tools/bin/perf_analyzer, the wrapper that puts .tools/lib on the library path)
when it starts here (`--version` answers; `ldd` on its binary says what is missing otherwise: libb64.so.0d and
libcudart.so.12 are not in the device image and are carried in .tools/lib); else `hubserve perf` (our own
tool, perf/README "hubserve perf against perf_analyzer": agrees within ±15 %), and the results say which and
why. Pinning: this process moves itself to --client-cores (the load tool inherits it), each server starts on
--server-cores (sched_setaffinity, as `taskset -c`; `--workers auto` reads that affinity to choose).

`--dry-run`: the same steps at tiny scale for CI on 2 cores: workers 1 and 2, short windows, server on core 0
and load on core 1 (no pinning on one core), concurrency 4 · workers. The time limit (--limit-s) is kept by
skipping what would not end in time: a skipped point is in the file with its reason.

ONE results file: `{"dry_run", "machine", "tool", "pinning", "settings", "points": [{layout, workers, model,
protocol, concurrency, status, infer_per_s, p99_ms, cpu_us_per_infer, engine_us, frontends_us, avg_batch,
efficiency}], "table", "seconds"}`; `table` is the text table, printed as the run ends too.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench_workers import TICKS_PER_S, Server, children
from engine.cli.parser import AUTO_WORKERS, AUTO_WORKERS_MIN_CORES
from hubserve_harness.checkout import ROOT
from hubserve_harness.perf_analyzer import PERF_ANALYZER
from hubserve_models.examples import build_repository
from peers.repos import write_hubserve_repo
from peers.variants import TUNED

MODELS = ("simple", "mlp")
PROTOCOLS = ("grpc", "http")
PER_WORKER = 16  # requests in flight per frontend: what saturated one process at c = 16-32 on 2 cores
POINT_OVERHEAD_S = 4.0  # a load tool's start, connections and first window beyond the measured windows
PASS = re.compile(r"Pass \[\d+\] throughput: ([\d.]+) infer/sec")


@dataclass
class Point:
    layout: str
    workers: int
    model: str
    protocol: str
    concurrency: int
    status: str = "pass"  # "pass", "unstable", "fail: ...", "skipped: ..."
    infer_per_s: float = 0.0
    p99_ms: float | None = None  # None: no stable window, so the load tool reported no percentiles
    cpu_us_per_infer: float = 0.0
    engine_us: float = 0.0
    frontends_us: float = 0.0
    avg_batch: float = 0.0
    efficiency: float | None = None


@dataclass
class Tool:
    name: str  # "perf_analyzer" or "hubserve perf"
    why: str
    missing_libraries: list[str] = field(default_factory=list)


def parse_cores(text: str) -> frozenset[int]:
    """`taskset -c` syntax: 0-7,12."""
    cores: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cores.update(range(int(first), int(last or first) + 1))
    return frozenset(cores)


def pick_tool(force: str) -> Tool:
    """perf_analyzer when it runs here, else `hubserve perf`, saying why."""
    if force == "hubserve":
        return Tool("hubserve perf", "--tool hubserve")
    binary = PERF_ANALYZER.with_name("perf_analyzer.bin")
    if not os.access(PERF_ANALYZER, os.X_OK) or not binary.exists():
        return Tool("hubserve perf", f"{PERF_ANALYZER.relative_to(ROOT)} is not here (not carried?)")
    env = {**os.environ, "LD_LIBRARY_PATH": str(PERF_ANALYZER.parent.parent / "lib")}
    ldd = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, env=env, check=False)
    missing = sorted({line.split()[0] for line in ldd.stdout.splitlines() if "not found" in line})
    try:
        done = subprocess.run([str(PERF_ANALYZER), "--version"], capture_output=True, text=True, timeout=30,
                              check=False)
        answered = done.returncode == 0 and "Perf Analyzer Version" in done.stdout + done.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        answered, done = False, None
        missing.append(str(e))
    if answered and not missing:
        return Tool("perf_analyzer", "runs here (--version answered, ldd found every library)")
    if force == "perf_analyzer":
        sys.exit(f"perf_analyzer does not run here; missing: {missing}")
    return Tool("hubserve perf", "perf_analyzer does not start here", missing)


def load(tool: Tool, model: str, url: str, protocol: str, concurrency: int, interval_ms: int,
         max_trials: int, stability: int) -> tuple[str, float, float | None]:
    """One closed-loop point: (status, infer/s, p99 ms or None)."""
    timeout = max_trials * interval_ms / 1000 * 1.5 + 60
    with tempfile.TemporaryDirectory(prefix="scaling.") as tmp:
        report = Path(tmp) / "report.csv"
        if tool.name == "perf_analyzer":
            command = [str(PERF_ANALYZER), "-m", model, "-u", url, "-i", protocol, "-b", "1",
                       "--input-data", "zero", "--concurrency-range", str(concurrency),
                       "--measurement-interval", str(interval_ms), "--stability-percentage", str(stability),
                       "--max-trials", str(max_trials), "-f", str(report), "-v"]
        else:
            command = [sys.executable, "-m", "hubserve_perf", "-m", model, "-u", url, "-i", protocol,
                       "-b", "1", "--input-data", "zero",
                       "--concurrency-range", f"{concurrency}:{concurrency}:1",
                       "-p", str(interval_ms), "-s", str(stability), "-r", str(max_trials), "-f", str(report),
                       "--json", str(Path(tmp) / "report.json")]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                                  check=False)
        except subprocess.TimeoutExpired:
            return f"fail: {tool.name} ran past {timeout:.0f} s", 0.0, None
        if tool.name == "hubserve perf" and (Path(tmp) / "report.json").exists():
            step = json.loads((Path(tmp) / "report.json").read_text())["steps"][-1]
            status = "pass" if step["stable"] else "unstable"  # hubserve perf reports percentiles either way
            return status, float(step["throughput_infer_per_s"]), float(step["latency_us"]["p99"]) / 1000
        rows = list(csv.DictReader(report.open())) if report.exists() else []
        passes = PASS.findall(done.stdout)
        if not rows and done.returncode == 2 and passes:
            # no stable measurement: no report, but each window's throughput was printed (no percentiles)
            return "unstable", float(passes[-1]), None
        if not rows:
            last = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()][-1:]
            return f"fail: {tool.name} exit {done.returncode}: {' '.join(last)[:200]}", 0.0, None
        return ("pass" if done.returncode == 0 else "unstable", float(rows[0]["Inferences/Second"]),
                float(rows[0]["p99 latency"]) / 1000)


def measure(server: Server, tool: Tool, point: Point, url: str, args: argparse.Namespace) -> None:
    """One point into `point`: the load tool's throughput and p99, the server's CPU per inference."""
    model = TUNED.served_name(point.model)
    cpu0, (n0, e0) = server.cpu(), server.counts(model)
    point.status, point.infer_per_s, point.p99_ms = load(
        tool, model, url, point.protocol, point.concurrency, args.interval_ms, args.max_trials,
        args.stability)
    cpu1, (n1, e1) = server.cpu(), server.counts(model)
    n = n1 - n0
    if n <= 0:
        point.status = point.status if point.status.startswith("fail") else "fail: no inferences counted"
        return
    per = {p: (cpu1[p] - cpu0.get(p, cpu1[p])) / TICKS_PER_S * 1e6 / n for p in cpu1}
    point.engine_us = per.pop(server.process.pid)
    point.frontends_us = sum(per.values())
    point.cpu_us_per_infer = point.engine_us + point.frontends_us
    point.avg_batch = n / max(e1 - e0, 1)


def auto_workers(server_cores: frozenset[int]) -> int:
    """What `--workers auto` picks on these cores (engine/cli/parser.py default_workers reads the
    affinity)."""
    return 1 if len(server_cores) < AUTO_WORKERS_MIN_CORES else AUTO_WORKERS


def efficiencies(points: list[Point]) -> None:
    base = {(p.model, p.protocol): p.infer_per_s for p in points
            if p.layout == "1" and p.infer_per_s > 0 and not p.status.startswith(("fail", "skipped"))}
    for p in points:
        one = base.get((p.model, p.protocol))
        if one and p.infer_per_s > 0:
            p.efficiency = round(p.infer_per_s / (p.workers * one), 3)


def table(points: list[Point]) -> list[str]:
    lines = [f"{'model':<7} {'proto':<5} {'--workers':>9} {'conc':>5} {'infer/s':>9} {'p99 ms':>7} "
             f"{'CPU µs/inf':>10} {'engine':>7} {'frontends':>9} {'batch':>6} {'effic.':>6}  status"]
    for p in points:
        layout = p.layout if p.layout != "auto" else f"auto={p.workers}"
        eff = f"{p.efficiency:.2f}" if p.efficiency is not None else "—"
        p99 = f"{p.p99_ms:.2f}" if p.p99_ms is not None else "—"
        lines.append(f"{p.model:<7} {p.protocol:<5} {layout:>9} {p.concurrency:>5} {p.infer_per_s:>9,.0f} "
                     f"{p99:>7} {p.cpu_us_per_infer:>10.0f} {p.engine_us:>7.0f} "
                     f"{p.frontends_us:>9.0f} {p.avg_batch:>6.1f} {eff:>6}  {p.status}")
    return lines


def machine() -> dict[str, Any]:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    try:  # the device gets the working tree without .git, and perhaps no git
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=ROOT, check=False).stdout.strip()
    except OSError:
        commit = ""
    return {"cores": os.cpu_count(), "cpu": model, "python": platform.python_version(),
            "commit": commit or os.environ.get("HUBSERVE_COMMIT", ""), "load_average_start": os.getloadavg()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "perf" / "results" / "scaling.json")
    parser.add_argument("--workers", help="layouts, e.g. 1,2,4,8,auto (dry run: 1,2)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    parser.add_argument("--server-cores", help="taskset -c list (default 0-7; dry run: 0)")
    parser.add_argument("--client-cores", help="taskset -c list (default 8-15; dry run: 1)")
    parser.add_argument("--per-worker", type=int,
                        help=f"requests in flight per worker (default {PER_WORKER}; dry run: 4)")
    parser.add_argument("--max-concurrency", type=int, default=128)
    parser.add_argument("--interval-ms", type=int, help="measurement window (default 1500; dry run: 250)")
    parser.add_argument("--max-trials", type=int, help="windows per point at most (default 6; dry run: 4)")
    parser.add_argument("--stability", type=int, help="stability percentage (default 20; dry run: 100)")
    parser.add_argument("--tool", choices=("auto", "perf_analyzer", "hubserve"), default="auto")
    parser.add_argument("--limit-s", type=float, default=float(os.environ.get("SCALING_LIMIT_S", 450)),
                        help="points that would end past this are skipped (the script's timeout is above it)")
    args = parser.parse_args()
    dry = args.dry_run
    layouts = (args.workers or ("1,2" if dry else "1,2,4,8,auto")).split(",")
    args.interval_ms = args.interval_ms or (250 if dry else 1500)
    args.max_trials = args.max_trials or (4 if dry else 6)
    args.stability = args.stability or (100 if dry else 20)
    per_worker = args.per_worker or (4 if dry else PER_WORKER)
    cores = sorted(os.sched_getaffinity(0))
    server_cores = parse_cores(args.server_cores) if args.server_cores else (
        frozenset(cores[:1]) if dry else parse_cores("0-7"))
    client_cores = parse_cores(args.client_cores) if args.client_cores else (
        frozenset(cores[1:2]) if dry else parse_cores("8-15"))
    pinned = len(cores) > 1 and server_cores <= set(cores) and client_cores <= set(cores) and client_cores
    if pinned:
        os.sched_setaffinity(0, client_cores)  # this process and the load tools it starts
    started = time.monotonic()
    args.out.parent.mkdir(parents=True, exist_ok=True)  # the servers' logs go beside the results
    info = machine()
    tool = pick_tool(args.tool)
    where = (f"server cores {sorted(server_cores)}, client cores {sorted(client_cores)}" if pinned
             else "not pinned (fewer cores than asked for)")
    print(f"scaling: {info['cores']} cores ({info['cpu']}), load tool {tool.name} ({tool.why}), {where}",
          file=sys.stderr, flush=True)
    models = args.models.split(",")
    points: list[Point] = []
    # `timeout` ends the script with SIGTERM: unwind, so each server is stopped and the file holds what ran
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    with tempfile.TemporaryDirectory(prefix="scaling-repo.") as tmp:
        build_repository(ROOT / "model_repository", models)
        served = write_hubserve_repo(ROOT / "model_repository", models, [TUNED], Path(tmp) / "repo")
        for layout in layouts:
            workers = auto_workers(server_cores if pinned else frozenset(cores)) if layout == "auto" \
                else int(layout)
            concurrency = min(per_worker * workers, args.max_concurrency)
            todo = [Point(layout, workers, m, p, concurrency)
                    for m in models for p in args.protocols.split(",")]
            points.extend(todo)
            need = args.max_trials * args.interval_ms * 1.2 / 1000 + POINT_OVERHEAD_S
            if time.monotonic() - started + 15 + need > args.limit_s:
                for point in todo:
                    point.status = f"skipped: past the {args.limit_s:.0f} s limit"
                continue
            server: Server | None = None
            try:
                server = Server("scaling", ROOT, workers, served, args.out.parent,
                                repository=str(Path(tmp) / "repo"), workers_flag=layout,
                                cores=server_cores if pinned else None)
                server.wait_ready(served, timeout_s=120)
                frontends = len(children(server.process.pid))
                if layout == "auto" and frontends != (workers if workers > 1 else 0):
                    raise RuntimeError(f"--workers auto started {frontends} frontends, expected {workers}")
                for point in todo:
                    if time.monotonic() - started + need > args.limit_s:
                        point.status = f"skipped: past the {args.limit_s:.0f} s limit"
                        continue
                    port = server.grpc if point.protocol == "grpc" else server.http
                    measure(server, tool, point, f"127.0.0.1:{port}", args)
                    print(f"  {point.model} {point.protocol} --workers {layout} c={concurrency}: "
                          f"{point.infer_per_s:,.0f} infer/s, p99 {point.p99_ms} ms, "
                          f"{point.cpu_us_per_infer:.0f} µs CPU/inf ({point.status})", file=sys.stderr,
                          flush=True)
            except Exception as e:  # a layout that fails to start is a result, not the end of the run
                for point in todo:
                    if point.status == "pass" and not point.infer_per_s:
                        point.status = f"fail: {type(e).__name__}: {str(e)[:200]}"
            finally:
                for point in todo:  # a run cut short (SIGTERM) leaves the rest of this layout unmeasured
                    if point.status == "pass" and not point.infer_per_s:
                        point.status = "skipped: the run was cut short"
                if server is not None:
                    server.stop()
                write(args, started, info, tool, bool(pinned), server_cores, client_cores, per_worker, points)
    lines = write(args, started, info, tool, bool(pinned), server_cores, client_cores, per_worker, points)
    print("\n".join(lines))
    return 0 if passed(points) else 1


def passed(points: list[Point]) -> bool:
    return bool(points) and all(p.status in ("pass", "unstable") for p in points)


def write(args: argparse.Namespace, started: float, info: dict[str, Any], tool: Tool, pinned: bool,
          server_cores: frozenset[int], client_cores: frozenset[int], per_worker: int,
          points: list[Point]) -> list[str]:
    """The results file and its table, rewritten after each layout, so a run cut short still leaves one."""
    efficiencies(points)
    lines = table(points)
    result = {"dry_run": args.dry_run, "machine": {**info, "load_average_end": os.getloadavg()},
              "tool": asdict(tool),
              "pinning": {"pinned": pinned, "server_cores": sorted(server_cores),
                          "client_cores": sorted(client_cores)},
              "settings": {"models": [f"{m} (tuned: max_batch_size 64, 1000 µs window)"
                                      for m in args.models.split(",")],
                           "interval_ms": args.interval_ms, "max_trials": args.max_trials,
                           "stability_percentage": args.stability, "per_worker": per_worker,
                           "max_concurrency": args.max_concurrency},
              "points": [asdict(p) for p in points], "passed": passed(points), "table": lines,
              "seconds": round(time.monotonic() - started, 1)}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    return lines


if __name__ == "__main__":
    sys.exit(main())
