"""Does `hubserve perf` measure what NVIDIA's perf_analyzer measures? Both, at the same settings, against one
hubserve, interleaved, side by side in one run.

    .venv/bin/python perf/agreement.py [--models simple,mlp_large] [--concurrency 4,16]
                                       [--request-rates 200] [--protocols grpc,http] [--reps 5]
                                       [--interval-ms 2000] [--stability 50] [--shared-cores]

It starts a hubserve on free loopback ports serving the example models asked for (the same start-up the
tests use), then for each repetition, model, protocol and load — a concurrency (closed loop), or a request
rate (open loop: then the server sees the same arrivals from either tool, which separates what the server
does from how a client's own cost and rhythm feed back into a closed loop) — runs perf_analyzer (sync mode,
its defaults otherwise, but 16 threads in request-rate mode: see `command`) and `python -m engine perf` with
identical flags, alternating which goes first. Each run's throughput and p50 come from its own `-f` CSV; the
client's CPU time (user + system, worker processes included) and the server's CPU time are read around each
run. It prints every run, then the medians over the repetitions with the ratios hubserve perf /
perf_analyzer of each back-to-back pair (both saw about the same background load), and exits 1 when a
median ratio falls outside ±15 %.

What the verdict leaves out, and says so: a closed-loop point where either tool kept its cores at least 70 %
busy. There the tool's own per-request cost sets the pace (throughput = concurrency / (client + server
time)), so the two numbers measure the two clients as much as the server; the table still shows them.

What it compares differently, and says so: a point where the server itself is bistable. `mlp_large` at
concurrency 4 settles either into batches of 4 or into staggered pairs (one pair computes while the other
waits), the choice made by chance early in a run and kept; pairs cost 1.6x the CPU per inference, so the
runs split into two throughput levels under either tool. Pairing run i of one tool with run i of the other
then compares states, not tools. Each run records the server's average batch size (statistics extension);
when the runs of a point split into two groups of batch sizes more than BISTABLE_GAP apart, the tools are
compared within each group that both reached (ratio of medians), and a point where they never shared a
state is left out as undecided. Groups that split by tool (every perf_analyzer run in one, every run of ours
in the other) would be a difference between the tools, not two server states: such a point is compared run
against run as usual.

The server runs on the first half of the machine's cores and the tools on the other half (one core each on
a 2-core machine). Why: in a closed loop on shared cores, whatever CPU a tool spends per request is taken
from the server, so a cheaper client measures a faster server, and the comparison would measure the two
clients' costs rather than what each says of the server (perf/README.md has both). `--shared-cores` lets
everything share all cores, as on one host. Numbers are only comparable within one run.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from hubserve_harness import ROOT, checkout_env, start_server
from hubserve_harness.perf_analyzer import PERF_ANALYZER, children_usage
from hubserve_models import examples
from hubserve_perf.control import stats_from
from hubserve_perf.types import ServerStats

TOLERANCE = 0.15
CLIENT_BOUND_BUSY = 70.0  # % of its cores: past this a tool's own speed sets a closed loop's pace
RUN_TIMEOUT_S = 180
BISTABLE_GAP = 1.3  # ratio between two groups of runs' average batch sizes that marks two server states


@dataclass
class Run:
    rep: int
    model: str
    tool: str
    protocol: str
    load: str  # "c=N" (concurrency) or "r=N" (request rate)
    rc: int
    throughput: float
    p50_us: float
    server_us: float  # the server's own time per request (queue + compute), from the statistics extension
    # the tool's average latency: avg_us - server_us is what the request spent outside the server
    avg_us: float
    client_cpu_s: float
    server_cpu_s: float
    wall_s: float
    batch: float  # the server's average batch size during the run (inferences / executions)


def server_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def command(tool: str, model: str, url: str, protocol: str, load: str, flags: list[str], report: Path
            ) -> list[str]:
    kind, value = load.split("=")
    load_flag = "--concurrency-range" if kind == "c" else "--request-rate-range"
    common = ["-m", model, "-u", url, "-i", protocol, load_flag, value, *flags,
              "-f", str(report)]
    if tool == "perf_analyzer":
        # In request-rate mode perf_analyzer's sync client defaults to 4 threads, i.e. at most 4 requests in
        # flight: at 20 ms a request it cannot offer more than 200/s and quietly sends less than asked.
        # Ours has no such cap; 16 threads lets perf_analyzer offer the rate too.
        # --verbose-csv adds the columns ours always writes (Avg latency among them); it changes no
        # measurement.
        extra = ["--max-threads", "16"] if kind == "r" else []
        return [str(PERF_ANALYZER), *common, "--verbose-csv", *extra]
    return [sys.executable, "-m", "engine", "perf", *common]


def pin_process(pid: int, cores: set[int]) -> None:
    """Pin every thread of a running process (sched_setaffinity on a pid moves only its main thread)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cores)


def server_stats(http_url: str, model: str) -> ServerStats:
    """The statistics extension's counters for `model`, read the way `hubserve perf` reads them."""
    with urllib.request.urlopen(f"http://{http_url}/v2/models/{model}/stats", timeout=10) as response:
        return stats_from(json.load(response))


def run_one(rep: int, model: str, tool: str, url: str, protocol: str, load: str, flags: list[str],
            server_pid: int, http_url: str, tmp: Path, client_cores: set[int] | None) -> Run:
    report = tmp / f"{tool.replace(' ', '_')}-{model}-{protocol}-{load}-{time.monotonic_ns()}.csv"
    cmd = command(tool, model, url, protocol, load, flags, report)
    stats0 = server_stats(http_url, model)
    cpu0, srv0, wall0 = children_usage().cpu_s, server_cpu_s(server_pid), time.monotonic()
    try:
        pin = (lambda: os.sched_setaffinity(0, client_cores)) if client_cores else None
        proc = subprocess.run(cmd, cwd=ROOT, env=checkout_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=RUN_TIMEOUT_S,
                              preexec_fn=pin, check=False)
        rc = proc.returncode
        if rc != 0:
            tail = proc.stdout.decode(errors="replace").splitlines()[-8:]
            print(f"{' '.join(cmd)} exited {rc}:\n" + "\n".join(tail))
    except subprocess.TimeoutExpired:
        rc = 124
    wall = time.monotonic() - wall0
    throughput = p50 = server = avg = 0.0
    if report.exists():
        rows = list(csv.DictReader(report.read_text().split("\n\n")[0].splitlines()))
        if rows:
            row = rows[0]
            throughput, p50, avg = (float(row["Inferences/Second"]), float(row["p50 latency"]),
                                    float(row["Avg latency"]))
            server = sum(float(row[c]) for c in ("Server Queue", "Server Compute Input",
                                                  "Server Compute Infer", "Server Compute Output"))
    client_cpu, server_cpu = children_usage().cpu_s - cpu0, server_cpu_s(server_pid) - srv0
    batch = (server_stats(http_url, model) - stats0).avg_batch_size
    return Run(rep, model, tool, protocol, load, rc, throughput, p50, server, avg, client_cpu, server_cpu,
               wall, batch)


def median(runs: list[Run], field: str) -> float:
    values = [getattr(r, field) for r in runs]
    return statistics.median(values) if values else 0.0


def cpu_per_k(runs: list[Run]) -> float:
    """Client CPU seconds per 1,000 inferences, over the whole run (start-up included)."""
    ok = [1000 * r.client_cpu_s / (r.throughput * r.wall_s) for r in runs if r.throughput > 0]
    return statistics.median(ok) if ok else 0.0


def paired_ratio(pairs: list[tuple[Run, Run]], field: str) -> tuple[float, float, float]:
    """(median, min, max) of ours / theirs over runs made back to back, so both saw the same background."""
    ratios = [getattr(b, field) / getattr(a, field) for a, b in pairs if getattr(a, field)]
    return (statistics.median(ratios), min(ratios), max(ratios)) if ratios else (0.0, 0.0, 0.0)


def fmt_ratio(ratio: tuple[float, float, float]) -> str:
    return f"{ratio[0]:.2f} [{ratio[1]:.2f}-{ratio[2]:.2f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="simple,mlp_large",
                        help="example models: simple (tiny: the clients' own costs show), "
                             "mlp_large (compute-bound)")
    parser.add_argument("--concurrency", default="4,16")
    parser.add_argument("--request-rates", default="", help="open-loop rates to compare as well, e.g. 200")
    parser.add_argument("--protocols", default="grpc,http")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--interval-ms", type=int, default=2000)
    parser.add_argument("--stability", type=float, default=50.0)
    parser.add_argument("--max-trials", type=int, default=10)
    parser.add_argument("--shared-cores", action="store_true",
                        help="let the server and the tools share every core (default: the server on the "
                             "first half, the tools on the other, so that a tool's own CPU is not taken "
                             "from the server)")
    args = parser.parse_args()
    levels = [f"c={c}" for c in args.concurrency.split(",") if c] + \
        [f"r={r}" for r in args.request_rates.split(",") if r]
    protocols = args.protocols.split(",")
    models = [m for m in args.models.split(",") if m]
    flags = ["-p", str(args.interval_ms), "-s", f"{args.stability:g}", "-r", str(args.max_trials)]

    tmp = Path(tempfile.mkdtemp(prefix="agreement."))
    repo = tmp / "repository"
    for model in models:
        shutil.copytree(ROOT / "model_repository" / model, repo / model,
                        ignore=shutil.ignore_patterns("*.onnx"))
    examples.build_repository(repo, models)
    server = start_server(repo, tmp / "server.log", "--model-control-mode", "none")
    client_cores: set[int] | None = None
    cores = sorted(os.sched_getaffinity(0))
    placement = "server and tools share them"
    if not args.shared_cores and len(cores) >= 2:
        server_cores, client_cores = set(cores[:len(cores) // 2]), set(cores[len(cores) // 2:])
        pin_process(server.process.pid, server_cores)
        placement = f"server on {sorted(server_cores)}, tools on {sorted(client_cores)}"
    print(f"hubserve pid {server.process.pid} on http {server.http_url}, grpc {server.grpc_url}; "
          f"cores {cores}: {placement}; "
          f"settings: {' '.join(flags)}, sync perf_analyzer; {args.reps} repetitions")
    runs: list[Run] = []
    try:
        for rep in range(args.reps):
            for model in models:
                for protocol in protocols:
                    for load in levels:
                        url = server.grpc_url if protocol == "grpc" else server.http_url
                        order = ["perf_analyzer", "hubserve perf"]
                        if (rep + levels.index(load) + protocols.index(protocol) + models.index(model)) % 2:
                            order.reverse()
                        for tool in order:
                            run = run_one(rep, model, tool, url, protocol, load, flags, server.process.pid,
                                          server.http_url, tmp, client_cores)
                            runs.append(run)
                            print(f"rep {rep + 1} {model:10} {protocol:4} {load:6} {tool:14} rc={run.rc:<3} "
                                  f"{run.throughput:9.1f} infer/s  p50 {run.p50_us:7.0f} us  "
                                  f"batch {run.batch:4.2f}  "
                                  f"client CPU {run.client_cpu_s:5.2f} s  "
                                  f"server CPU {run.server_cpu_s:5.2f} s  "
                                  f"wall {run.wall_s:5.1f} s", flush=True)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    tool_cores = len(client_cores) if client_cores else len(cores)
    print()
    print("| model | protocol | load | perf_analyzer infer/s | hubserve perf infer/s | throughput ratio | "
          "perf_analyzer p50 us | hubserve perf p50 us | p50 ratio | "
          "client CPU ms per 1k infer (pa / ours) | tool's cores busy (pa / ours) | "
          "in the server / outside it, us (pa ; ours) | server batch (pa / ours) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    worst: dict[str, float] = {}
    excluded: list[str] = []
    bistable: list[str] = []
    for model in models:
        for protocol in protocols:
            for load in levels:
                key = (model, protocol, load, 0)
                same = [r for r in runs if (r.model, r.protocol, r.load, r.rc) == key]
                pa = [r for r in same if r.tool == "perf_analyzer"]
                hs = [r for r in same if r.tool == "hubserve perf"]
                ours = {r.rep: r for r in hs}
                pairs = [(a, ours[a.rep]) for a in pa
                         if a.rep in ours and a.throughput > 0 and ours[a.rep].throughput > 0]
                t_ratio = paired_ratio(pairs, "throughput")
                p_ratio = paired_ratio(pairs, "p50_us")
                busiest = max(busy(pa, tool_cores), busy(hs, tool_cores))
                worst.setdefault(model, 0.0)
                groups = server_states(pa + hs)
                if busiest >= CLIENT_BOUND_BUSY and load.startswith("c="):
                    excluded.append(f"{model} {protocol} {load}")
                elif groups:
                    deviation, note = compare_states(groups)
                    bistable.append(f"{model} {protocol} {load}: {note}")
                    if deviation is None:
                        excluded.append(f"{model} {protocol} {load} "
                                        "(bistable, the tools never shared a state)")
                    else:
                        worst[model] = max(worst[model], deviation)
                else:
                    worst[model] = max(worst[model], abs(t_ratio[0] - 1), abs(p_ratio[0] - 1))
                print(f"| {model} | {protocol} | {load} | {median(pa, 'throughput'):,.0f} | "
                      f"{median(hs, 'throughput'):,.0f} | {fmt_ratio(t_ratio)} | "
                      f"{median(pa, 'p50_us'):,.0f} | "
                      f"{median(hs, 'p50_us'):,.0f} | {fmt_ratio(p_ratio)} | "
                      f"{1000 * cpu_per_k(pa):.0f} / {1000 * cpu_per_k(hs):.0f} | "
                      f"{busy(pa, tool_cores):.0f} % / {busy(hs, tool_cores):.0f} % | "
                      f"{split(pa)} ; {split(hs)} | {median(pa, 'batch'):.2f} / {median(hs, 'batch'):.2f} |")
    print(f"\nratios are hubserve perf / perf_analyzer of back-to-back pairs: median [min-max] of "
          f"{args.reps}; 'cores busy' is the tool's CPU time over its run's wall time and its "
          f"{tool_cores} core(s)")
    if bistable:
        print(f"bistable server (run batch sizes in two groups > {BISTABLE_GAP}x apart; compared within each "
              "state, ratio of medians hubserve perf / perf_analyzer):\n  " + "\n  ".join(bistable))
    if excluded:
        print(f"not in the verdict, a tool kept its cores >= {CLIENT_BOUND_BUSY:.0f} % busy, so its own "
              f"speed set the pace: {', '.join(excluded)}")
    for model in models:
        verdict = "agree" if worst[model] <= TOLERANCE else "DISAGREE"
        print(f"{model}: largest median deviation {100 * worst[model]:.1f} %: {verdict} within "
              f"±{100 * TOLERANCE:.0f} %")
    return 0 if all(w <= TOLERANCE for w in worst.values()) else 1


def server_states(runs: list[Run]) -> list[list[Run]]:
    """The runs in two groups by the server's average batch size, if they fall into two groups more than
    BISTABLE_GAP apart (the largest gap between neighbouring sizes) and at least one tool saw both; []
    otherwise. Two groups that split by tool are not two server states but a difference between the tools,
    and are compared run against run like any other point."""
    ordered = sorted((r for r in runs if r.batch > 0), key=lambda r: r.batch)
    if len(ordered) < 2:
        return []
    gap, at = max((b.batch / a.batch, i + 1) for i, (a, b) in enumerate(itertools.pairwise(ordered)))
    low, high = ordered[:at], ordered[at:]
    if gap <= BISTABLE_GAP or not {r.tool for r in low} & {r.tool for r in high}:
        return []
    return [low, high]


def compare_states(groups: list[list[Run]]) -> tuple[float | None, str]:
    """Throughput and p50 of the two tools within each server state both reached: the largest deviation of
    a ratio of medians (None if they shared no state), and a line saying what was compared."""
    worst: float | None = None
    notes = []
    for group in groups:
        pa = [r for r in group if r.tool == "perf_analyzer"]
        hs = [r for r in group if r.tool == "hubserve perf"]
        label = f"batch {statistics.median(r.batch for r in group):.1f}: {len(pa)} + {len(hs)} runs"
        if not pa or not hs:
            notes.append(f"{label} (one tool only)")
            continue
        t = median(hs, "throughput") / median(pa, "throughput")
        p = median(hs, "p50_us") / median(pa, "p50_us")
        worst = max(worst or 0.0, abs(t - 1), abs(p - 1))
        notes.append(f"{label}, throughput {t:.2f}, p50 {p:.2f}")
    return worst, "; ".join(notes)


def split(runs: list[Run]) -> str:
    """Median time per request in the server (queue + compute, as the server reports it) / outside it (the
    tool's average latency minus that: the client's own time, the network and the frontend's parsing)."""
    if not runs:
        return "-"
    inside = statistics.median(r.server_us for r in runs)
    outside = statistics.median(r.avg_us - r.server_us for r in runs)
    return f"{inside:,.0f} / {outside:,.0f}"


def busy(runs: list[Run], cores: int) -> float:
    """How much of its cores a tool kept busy, median over runs: near 100 %, the tool, not the server, set
    the pace of a closed loop."""
    values = [100 * r.client_cpu_s / (r.wall_s * cores) for r in runs if r.wall_s > 0]
    return statistics.median(values) if values else 0.0


if __name__ == "__main__":
    sys.exit(main())
