"""Where a `--workers N` server's CPU goes: the engine process and each frontend process, per inference,
for one or more source trees side by side (e.g. a frozen copy of main against a branch), real perf_analyzer.

    bash tools/install_perf_analyzer.sh   # once
    git archive <rev> | tar -x -C /tmp/before && ln -s $PWD/.venv /tmp/before/.venv  # a tree to compare
    (cd /tmp/before && .venv/bin/python -m hubserve_models.examples model_repository)
    flock /work/probes/bench.lock .venv/bin/python perf/bench_workers.py \
        --trees before=/tmp/before,after=. --workers 1,2 --models simple,mlp --protocols grpc,http \
        --concurrency 16,32 [--interval-ms 3000] [--max-trials 5] [--rounds 1]

Every (tree, --workers) server is started at once, from its tree (`python -m engine serve` with that tree
as the working directory, so `engine` and its frontends' `engine` are that tree's), serving the tree's own
`model_repository/` (`--model-control-mode explicit --load-model` each model). Then for each round, model,
protocol and concurrency, perf_analyzer runs against each server in turn (`-b 1 --input-data zero`,
stability 50 %; every other round in reverse order), so drift on a shared machine hits all of them alike.
Around each run, utime+stime of the engine process and of each of its children (the frontends;
/proc/<pid>/stat) and the model's inference and execution counts (the statistics extension) are read: CPU
per inference is each process's CPU delta over the inference delta. `--workers 1` has no frontends: its
engine column is the whole server.

The report (markdown on stdout) has one row per point and server: infer/s, the engine's, the frontends'
and the total CPU µs per inference, and the average batch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from hubserve_harness import free_ports
from hubserve_harness.perf_analyzer import PERF_ANALYZER, perf_analyzer_available, run_perf_analyzer

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> int:
    """utime + stime of one process (man 5 proc: fields 14 and 15)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        return bytes(r.read())


class Server:
    """One `python -m engine serve` from `tree`, on free loopback ports, in its own session."""

    def __init__(self, label: str, tree: Path, workers: int, models: list[str], log_dir: Path,
                 repository: str = "model_repository", workers_flag: str = "",
                 cores: frozenset[int] | None = None) -> None:
        """`workers` is how many frontends to wait for; `workers_flag` what --workers says (default the
        same number; "auto" lets the server pick). `cores`: the server's CPU affinity (as `taskset -c`)."""
        flag = workers_flag or str(workers)
        self.name = f"{label} --workers {flag}"
        self.workers = workers
        self.http, self.grpc, metrics = free_ports(3)
        python = tree / ".venv" / "bin" / "python"
        self.command = [str(python if python.exists() else sys.executable), "-m", "engine", "serve",
                        "--model-repository", repository, "--model-control-mode", "explicit",
                        *[arg for m in models for arg in ("--load-model", m)], "--host", "127.0.0.1",
                        "--http-port", str(self.http), "--grpc-port", str(self.grpc),
                        "--metrics-port", str(metrics), "--workers", flag]
        pin = None if cores is None else (lambda: os.sched_setaffinity(0, cores))
        with open(log_dir / f"{label}-w{flag}.log", "ab") as log:
            self.process = subprocess.Popen(self.command, cwd=tree, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=pin)

    def wait_ready(self, models: list[str], timeout_s: float = 180.0) -> None:
        urls = [f"http://127.0.0.1:{self.http}/v2/health/ready",
                *(f"http://127.0.0.1:{self.http}/v2/models/{m}/ready" for m in models)]
        deadline = time.monotonic() + timeout_s
        while urls or (self.workers > 1 and len(children(self.process.pid)) < self.workers):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not become ready (exit {self.process.poll()})")
            try:
                if urls:
                    _get(urls[0])
                    urls.pop(0)
                    continue
            except OSError:
                pass
            time.sleep(0.2)

    def cpu(self) -> dict[int, int]:
        pid = self.process.pid
        return {p: cpu_ticks(p) for p in (pid, *children(pid))}

    def counts(self, model: str) -> tuple[int, int]:
        stats = json.loads(_get(f"http://127.0.0.1:{self.http}/v2/models/{model}/stats"))["model_stats"]
        return (sum(int(s["inference_count"]) for s in stats), sum(int(s["execution_count"]) for s in stats))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@dataclass
class Row:
    round: int
    model: str
    protocol: str
    concurrency: int
    server: str
    infer_per_s: float
    engine_us: float
    frontends_us: float
    batch: float
    error: str = ""


def measure(server: Server, model: str, protocol: str, concurrency: int, args: argparse.Namespace,
            rnd: int) -> Row:
    url = f"127.0.0.1:{server.grpc if protocol == 'grpc' else server.http}"
    cpu0, (n0, e0) = server.cpu(), server.counts(model)
    result = run_perf_analyzer(model, url, protocol, "--concurrency-range", str(concurrency), "-b", "1",
                               "--input-data", "zero", "--measurement-interval", str(args.interval_ms),
                               "--stability-percentage", "50", "--max-trials", str(args.max_trials),
                               timeout_s=args.max_trials * args.interval_ms / 1000 * 3 + 90)
    cpu1, (n1, e1) = server.cpu(), server.counts(model)
    n = max(n1 - n0, 1)
    per = {p: (cpu1[p] - cpu0.get(p, cpu1[p])) / TICKS_PER_S * 1e6 / n for p in cpu1}
    engine = per.pop(server.process.pid)
    error = "" if result.ok else f"perf_analyzer exit {result.returncode}"
    return Row(rnd, model, protocol, concurrency, server.name, result.throughput, engine, sum(per.values()),
               (n1 - n0) / max(e1 - e0, 1), error)


def report(rows: list[Row]) -> str:
    lines = ["| round | model | proto | conc | server | infer/s | engine µs/infer | frontends µs/infer | "
             "total µs/infer | avg batch |", "|---|---|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        frontends = f"{r.frontends_us:,.0f}" if r.frontends_us else "—"
        lines.append(f"| {r.round} | {r.model} | {r.protocol} | {r.concurrency} | {r.server} | "
                     f"{r.infer_per_s:,.0f}{' (' + r.error + ')' if r.error else ''} | {r.engine_us:,.0f} | "
                     f"{frontends} | {r.engine_us + r.frontends_us:,.0f} | {r.batch:.1f} |")
    return "\n".join(lines)


def summary(rows: list[Row]) -> str:
    """The median over the rounds of each point and server (what the rounds' drift leaves)."""
    groups: dict[tuple[str, str, int, str], list[Row]] = {}
    for r in rows:
        if not r.error:
            groups.setdefault((r.model, r.protocol, r.concurrency, r.server), []).append(r)
    lines = ["| model | proto | conc | server | rounds | infer/s | engine µs/infer | frontends µs/infer | "
             "total µs/infer |", "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for (model, protocol, concurrency, server), group in groups.items():
        engine = statistics.median(r.engine_us for r in group)
        frontends = statistics.median(r.frontends_us for r in group)
        total = statistics.median(r.engine_us + r.frontends_us for r in group)
        lines.append(f"| {model} | {protocol} | {concurrency} | {server} | {len(group)} | "
                     f"{statistics.median(r.infer_per_s for r in group):,.0f} | {engine:,.0f} | "
                     f"{f'{frontends:,.0f}' if frontends else '—'} | {total:,.0f} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", default="this=.",
                        help="label=path,... (each a checkout with its models built)")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--models", default="simple")
    parser.add_argument("--protocols", default="grpc")
    parser.add_argument("--concurrency", default="16")
    parser.add_argument("--interval-ms", type=int, default=3000)
    parser.add_argument("--max-trials", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp"))
    args = parser.parse_args()
    if not perf_analyzer_available():
        sys.exit(f"{PERF_ANALYZER} is missing: run `bash tools/install_perf_analyzer.sh`")
    models = args.models.split(",")
    servers: list[Server] = []
    rows: list[Row] = []
    load = os.getloadavg()
    try:
        for spec in args.trees.split(","):
            label, tree = spec.split("=", 1)
            for workers in args.workers.split(","):
                servers.append(Server(label, Path(tree).resolve(), int(workers), models, args.log_dir))
        for server in servers:
            server.wait_ready(models)
        for rnd in range(1, args.rounds + 1):
            for model in models:
                for protocol in args.protocols.split(","):
                    for concurrency in args.concurrency.split(","):
                        # every other round in reverse: the first at a point is not always the same one
                        for server in servers if rnd % 2 else reversed(servers):
                            row = measure(server, model, protocol, int(concurrency), args, rnd)
                            rows.append(row)
                            print(f"[{rnd}] {model} {protocol} c={concurrency} {server.name}: "
                                  f"{row.infer_per_s:,.0f} infer/s, engine {row.engine_us:.0f} + frontends "
                                  f"{row.frontends_us:.0f} µs/infer {row.error}", file=sys.stderr, flush=True)
    finally:
        for server in servers:
            server.stop()
    print(f"load average {load[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end\n")
    print(report(rows))
    if args.rounds > 1:
        print("\nMedians over the rounds:\n")
        print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
