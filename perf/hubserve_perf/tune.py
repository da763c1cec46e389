"""`hubserve perf tune-window`: the batching-window lab.

For each candidate `max_queue_delay_microseconds` it
  1. reloads the model through the repository API with its current config (as the server reports it) and
     only the window changed — `POST /v2/repository/models/{m}/load` with `parameters.config`, or gRPC's
     RepositoryModelLoad — and waits until the model is ready (the server must run in explicit model-control
     mode, as Triton must: in none and poll modes the first load is refused, UNAVAILABLE);
  2. measures one step (measure.py: windows until stable) under the same load;
  3. reads how the batches left: the average batch size, and the end-of-window flushes — batches sent
     because the window ran out. With `--metrics-url` (hubserve's Prometheus port) these are counted exactly
     (`hubserve_batch_dispatch_total{reason="window"}`); otherwise, on any server, they are estimated from the
     statistics' batch_stats as batches smaller than max_batch_size and not a preferred size (which at
     window 0 also counts batches sent at once because nothing else was queued).
Then it recommends the highest-throughput window whose p95 meets the budget, prints the curve, and loads the
original config back, whatever happened.
"""

from __future__ import annotations

import argparse
import copy
import re
from dataclasses import dataclass
from typing import Any

from .measure import StepResult, measure_step
from .types import Distribution, ExitCode, LoadPlan, ModelInfo, PerfError

READY_TIMEOUT_S = 120.0
_DISPATCH_LINE = re.compile(
    r'^hubserve_batch_dispatch_total\{model="([^"]*)",version="[^"]*",reason="([^"]*)"\} (\d+)',
    re.MULTILINE)


@dataclass(frozen=True, slots=True)
class TunePoint:
    window_us: int
    step: StepResult
    flushed_batches: int  # batches sent because the window ran out (exact, or estimated: see the module doc)
    executions: int
    flush_source: str  # "dispatch metric" or "batch sizes"

    @property
    def p95_ms(self) -> float:
        return self.step.percentiles_ns[95] / 1e6

    @property
    def avg_batch(self) -> float:
        return self.step.server.avg_batch_size

    @property
    def flush_share(self) -> float:
        return self.flushed_batches / self.executions if self.executions else 0.0


def parse_windows(text: str) -> list[int]:
    try:
        windows = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        windows = []
    if not windows or any(w < 0 for w in windows):
        raise PerfError(f"--windows-us expects comma-separated non-negative integers, got '{text}'",
                        ExitCode.USAGE)
    return windows


def with_window(config: dict[str, Any], window_us: int) -> dict[str, Any]:
    """The config with only dynamic_batching.max_queue_delay_microseconds changed (dynamic batching added
    with defaults where the config had none)."""
    out = copy.deepcopy(config)
    out.setdefault("dynamic_batching", {})["max_queue_delay_microseconds"] = window_us
    return out


def flushed(model: ModelInfo, step: StepResult) -> tuple[int, int]:
    preferred = {int(s) for s in model.config.get("dynamic_batching", {}).get("preferred_batch_size", ())}
    by_size = step.server.executions_by_batch_size
    small = sum(n for size, n in by_size if size < model.max_batch_size and size not in preferred)
    return small, sum(n for _, n in by_size)


async def dispatch_counts(metrics_url: str, model: str) -> dict[str, int]:
    """hubserve's batches of `model` so far, by why they left the queue (full, preferred, window,
    immediate)."""
    import aiohttp

    url = metrics_url if "://" in metrics_url else f"http://{metrics_url}/metrics"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http, http.get(url) as r:
            text = await r.text()
    except (aiohttp.ClientError, OSError) as e:
        raise PerfError(f"cannot read metrics from {url}: {e}") from None
    counts: dict[str, int] = {}
    for name, reason, count in _DISPATCH_LINE.findall(text):
        if name == model:
            counts[reason] = counts.get(reason, 0) + int(count)
    if not counts and "hubserve_batch_dispatch_total" not in text:
        raise PerfError(f"{url} has no hubserve_batch_dispatch_total: is it hubserve's metrics port?")
    return counts


def recommend(points: list[TunePoint], budget_ms: float) -> TunePoint | None:
    within = [p for p in points if p.step.request_count and p.p95_ms <= budget_ms]
    return max(within, key=lambda p: (p.step.throughput, -p.window_us), default=None)


def tune_plan(args: argparse.Namespace, model: ModelInfo) -> LoadPlan:
    if args.request_rate:
        return LoadPlan(request_rate=args.request_rate, distribution=Distribution(args.request_distribution))
    return LoadPlan(concurrency=args.concurrency or 2 * max(model.max_batch_size, 1))


async def run_tune(args: argparse.Namespace) -> int:
    from . import report
    from .cli import check_common
    from .control import wait_ready
    from .session import open_session

    windows = parse_windows(args.windows_us)
    check_common(args)
    provisional = LoadPlan(request_rate=args.request_rate) if args.request_rate else \
        LoadPlan(concurrency=args.concurrency or 16)
    async with open_session(args, provisional) as session:
        model = session.model
        if not model.batching:
            raise PerfError(f"model '{model.name}' does not batch (max_batch_size 0): there is no window "
                            "to tune",
                            ExitCode.USAGE)
        plan = tune_plan(args, model)
        original = model.config
        points: list[TunePoint] = []
        reloaded = False  # until a load succeeds nothing changed, and its error is the one to report
        try:
            for window_us in windows:
                session.progress(f"--- max_queue_delay_microseconds {window_us}: reloading '{model.name}'")
                await session.control.load(model.name, with_window(original, window_us))
                reloaded = True
                await wait_ready(session.control, model.name, args.version, READY_TIMEOUT_S)
                before = await dispatch_counts(args.metrics_url, model.name) if args.metrics_url else {}
                step = await measure_step(session.load, session.control, model.name, args.version, plan,
                                          session.settings, session.progress)
                session.warn_if_delayed(step)
                session.warn_if_client_bound(step)
                if args.metrics_url:
                    # Counted over the whole measurement, not only its last 3 windows: a share, not a rate.
                    after = await dispatch_counts(args.metrics_url, model.name)
                    delta = {k: v - before.get(k, 0) for k, v in after.items()}
                    points.append(TunePoint(window_us, step, delta.get("window", 0), sum(delta.values()),
                                            "dispatch metric"))
                else:
                    points.append(TunePoint(window_us, step, *flushed(model, step), "batch sizes"))
        finally:
            if reloaded:
                session.progress(f"--- restoring the original config of '{model.name}'")
                await session.control.load(model.name, original)
                await wait_ready(session.control, model.name, args.version, READY_TIMEOUT_S)
    best = recommend(points, args.p95_budget_ms)
    print_curve(points, best, args.p95_budget_ms)
    if args.csv:
        write_curve_csv(args.csv, points)
    if args.json:
        report.write_json(args.json, {
            **session.describe(), "p95_budget_ms": args.p95_budget_ms,
            "recommended_window_us": best.window_us if best else None,
            "curve": [{"window_us": p.window_us, "avg_batch_size": p.avg_batch,
                       "flushed_batches": p.flushed_batches,
                       "executions": p.executions, "flush_counted_from": p.flush_source,
                       **report.step_json(p.step)} for p in points]})
    if args.plot:
        plot_curve(args.plot, points, best, args.p95_budget_ms, model.name)
    return int(ExitCode.OK if best else ExitCode.USAGE)


CURVE_COLUMNS = ("window_us", "infer_per_s", "p50_ms", "p95_ms", "p99_ms", "avg_batch", "flushed_pct",
                 "queue_us", "stable", "meets_budget")


def _curve_rows(points: list[TunePoint], budget_ms: float | None = None) -> list[list[str]]:
    rows = []
    for p in points:
        s = p.step
        rows.append([str(p.window_us), f"{s.throughput:.1f}", f"{s.percentiles_ns[50] / 1e6:.3f}",
                     f"{p.p95_ms:.3f}", f"{s.percentiles_ns[99] / 1e6:.3f}", f"{p.avg_batch:.2f}",
                     f"{100 * p.flush_share:.1f}", f"{s.server_avg_ns(s.server.queue_ns) / 1e3:.0f}",
                     "yes" if s.stable else "no",
                     "" if budget_ms is None else ("yes" if p.p95_ms <= budget_ms else "no")])
    return rows


def print_curve(points: list[TunePoint], best: TunePoint | None, budget_ms: float) -> None:
    rows = [list(CURVE_COLUMNS), *_curve_rows(points, budget_ms)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(CURVE_COLUMNS))]
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    if points:
        if points[0].flush_source == "dispatch metric":
            how = "counted from hubserve_batch_dispatch_total"
        else:
            how = "estimated: batches below max_batch_size and no preferred size"
        print(f"flushed_pct: share of batches that left because the window ran out ({how})")
    if best is None:
        print(f"no window meets the p95 budget of {budget_ms:g} ms")
    else:
        print(f"recommended max_queue_delay_microseconds: {best.window_us} "
              f"({best.step.throughput:,.1f} infer/s, p95 {best.p95_ms:.2f} ms <= {budget_ms:g} ms, "
              f"average batch {best.avg_batch:.2f})")


def write_curve_csv(path: Any, points: list[TunePoint]) -> None:
    lines = [",".join(CURVE_COLUMNS[:-1])] + [",".join(r[:-1]) for r in _curve_rows(points)]
    path.write_text("\n".join(lines) + "\n")


def plot_curve(path: Any, points: list[TunePoint], best: TunePoint | None, budget_ms: float,
               model: str) -> None:
    from .report import _pyplot

    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = [p.window_us for p in points]
    left.plot(xs, [p.step.throughput for p in points], "o-")
    left.set_xlabel("max_queue_delay_microseconds")
    left.set_ylabel("throughput (infer/s)")
    for q, style in ((50, "o-"), (95, "s-"), (99, "^:")):
        right.plot(xs, [p.step.percentiles_ns[q] / 1e6 for p in points], style, label=f"p{q}")
    right.axhline(budget_ms, color="red", linewidth=0.8, label="p95 budget")
    right.set_xlabel("max_queue_delay_microseconds")
    right.set_ylabel("latency (ms)")
    right.legend()
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        if best is not None:
            ax.axvline(best.window_us, color="green", linewidth=0.8)
    fig.suptitle(f"{model}: batching window sweep")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
