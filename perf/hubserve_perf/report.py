"""What a run prints and writes: a table on stdout, perf_analyzer's CSV (`-f`, the `--verbose-csv` columns;
the stable points), JSON with everything measured (`--json`), and a latency–throughput plot of every point,
unstable ones hollow (`--plot`, needs matplotlib: install hubserve's `perf` extra).

The CSV matches perf_analyzer's byte for byte in shape: the same header, rows sorted by increasing
throughput, throughput with 6 significant digits, times as whole microseconds (truncated).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TextIO

from .measure import MeasureSettings, StepResult
from .types import ExitCode, PerfError

CSV_TIME_COLUMNS = ("Client Send", "Network+Server Send/Recv", "Server Queue", "Server Compute Input",
                    "Server Compute Infer", "Server Compute Output", "Client Recv")
CSV_VERBOSE_COLUMNS = ("Avg latency", "request/response", "response wait")


def level_column(open_loop: bool) -> str:
    return "Request Rate" if open_loop else "Concurrency"


def csv_header(open_loop: bool, settings: MeasureSettings) -> list[str]:
    return [level_column(open_loop), "Inferences/Second", *CSV_TIME_COLUMNS,
            *(f"p{p} latency" for p in settings.percentiles), *CSV_VERBOSE_COLUMNS]


def _us(ns: float) -> int:
    return int(ns // 1000)


def csv_row(step: StepResult, settings: MeasureSettings) -> list[str]:
    s = step.server
    level = f"{step.plan.request_rate:g}" if step.plan.open_loop else str(step.plan.concurrency)
    send, recv, avg = _us(step.avg_send_ns), _us(step.avg_recv_ns), _us(step.avg_latency_ns)
    return [level, f"{step.throughput:g}", str(send), str(_us(step.network_ns)),
            str(_us(step.server_avg_ns(s.queue_ns))), str(_us(step.server_avg_ns(s.compute_input_ns))),
            str(_us(step.server_avg_ns(s.compute_infer_ns))),
            str(_us(step.server_avg_ns(s.compute_output_ns))),
            str(recv), *(str(_us(step.percentiles_ns[p])) for p in settings.percentiles),
            str(avg), str(send + recv), str(max(avg - send - recv, 0))]


def write_csv(path: Path, steps: list[StepResult], settings: MeasureSettings, open_loop: bool) -> None:
    lines = [",".join(csv_header(open_loop, settings))]
    lines += [",".join(csv_row(s, settings)) for s in sorted(steps, key=lambda s: s.throughput)]
    path.write_text("\n".join(lines) + "\n")


def print_table(steps: list[StepResult], settings: MeasureSettings, out: TextIO = sys.stdout) -> None:
    if not steps:
        return
    open_loop = steps[0].plan.open_loop
    head = [level_column(open_loop), "Infer/s", "Avg ms", *(f"p{p} ms" for p in settings.percentiles),
            "Queue us", "Compute us", "Stable"]
    rows = [head]
    for s in steps:
        rows.append([f"{s.level:g}", f"{s.throughput:,.1f}", f"{s.avg_latency_ns / 1e6:.2f}",
                     *(f"{s.percentiles_ns[p] / 1e6:.2f}" for p in settings.percentiles),
                     f"{s.server_avg_ns(s.server.queue_ns) / 1e3:.0f}", f"{s.server_compute_ns / 1e3:.0f}",
                     "yes" if s.stable else "NO"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)), file=out)


def step_json(step: StepResult) -> dict[str, Any]:
    s = step.server
    return {
        "concurrency": step.plan.concurrency if not step.plan.open_loop else None,
        "request_rate": step.plan.request_rate if step.plan.open_loop else None,
        "stable": step.stable,
        "windows_measured": step.windows_measured,
        "window_throughputs": [round(t, 3) for t in step.window_throughputs],
        "request_count": step.request_count,
        "duration_s": step.duration_ns / 1e9,
        "throughput_infer_per_s": step.throughput,
        "latency_us": {"avg": step.avg_latency_ns / 1e3,
                       **{f"p{p}": v / 1e3 for p, v in sorted(step.percentiles_ns.items())}},
        "client_send_us": step.avg_send_ns / 1e3,
        "client_recv_us": step.avg_recv_ns / 1e3,
        "network_server_send_recv_us": step.network_ns / 1e3,
        "delayed_requests": step.delayed,
        "client_cpu_cores": step.client_cpu_ns / step.duration_ns if step.duration_ns else 0.0,
        "client_cpu_us_per_request": (step.client_cpu_ns / 1e3 / step.request_count
                                      if step.request_count else 0.0),
        "server": {
            "request_count": s.success_count,
            "inference_count": s.inference_count,
            "execution_count": s.execution_count,
            "avg_batch_size": s.avg_batch_size,
            "request_us": step.server_avg_ns(s.success_ns) / 1e3,  # the server's own view of a request
            "queue_us": step.server_avg_ns(s.queue_ns) / 1e3,
            "compute_input_us": step.server_avg_ns(s.compute_input_ns) / 1e3,
            "compute_infer_us": step.server_avg_ns(s.compute_infer_ns) / 1e3,
            "compute_output_us": step.server_avg_ns(s.compute_output_ns) / 1e3,
            "executions_by_batch_size": {str(size): n for size, n in s.executions_by_batch_size},
        },
    }


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=2) + "\n")


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PerfError("--plot needs matplotlib: pip install 'hubserve[perf]' (or pip install matplotlib)",
                        ExitCode.USAGE) from None
    return plt


def check_plot_available() -> None:
    """Called before the load starts, so a missing matplotlib fails fast instead of after the run."""
    _pyplot()


def plot_latency_throughput(path: Path, steps: list[StepResult], title: str) -> None:
    """Every point of the sweep, in sweep order (the curve bends back where more load brings less
    throughput); a point without a stable measurement is drawn hollow and labelled so, not left out."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    points = steps
    unstable = [s for s in points if not s.stable]
    xs = [s.throughput for s in points]
    for p, style in ((50, "o-"), (95, "s--"), (99, "^:")):
        if all(p in s.percentiles_ns for s in points):
            (line,) = ax.plot(xs, [s.percentiles_ns[p] / 1e6 for s in points], style, label=f"p{p}")
            ax.plot([s.throughput for s in unstable], [s.percentiles_ns[p] / 1e6 for s in unstable],
                    style[0], linestyle="none", markerfacecolor="white", markeredgecolor=line.get_color())
    for s in points:
        label = f"{s.plan.request_rate:g}/s" if s.plan.open_loop else f"c={s.plan.concurrency}"
        ax.annotate(label if s.stable else f"{label} (unstable)",
                    (s.throughput, s.percentiles_ns.get(50, 0) / 1e6),
                    textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("throughput (infer/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"{title} (hollow: not stable)" if unstable else title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
