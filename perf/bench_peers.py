"""hubserve side by side with NVIDIA Triton, the KServe python server and Seldon MLServer, all driven by the
real perf_analyzer on the same models and input data, interleaved in one run.

    bash perf/peers/setup_triton.sh; bash perf/peers/setup_kserve.sh; bash perf/peers/setup_mlserver.sh
    SOURCES=<folder> bash perf/peers/setup_triton_ort.sh     # Triton's C++ onnxruntime backend
    bash tools/install_perf_analyzer.sh
    .venv/bin/python perf/bench_peers.py [--models simple,mlp,image] [--protocols grpc,http]
        [--concurrency 1,4,16,32] [--servers hubserve,triton-ort,triton,kserve,mlserver] [--interval-ms 5000]
        [--configs examples,tuned] [--hubserve-args="--workers 2"]
    .venv/bin/python perf/bench_peers.py --goal [--interval-ms 2000]    # issue 32's goal table
    .venv/bin/python perf/bench_peers.py --goal-from perf/results/peers-<date>.json   # again, no servers

Two Triton rows are possible: `triton-ort`, Triton 2.51 running the model with its own C++ onnxruntime
backend (built by `setup_triton_ort.sh`, ONNX Runtime at 1 intra-op and 1 inter-op thread through the
backend's global thread pool), the anchor of the goal table; and `triton`, the same server with a
Python-backend stand-in (`peers/triton_model.py`), the only Triton earlier runs had. `--goal` is
`--servers hubserve,triton-ort --models simple,mlp,image --protocols grpc,http --concurrency 1,16,32
--configs tuned --rounds 3` (each overridable) and prints `peers/goal.py`'s table first: hubserve ÷ triton-ort
throughput, both p99s and both server CPU per inference per point, and which goals hold. The table is
printed whenever triton-ort ran, and every run writes its per-point numbers as JSON beside the report. A
server that is not installed is left out, with the reason in the report.

Each model runs in each config variant (`peers/variants.py`): `examples`, its config in model_repository/,
and `tuned`, the same with `max_batch_size: 64` and a 1000 µs dynamic-batching window (what gives Triton its
best here). The variants are models of their own (`simple`, `simple_tuned`) in the repository hubserve serves,
`.peers/hubserve_repo/`, written from model_repository/ before the run; every peer's repository is generated
from it. Every server is started once on free 127.0.0.1 ports (a peer that is not installed or fails to start
is left out, with the reason in the report). Then for each model, protocol, concurrency and variant,
perf_analyzer runs against each server in turn (server A then B at the same point, so drift on this shared
machine hits all of them), with `-b 1` and `--input-data zero`. With `--rounds N` it does so N times, the
order reversed every other round (A B, B A, A B), and each of a server's numbers at the point is the median
of its rounds (`report.median_of`): a single goal run decided each p99 by one measurement, and one stall of
this shared machine in it (seen as a p99 2-16 % over the other server's, at a different point each run while
the same point held in the runs around it) decided the table; the rounds are listed beside it.
Around each run the server's CPU time (its process tree, /proc) and its own inference counter are read:
CPU per inference = CPU delta / inference delta.
Afterwards each model's ONNX file runs in this process at the batch sizes hubserve formed (the ceiling,
`bench_serving.ceiling`). The markdown report, with the exact commands, goes to perf/results/peers-<date>.md
and is printed.

HTTP uses the binary tensor extension except for MLServer, which does not implement it (JSON tensors there).

A point whose perf_analyzer times out against any server is measured again on every server with
`SHORT_WINDOW_MS` windows, up to `SHORT_WINDOW_TRIES` times while it still times out, named in the report's
events. perf_analyzer 2.47 removes a window's records from its vector one `erase` at a time (quadratic in
what a window holds); against Triton's HTTP at 11,000-17,000 infer/s its summary did not finish with 1 or 2 s
windows (gdb: `InferenceProfiler::ValidLatencyMeasurement`) and mostly finished with 500 ms ones (3 of 6
rounds) and 250 ms ones (5 of 6; one goal run's retry still timed out), while Triton kept serving
(perf/history/peers.md, nineteenth to twenty-first sessions).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import bench_serving  # perf/, this script's folder, as are peers/ below
from hubserve_harness import ROOT
from hubserve_harness.perf_analyzer import (
    PERF_ANALYZER,
    PerfResult,
    children_usage,
    perf_analyzer_available,
    run_perf_analyzer,
)
from hubserve_models import examples
from peers import goal, report, repos, servers, variants
from peers.report import Measurement, Point


def perf_args(server: str, point: Point, args: argparse.Namespace) -> list[str]:
    extra = ["--concurrency-range", str(point.concurrency), "-b", "1", "--input-data", "zero",
             "--measurement-interval", str(args.interval_ms), "--stability-percentage", str(args.stability),
             "--max-trials", str(args.max_trials)]
    if server == "mlserver" and point.protocol == "http":
        extra += ["--input-tensor-format", "json", "--output-tensor-format", "json"]
    return extra


SHORT_WINDOW_MS = 250  # the window of a point measured again because perf_analyzer timed out (docstring)
SHORT_WINDOW_TRIES = 3  # at most this many times: at 250 ms it still stalls in about one round of six


def failure(result: PerfResult) -> str:
    """A failed perf_analyzer run as a Measurement's error: its exit status and the line that says why."""
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    why = next((ln for ln in reversed(lines) if "rror" in ln or "nstable" in ln or "timed out" in ln),
               lines[-1] if lines else "")
    return f"perf_analyzer exit {result.returncode}: {why.strip()[:160]}"


def timed_out(m: Measurement) -> bool:
    """perf_analyzer ran out of time (exit 124), as opposed to failing or finding no stable window."""
    return bool(m.error) and m.error.startswith("perf_analyzer exit 124")


def measure(server: servers.RunningServer, point: Point, args: argparse.Namespace) -> Measurement:
    """One perf_analyzer run against one server, with the server's CPU and inference count around it."""
    name, model = server.kind.name, point.served_name
    if server.process.poll() is not None:
        return Measurement(point, name, error=f"server exited with {server.process.returncode}")
    timeout_s = args.max_trials * args.interval_ms / 1000 * 3 + 90
    try:
        cpu0, n0, e0 = server.cpu_s(), server.inferences(model), server.executions(model)
        client0, machine0 = children_usage(), servers.machine_cpu_ticks()
        for _ in range(1 + args.retries):  # exit 2: no stable windows; noise on this machine, so try again
            result = run_perf_analyzer(model, server.url(point.protocol), point.protocol,
                                       *perf_args(name, point, args), timeout_s=timeout_s)
            if result.returncode != 2:
                break
        client1, machine1 = children_usage(), servers.machine_cpu_ticks()
        cpu1, n1, e1 = server.cpu_s(), server.inferences(model), server.executions(model)
    except OSError as e:  # the server's stats or metrics endpoint did not answer
        return Measurement(point, name, error=f"reading the server's counters failed: {e}")
    command = tuple("<csv>" if arg.endswith("report.csv") else arg for arg in result.command)
    if not result.ok or not result.csv_rows:
        return Measurement(point, name, error=failure(result), command=command)
    row = result.csv_rows[0]
    inferences = n1 - n0
    client = client1 - client0
    return Measurement(
        point, name, result.throughput,
        float(row["p50 latency"]) / 1000, float(row["p95 latency"]) / 1000, float(row["p99 latency"]) / 1000,
        (cpu1 - cpu0) * 1e6 / inferences if inferences else float("nan"),
        inferences / (e1 - e0) if e0 is not None and e1 is not None and e1 > e0 else None,
        client.cpu_s * 1e6 / inferences if inferences else None,
        (machine1[0] - machine0[0]) / (machine1[1] - machine0[1]) if machine1[1] > machine0[1] else None,
        command=command,
        client_faults_per_infer=client.faults / inferences if inferences else None,
        client_switches_per_infer=client.switches / inferences if inferences else None,
        client_peak_rss_mb=result.peak_rss_mb,
    )



def idle_cpu(running: list[servers.RunningServer], seconds: float) -> dict[int, float]:
    """CPU share of a core each server burns with no load (timers, pollers), by PID, all measured at once."""
    before = {s.pid: s.cpu_s() for s in running}
    time.sleep(seconds)
    return {s.pid: (s.cpu_s() - before[s.pid]) / seconds for s in running}


def exited_within(server: servers.RunningServer, timeout_s: float) -> bool:
    try:
        server.process.wait(timeout_s)
        return True
    except subprocess.TimeoutExpired:
        return False


def restart(server: servers.RunningServer, models: list[str], log_dir: Path,
            events: list[str]) -> servers.RunningServer:
    """Start a server again after something outside this benchmark stopped it (the machine is shared)."""
    event = (f"{datetime.now():%H:%M:%S} {server.kind.name} (PID {server.pid}) exited with "
             f"{server.process.returncode} without being stopped by this benchmark")
    try:
        server = servers.start(server.kind, models, log_dir)
        event += f"; restarted as PID {server.pid}"
    except RuntimeError as e:
        event += f"; restarting failed: {e}"
    print(event, flush=True)
    events.append(event)
    return server


def prepare_repositories(names: list[str], models: list[str],
                         chosen: list[variants.Variant]) -> list[repos.ServedModel]:
    """Rebuild the ONNX files, write hubserve's repository (each model in each variant) from
    model_repository/ and regenerate each installed peer's repository from it. Returns the models hubserve
    serves, as it completes their configs."""
    repository = ROOT / "model_repository"
    examples.build_repository(repository, models)
    served_names = repos.write_hubserve_repo(repository, models, chosen, servers.HUBSERVE_REPO)
    served = [repos.served_model(servers.HUBSERVE_REPO, n) for n in served_names]
    if "triton" in names:
        site = next((servers.PEERS_DIR / "triton/lib").glob("python3.*/site-packages"))
        repos.write_triton_repo(served, servers.PEERS_DIR / "triton_repo", site)
    if "triton-ort" in names:
        repos.write_triton_ort_repo(served, servers.PEERS_DIR / "triton_ort_repo")
    if "kserve" in names:
        repos.write_kserve_repo(served, servers.PEERS_DIR / "kserve_repo")
    if "mlserver" in names:
        repos.write_mlserver_repo(served, servers.PEERS_DIR / "mlserver_repo")
    return served


def ceilings(measurements: list[Measurement], seconds: float) -> dict[tuple[str, int], float]:
    """In-process ONNX Runtime infer/s per (model, batch size hubserve formed), hubserve's session options."""
    out: dict[tuple[str, int], float] = {}
    for m in measurements:
        if m.server != report.REFERENCE or m.error:
            continue
        key = (m.point.model, max(1, round(m.avg_batch or 1)))
        if key not in out:
            served = repos.served_model(ROOT / "model_repository", key[0])
            bench_serving.MODEL_INPUTS.setdefault(key[0], {
                s.name: (s.dims, s.datatype.numpy_dtype) for s in served.config.inputs})
            out[key] = bench_serving.ceiling(served.onnx_path, key[0], key[1], seconds)
    return out


def goal_section(measurements: list[Measurement], reference: str, chosen: list[str],
                 rounds: list[list[Measurement]] | None = None) -> str:
    """Issue 32's table for each config variant the anchor (triton-ort) ran; empty when it did not. With
    several rounds, also each round's own count of points meeting each goal, as if it had been the run."""
    out = []
    for variant in chosen:
        points = goal.goal_points(measurements, reference, variant)
        if any(p.anchor is not None for p in points):
            out += [f"### Goal table, config `{variant}`: {reference} against Triton's C++ onnxruntime "
                    "backend", "", *goal.render(points, reference), ""]
            if rounds:
                out += [*goal.by_round(rounds, reference, variant), ""]
    return "\n".join(out)


GOAL_PRESET = {"servers": f"hubserve,{goal.ANCHOR}", "models": "simple,mlp,image", "protocols": "grpc,http",
               "concurrency": "1,16,32", "configs": "tuned", "rounds": 3}
DEFAULTS = {"servers": f"hubserve,{goal.ANCHOR},triton,kserve,mlserver", "models": "simple,mlp,image",
            "protocols": "grpc,http", "concurrency": "1,4,16,32", "configs": "examples,tuned", "rounds": 1}


def print_goal_from(path: Path) -> int:
    measurements, reference = report.load(path.read_text())
    variants_run = list(dict.fromkeys(m.point.variant for m in measurements))
    text = goal_section(measurements, reference, variants_run, report.load_rounds(path.read_text()) or None)
    print(text or f"{path}: {goal.ANCHOR} has no measurements there")
    return 0 if text else 1


# ------------------------------------------------------------------------------------------------ report

def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--goal", action="store_true",
                        help="issue 32's goal table: "
                        + " ".join(f"--{k} {v}" for k, v in GOAL_PRESET.items()) + " unless given")
    parser.add_argument("--goal-from", type=Path, metavar="JSON",
                        help="print the goal table from a run's recorded numbers (the .json beside its "
                             "report) and exit; no servers are started")
    parser.add_argument("--models", help=f"default: {DEFAULTS['models']}")
    parser.add_argument("--protocols", help=f"default: {DEFAULTS['protocols']}")
    parser.add_argument("--concurrency", help=f"default: {DEFAULTS['concurrency']}")
    parser.add_argument("--servers",
                        help="any of hubserve (its default layout), hubserve-w1/-w2/-w3/-w4/-w8 "
                             "(--workers N), triton-ort (Triton's C++ onnxruntime backend), triton (the "
                             "Python-backend stand-in), kserve, mlserver; ratios are against the first "
                             f"hubserve listed (default: {DEFAULTS['servers']})")
    parser.add_argument("--configs",
                        help=f"config variants, each model in each: {', '.join(variants.VARIANTS)} "
                             f"(default: {DEFAULTS['configs']})")
    parser.add_argument("--hubserve-args", default="",
                        help='extra arguments for `engine serve`, e.g. --hubserve-args="--workers 2"')
    parser.add_argument("--baseline-tree", type=Path,
                        help="another checkout (e.g. `git worktree add /tmp/before <tag>`) whose engine/ is "
                             "served too, as hubserve@<folder>, after the first hubserve listed")
    parser.add_argument("--interval-ms", type=int, default=5000, help="perf_analyzer measurement window")
    parser.add_argument("--stability", type=int, default=50, help="perf_analyzer --stability-percentage")
    parser.add_argument("--max-trials", type=int, default=10, help="perf_analyzer --max-trials")
    parser.add_argument("--rounds", type=int,
                        help="measurements of each point on each server, the server order alternating "
                             "round by round; the tables use each number's median (default: "
                             f"{DEFAULTS['rounds']}, {GOAL_PRESET['rounds']} with --goal)")
    parser.add_argument("--retries", type=int, default=1,
                        help="reruns of a point that found no stable windows")
    parser.add_argument("--idle-s", type=float, default=3.0, help="seconds to measure idle server CPU")
    parser.add_argument("--ceiling-s", type=float, default=1.0, help="seconds per ceiling measurement")
    parser.add_argument("--out", type=Path, help="default: perf/results/peers-<date>.md")
    args = parser.parse_args()
    if args.goal_from:
        return print_goal_from(args.goal_from)
    for key, value in (GOAL_PRESET if args.goal else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    report.REFERENCE = next((n for n in args.servers.split(",") if n.startswith("hubserve")), "hubserve")
    # unwind through `finally`, which stops every server we started
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_on_signal)
    if not perf_analyzer_available():
        sys.exit(f"{PERF_ANALYZER} is missing: run `bash tools/install_perf_analyzer.sh`")
    models = [m for m in args.models.split(",") if m]
    unknown = [v for v in args.configs.split(",") if v not in variants.VARIANTS]
    if unknown or not args.configs:
        parser.error(f"--configs: choose from {', '.join(variants.VARIANTS)} (got {args.configs!r})")
    chosen = [variants.VARIANTS[v] for v in dict.fromkeys(args.configs.split(","))]
    started = datetime.now()
    out_path = args.out or ROOT / "perf" / "results" / f"peers-{started:%Y%m%d-%H%M%S}.md"
    log_dir = out_path.with_suffix(".logs")
    log_dir.mkdir(parents=True, exist_ok=True)

    skipped: dict[str, str] = {}
    wanted = []
    names: list[str | servers.ServerKind] = list(args.servers.split(","))
    if args.baseline_tree:
        first = next((i for i, n in enumerate(names) if str(n).startswith("hubserve")), -1)
        names.insert(first + 1, servers.hubserve_from(args.baseline_tree))
    for name_or_kind in names:
        kind = servers.KINDS[name_or_kind] if isinstance(name_or_kind, str) else name_or_kind
        name = kind.name
        if name.startswith("hubserve") and args.hubserve_args:
            kind = kind.with_args(shlex.split(args.hubserve_args))
        why = kind.missing()
        if why:
            skipped[name] = why
        else:
            wanted.append(kind)
    served = prepare_repositories([k.name for k in wanted], models, chosen)
    served_names = [m.name for m in served]
    load_start, t0 = os.getloadavg(), time.monotonic()
    running: list[servers.RunningServer] = []
    measurements: list[Measurement] = []
    rounds: list[list[Measurement]] = []  # every round's numbers, point by point
    events: list[str] = []
    idle: dict[int, float] = {}
    try:
        for kind in wanted:
            print(f"starting {kind.name} ...", flush=True)
            try:
                running.append(servers.start(kind, served_names, log_dir))
            except RuntimeError as e:
                skipped[kind.name] = str(e)
                print(f"  {kind.name} left out: {e}", flush=True)
        idle = idle_cpu(running, args.idle_s)
        points = [Point(m, v.name, p, int(c)) for m in models for p in args.protocols.split(",")
                  for c in args.concurrency.split(",") for v in chosen]
        def measure_point(i: int, point: Point, point_args: argparse.Namespace,
                          backwards: bool = False) -> list[Measurement]:
            """The point on every server in turn, last to first when `backwards` (one stopped from outside,
            only a signal stops one, is restarted once)."""
            at_point = []
            order = range(len(running) - 1, -1, -1) if backwards else range(len(running))
            for j in order:
                server = running[j]
                for _ in range(2):
                    if server.process.poll() is not None:
                        running[j] = server = restart(server, served_names, log_dir, events)
                    m = measure(server, point, point_args)
                    if not m.error or not exited_within(server, 5.0):
                        break
                at_point.append(m)
                result = m.error or (f"{m.infer_per_s:,.0f} infer/s, p50 {m.p50_ms:.2f} ms, "
                                     f"CPU {m.cpu_us_per_infer:,.0f} µs/infer")
                print(f"[{i}/{len(points)}] {point.served_name} {point.protocol} c={point.concurrency} "
                      f"{server.kind.name}: {result}", flush=True)
            return at_point

        short = argparse.Namespace(**{**vars(args), "interval_ms": SHORT_WINDOW_MS})
        for i, point in enumerate(points, 1):
            every_round: list[Measurement] = []
            windows = args  # the first time-out moves the point to short windows, its later rounds too
            for r in range(args.rounds):
                backwards = r % 2 == 1
                at_point = measure_point(i, point, windows, backwards)
                stalled = [m.server for m in at_point if timed_out(m)]
                if stalled and args.interval_ms > SHORT_WINDOW_MS:
                    what = f"{windows.interval_ms} ms"
                    first, windows, tries, first_stalled = windows is args, short, 0, stalled
                    while stalled and tries < SHORT_WINDOW_TRIES:
                        at_point = measure_point(i, point, short, backwards)
                        stalled = [m.server for m in at_point if timed_out(m)]
                        tries += 1
                    events.append(f"{point.served_name} {point.protocol} c={point.concurrency}"
                                  f"{f' round {r + 1}' if args.rounds > 1 else ''}: perf_analyzer timed out "
                                  f"against {', '.join(first_stalled)} with "
                                  f"{what} windows; the point was measured again on every server with "
                                  f"{SHORT_WINDOW_MS} ms windows ({tries} time{'s' if tries > 1 else ''}"
                                  f"{', timing out every time' if stalled else ''}), and those numbers are "
                                  f"the {'round' if args.rounds > 1 else 'point'}'s"
                                  + (" (its later rounds had those windows from the start)"
                                     if first and r + 1 < args.rounds else ""))
                every_round.extend(at_point)
            rounds.append(every_round)
            own = report.by_server(every_round)
            for server in running:  # the run's server order, whichever order the last round took
                if server.kind.name in own:
                    ms = own[server.kind.name]
                    measurements.append(report.median_of(ms) if args.rounds > 1 else ms[-1])
    finally:
        for server in running:
            server.stop()
    wall_s, load_end = time.monotonic() - t0, os.getloadavg()
    kept = rounds if args.rounds > 1 else None  # a single pass has no rounds to show
    text = report.render(measurements, ceilings(measurements, args.ceiling_s), running, idle, skipped,
                         events, served, chosen, args,
                         f"{started:%Y-%m-%d %H:%M}", wall_s, (load_start, load_end), kept)
    goals = goal_section(measurements, report.REFERENCE, [v.name for v in chosen], kept)
    if goals:
        text = text.replace("\n", "\n\n" + goals, 1)  # after the heading
    out_path.write_text(text)
    out_path.with_suffix(".json").write_text(
        report.dump(measurements, report.REFERENCE, kept))
    print("\n" + text + f"\nwritten to {out_path} and its .json (server logs in "
          f"{log_dir}/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
