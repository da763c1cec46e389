"""The report of `perf/bench_peers.py`: what one measurement is, and the markdown tables, summary and
settings printed from a run. Measuring lives in the script; this module only formats what it measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import sys
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from hubserve_harness import ROOT

from . import repos, servers, variants

# The hubserve layout the ratios are against: the first hubserve* in --servers (bench_peers.main sets it).
REFERENCE = "hubserve"


@dataclass(frozen=True, slots=True)
class Point:
    model: str
    """The example's name; the server knows the model by `served_name`."""
    variant: str
    protocol: str
    concurrency: int

    @property
    def served_name(self) -> str:
        return variants.VARIANTS[self.variant].served_name(self.model)


@dataclass(frozen=True, slots=True)
class Measurement:
    point: Point
    server: str
    infer_per_s: float = 0.0
    p50_ms: float = 0.0
    p95_ms: float = 0.0
    p99_ms: float = 0.0
    cpu_us_per_infer: float = 0.0
    avg_batch: float | None = None
    client_cpu_us_per_infer: float | None = None
    """perf_analyzer's own CPU per inference: on a machine it shares with the server, the client's cost is
    part of every closed-loop point."""
    machine_idle: float | None = None
    """The share of the machine's CPU time (every core) nobody used during the point. A server behind at a
    point where the machine sat idle is bound by latency (a wait, a hand-off), not by its CPU per
    inference."""
    error: str = ""
    command: tuple[str, ...] = ()
    client_faults_per_infer: float | None = None
    """perf_analyzer's minor page faults per inference. Most of its CPU on a 602 KB upload is zeroing the
    fresh pages its allocator hands it (its 64 MiB arena heaps made and dropped again); how often that
    happens depends on its threads' timing, so it differs between servers (perf/history/peers.md)."""
    client_switches_per_infer: float | None = None
    """perf_analyzer's context switches per inference (each a sleep and a wake-up on a shared core)."""
    client_peak_rss_mb: float | None = None
    """perf_analyzer's peak resident memory over the point. It grows with the requests sent (by GBs on
    `image`), and a client grown past a few GB costs 3-4 times as much per request, whichever server it
    loads: in a fixed time window the faster server makes the client send more and pays for it
    (perf/history/peers.md, twenty-seventh session)."""


_NUMBERS = tuple(f.name for f in fields(Measurement) if f.name not in ("point", "server", "error", "command"))


def median_of(rounds: list[Measurement]) -> Measurement:
    """One server's point over several alternated rounds (`bench_peers.py --rounds`): each number the median
    of the rounds that completed, so one round caught by a stall of this shared machine (a p99 or a
    throughput far off the others) does not decide the point. Every number is a median on its own, not one
    round's row: with three rounds, the middle of each. All rounds failed: the last one's error."""
    done = [m for m in rounds if not m.error]
    if not done:
        return rounds[-1]
    medians: dict[str, Any] = {}
    for name in _NUMBERS:
        values = [v for v in (getattr(m, name) for m in done) if v is not None and not math.isnan(v)]
        medians[name] = statistics.median(values) if values else getattr(done[0], name)
    return replace(done[0], **medians)


def by_server(at_point: list[Measurement]) -> dict[str, list[Measurement]]:
    """A point's measurements over its rounds, per server in the order the servers first appear, each server's
    in the order its rounds ran."""
    out: dict[str, list[Measurement]] = {}
    for m in at_point:
        out.setdefault(m.server, []).append(m)
    return out


def rounds_table(rounds: list[list[Measurement]]) -> list[str]:
    """Every round's throughput and p99 beside the median the tables above use, per point and server, in the
    order the rounds ran."""
    out = ["| model | config | proto | conc | server | infer/s, round by round | p99 ms, round by round |",
           "|---|---|---|---|---|---|---|"]
    for at_point in rounds:
        for name, ms in by_server(at_point).items():
            point = ms[0].point
            tput = " / ".join("failed" if m.error else _fmt(m.infer_per_s) for m in ms)
            p99 = " / ".join("failed" if m.error else _fmt(m.p99_ms, 2) for m in ms)
            out.append(f"| {point.model} | {point.variant} | {point.protocol} | {point.concurrency} | {name} "
                       f"| {tput} | {p99} |")
    return out


def dump(measurements: list[Measurement], reference: str,
         rounds: list[list[Measurement]] | None = None) -> str:
    """A run's per-point numbers as JSON, written beside the report, so tables (the goal table among them)
    can be printed again from a run without measuring again. With `--rounds`, `measurements` are the
    medians and `rounds` keeps every round's own numbers, point by point, server by server."""
    data: dict[str, object] = {"reference": reference, "measurements": [asdict(m) for m in measurements]}
    if rounds:
        data["rounds"] = [[asdict(m) for m in at_point] for at_point in rounds]
    return json.dumps(data, indent=1)


def _measurement(m: dict[str, Any]) -> Measurement:
    numbers = {k: v for k, v in m.items() if k not in ("point", "command")}
    # json writes NaN (CPU of a point without inferences) as NaN, which it reads back
    return Measurement(Point(**m["point"]), **numbers, command=tuple(m["command"]))


def load(text: str) -> tuple[list[Measurement], str]:
    """`dump`'s output back: the measurements and the reference server's name."""
    data = json.loads(text)
    return [_measurement(m) for m in data["measurements"]], str(data["reference"])


def load_rounds(text: str) -> list[list[Measurement]]:
    """The rounds `dump` kept (a `--rounds` run), point by point; empty for a single-round run."""
    return [[_measurement(m) for m in at_point] for at_point in json.loads(text).get("rounds", [])]


def _fmt(value: float | None, digits: int = 0) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:,.{digits}f}"


def _ratio(a: float, b: float) -> str:
    return "—" if not a or not b or math.isnan(a) or math.isnan(b) else f"{a / b:.2f}"


def summary(by_point: dict[Point, dict[str, Measurement]]) -> list[str]:
    """Geometric means of the hubserve ÷ peer ratios over the points where both measured, per peer,
    protocol and config variant."""
    ratios: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for point, row in by_point.items():
        hub = row.get(REFERENCE)
        if hub is None or hub.error:
            continue
        for name, m in row.items():
            if name != REFERENCE and not m.error and m.infer_per_s and m.cpu_us_per_infer > 0:
                ratios.setdefault((name, point.protocol, point.variant), []).append(
                    (hub.infer_per_s / m.infer_per_s, hub.cpu_us_per_infer / m.cpu_us_per_infer))
    if not ratios:
        return []
    out = ["", "Summary, geometric mean over the points both completed:", "",
           "| peer | proto | config | points | hubserve ÷ peer, infer/s | hubserve ÷ peer, CPU/infer |",
           "|---|---|---|---|---|---|"]
    for (name, protocol, variant), pairs in sorted(ratios.items()):
        tput, cpu = (math.exp(sum(math.log(p[i]) for p in pairs) / len(pairs)) for i in (0, 1))
        out.append(f"| {name} | {protocol} | {variant} | {len(pairs)} | {tput:.2f} | {cpu:.2f} |")
    return out


def config_table(models: list[str], chosen: list[variants.Variant], served: list[repos.ServedModel],
                 peers: set[str]) -> list[str]:
    """What each server is given, per model and variant: hubserve's completed config, which Triton gets as
    it is, and what MLServer's adaptive batching and KServe (no batcher) make of it."""
    out = [f"Configs: {'; '.join(f'`{v.name}` = {v.describe()}' for v in chosen)}. Triton gets hubserve's "
           "max_batch_size, dynamic batching (window, preferred sizes) and instance count.", "",
           "| model | config | served as | max_batch_size | dynamic batching (hubserve, Triton) "
           + "".join(f"| {peer} " for peer in ("mlserver", "kserve") if peer in peers) + "|",
           "|---|---|---|---|---|" + "---|" * len(peers & {"mlserver", "kserve"})]
    by_name = {m.name: m for m in served}
    for model in models:
        for variant in chosen:
            m = by_name[variant.served_name(model)]
            window = f"{m.max_queue_delay_us} µs window" if m.config.dynamic_batching else "off"
            cells = [model, variant.name, m.name, str(m.config.max_batch_size), window]
            if "mlserver" in peers:
                batching = repos.mlserver_batching(m)
                cells.append(f"adaptive, max_batch_size {batching[0]}, max_batch_time {batching[1] * 1e6:g} "
                             "µs" if batching else "off")
            if "kserve" in peers:
                cells.append("none (no server-side batcher)")
            out.append("| " + " | ".join(cells) + " |")
    return out


def point_table(by_point: dict[Point, dict[str, Measurement]]) -> list[str]:
    """Every server's numbers at every point, with hubserve's ratios to each peer."""
    out = [("| model | config | proto | conc | server | infer/s | p50 ms | p95 ms | p99 ms "
            "| server CPU µs/infer | avg batch | perf_analyzer CPU µs/infer "
            "| perf_analyzer page faults / switches per infer | perf_analyzer peak RSS MB | machine idle % "
            "| hubserve ÷ it, infer/s | hubserve ÷ it, CPU/infer |"),
           "|" + "---|" * 17]
    for point, row in by_point.items():
        hub = row.get(REFERENCE)
        for name, m in row.items():
            cells = [point.model, point.variant, point.protocol, str(point.concurrency), name]
            if m.error:
                out.append("| " + " | ".join(cells + [f"failed: {m.error}"] + [""] * 11) + " |")
                continue
            fmt = "json" if name == "mlserver" and point.protocol == "http" else ""
            cells[4] += f" ({fmt})" if fmt else ""
            cells += [_fmt(m.infer_per_s), _fmt(m.p50_ms, 2), _fmt(m.p95_ms, 2), _fmt(m.p99_ms, 2),
                      _fmt(m.cpu_us_per_infer), _fmt(m.avg_batch, 1), _fmt(m.client_cpu_us_per_infer),
                      f"{_fmt(m.client_faults_per_infer)} / {_fmt(m.client_switches_per_infer, 1)}",
                      _fmt(m.client_peak_rss_mb),
                      _fmt(None if m.machine_idle is None else m.machine_idle * 100)]
            if name == REFERENCE or hub is None or hub.error:
                cells += ["", ""]
            else:
                cells += [_ratio(hub.infer_per_s, m.infer_per_s),
                          _ratio(hub.cpu_us_per_infer, m.cpu_us_per_infer)]
            out.append("| " + " | ".join(cells) + " |")
    return out


def render(measurements: list[Measurement], ceiling: dict[tuple[str, int], float],
           running: list[servers.RunningServer], idle: dict[int, float], skipped: dict[str, str],
           events: list[str], served: list[repos.ServedModel], chosen: list[variants.Variant],
           args: argparse.Namespace, started: str, wall_s: float,
           load: tuple[tuple[float, ...], tuple[float, ...]],
           rounds: list[list[Measurement]] | None = None) -> str:
    by_point: dict[Point, dict[str, Measurement]] = {}
    for m in measurements:
        by_point.setdefault(m.point, {})[m.server] = m
    out = [f"## Peers run {started}", "",
           (f"Machine: {os.cpu_count()} cores ({platform.processor() or platform.machine()}), shared with "
            f"other engineers' test runs: load average {load[0][0]:.2f} at the start, "
            f"{load[1][0]:.2f} at the end. The servers and perf_analyzer share these cores. "
            "Numbers compare within this run only."), "",
           (f"Settings: models {args.models}; configs {args.configs}; protocols {args.protocols}; "
            f"concurrency {args.concurrency}; `-b 1`; `--input-data zero`; {args.interval_ms} ms windows, "
            f"stability {args.stability} %, at most {args.max_trials} windows, {args.retries} rerun(s) of a "
            f"point without stable windows; "
            + (f"{args.rounds} rounds a point, the server order alternating (A B, B A, ...), each number "
               "the median of the rounds; " if args.rounds > 1 else "")
            + f"hubserve's extra arguments: `{args.hubserve_args or 'none'}`; "
            f"wall time {wall_s / 60:.1f} min."), "",
           f"Run as: `{shlex.join(['.venv/bin/python', 'perf/bench_peers.py', *sys.argv[1:]])}`", "",
           *config_table([m for m in args.models.split(",") if m], chosen, served,
                         {s.kind.name for s in running}), "",
           f"| server | version | PID | idle CPU (% of a core, {args.idle_s:g} s before the first run) |",
           "|---|---|---|---|"]
    out += [f"| {s.kind.name} | {s.version} | {s.pid} | "
            f"{_fmt(idle[s.pid] * 100, 1) if s.pid in idle else '—'} |"
            for s in running]
    out += [f"| {name} | not run: {why.splitlines()[0]} | | |" for name, why in skipped.items()]
    out += [f"\nEvent: {e}" for e in events]
    out += ["", ("Ratios are hubserve ÷ that server at the same point: infer/s above 1 and CPU/inference "
                 "below 1 favour hubserve."), "",
            *point_table(by_point)]
    if rounds:
        out += ["", "Round by round (the tables use each number's median):", "", *rounds_table(rounds)]
    out += summary(by_point)
    out += ["", ("In-process ONNX Runtime ceiling: the same model.onnx in the benchmark's own process, "
                 "hubserve's session options, at the batch size hubserve formed (`bench_serving.ceiling`, "
                 f"best of three {args.ceiling_s:g} s windows, after the servers stopped):"), "",
            "| model | config | proto | conc | hubserve batch | ceiling infer/s | hubserve infer/s "
            "| hubserve ÷ ceiling |",
            "|---|---|---|---|---|---|---|---|"]
    for point, row in by_point.items():
        hub = row.get(REFERENCE)
        if hub is None or hub.error:
            continue
        c = ceiling.get((point.model, max(1, round(hub.avg_batch or 1))))
        out.append(f"| {point.model} | {point.variant} | {point.protocol} | {point.concurrency} | "
                   f"{_fmt(hub.avg_batch, 1)} | "
                   f"{_fmt(c)} | {_fmt(hub.infer_per_s)} | {_ratio(hub.infer_per_s, c or 0)} |")
    out += ["", "Commands (ports were picked free for this run):", "", "```"]
    out += [" ".join(s.command) for s in running]
    out += ["# perf_analyzer, one run per row above (these are the first runs; -m, -u, -i and the last",
            "# --concurrency-range change per row; a later copy of a flag overrides an earlier one;",
            "# -f <csv> is a temporary file):"]
    seen: set[tuple[str, str]] = set()
    for m in measurements:
        if m.command and (m.server, m.point.protocol) not in seen:
            seen.add((m.server, m.point.protocol))
            out.append(" ".join(m.command).replace(str(ROOT) + "/", ""))
    out.append("```")
    return "\n".join(out) + "\n"
