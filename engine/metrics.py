"""Every Prometheus metric the server exports is defined here, and nowhere else.

The numbers are read from each model version's `ModelStats` at scrape time, so the request path pays nothing
for metrics. Names and labels follow Triton's (`nv_inference_*{model, version}`) so existing dashboards work.
Counters are written in the text format by hand because prometheus_client renames counter families to
`*_total`, which Triton's names are not; prometheus_client supplies the process metrics (memory, CPU).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

from .histograms import FAMILIES as HISTOGRAM_FAMILIES
from .model import Model
from .stats import ModelStats

# name -> (type, help, value from stats)
FAMILIES: list[tuple[str, str, str, Callable[[ModelStats, Model], int]]] = [
    ("nv_inference_request_success", "counter", "Number of successful inference requests",
     lambda s, m: s.success.count),
    ("nv_inference_request_failure", "counter", "Number of failed inference requests",
     lambda s, m: s.fail.count),
    ("hubserve_inference_request_cancelled_total", "counter",
     "Inference requests cancelled by their client (disconnect, stream reset, gRPC deadline) before the "
     "answer",
     lambda s, m: s.cancelled.count),
    ("nv_inference_count", "counter", "Number of inferences performed (batch elements)",
     lambda s, m: s.inference_count),
    ("nv_inference_exec_count", "counter", "Number of model executions (batches)",
     lambda s, m: s.execution_count),
    ("nv_inference_request_duration_us", "counter", "Cumulative end-to-end inference request duration",
     lambda s, m: (s.success.ns + s.fail.ns) // 1000),
    ("nv_inference_queue_duration_us", "counter", "Cumulative time requests spend queued",
     lambda s, m: s.queue.ns // 1000),
    ("nv_inference_compute_input_duration_us", "counter", "Cumulative compute input duration",
     lambda s, m: s.compute_input.ns // 1000),
    ("nv_inference_compute_infer_duration_us", "counter", "Cumulative compute inference duration",
     lambda s, m: s.compute_infer.ns // 1000),
    ("nv_inference_compute_output_duration_us", "counter", "Cumulative compute output duration",
     lambda s, m: s.compute_output.ns // 1000),
    ("nv_inference_pending_request_count", "gauge", "Requests queued or executing, not yet answered",
     lambda s, m: m.pending_count),
]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(models: Iterable[Model], process: CollectorRegistry | None = None) -> bytes:
    models = list(models)
    lines: list[str] = []
    for name, kind, help_text, value in FAMILIES:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for m in models:
            labels = f'model="{_escape(m.name)}",version="{m.version_str}"'
            lines.append(f"{name}{{{labels}}} {value(m.stats, m)}")
    lines.append("# HELP hubserve_batch_dispatch_total Batches sent, by why they left the queue: full, "
                 "preferred (a preferred size reached), window (max_queue_delay expired), immediate "
                 "(no window), early (no other request could join before the window ended)")
    lines.append("# TYPE hubserve_batch_dispatch_total counter")
    for m in models:
        for reason, count in sorted(m.stats.dispatch_reasons.items()):
            lines.append(f'hubserve_batch_dispatch_total{{model="{_escape(m.name)}",version="{m.version_str}",'
                         f'reason="{reason}"}} {count}')
    lines.extend(_sequence_lines(models))
    lines.extend(_histogram_lines(models))
    text = "\n".join(lines) + "\n"
    if process is not None:
        text += generate_latest(process).decode()
    return text.encode()


# Sequence models only (engine/sequence_batcher.py): key of `sequence_counts()` -> (name, type, help).
_SEQUENCE_FAMILIES = [
    ("started", "hubserve_sequence_started_total", "counter", "Sequences started (requests with START)"),
    ("ended", "hubserve_sequence_ended_total", "counter", "Sequences ended by a request with END"),
    ("idle_released", "hubserve_sequence_idle_released_total", "counter",
     "Sequences released after max_sequence_idle_microseconds without a request"),
    ("active", "hubserve_sequence_active", "gauge", "Sequences holding a slot"),
    ("backlog", "hubserve_sequence_backlog", "gauge", "Sequences waiting in the backlog for a slot"),
]


def _sequence_lines(models: list[Model]) -> list[str]:
    counted = [(m, counts()) for m in models
               if (counts := getattr(m.batcher, "sequence_counts", None)) is not None]
    if not counted:
        return []
    lines = []
    for key, name, kind, help_text in _SEQUENCE_FAMILIES:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for m, values in counted:
            lines.append(f'{name}{{model="{_escape(m.name)}",version="{m.version_str}"}} {values[key]}')
    return lines


def _bound(b: float) -> str:
    return str(int(b)) if b == int(b) else repr(b)


def _histogram_lines(models: list[Model]) -> list[str]:
    """The latency histograms (engine/histograms.py) in Prometheus' form: cumulative `_bucket{le}`, `_sum`
    and `_count` per model version, in microseconds."""
    shown = [m for m in models if m.stats.histograms is not None]
    if not shown:
        return []
    lines = []
    for attr, name, help_text in HISTOGRAM_FAMILIES:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} histogram")
        for m in shown:
            hists = m.stats.histograms
            assert hists is not None
            hist = getattr(hists, attr)
            labels = f'model="{_escape(m.name)}",version="{m.version_str}"'
            bounds = [_bound(b) for b in hists.buckets_us] + ["+Inf"]
            for le, count in zip(bounds, hist.cumulative(), strict=True):
                lines.append(f'{name}_bucket{{{labels},le="{le}"}} {count}')
            lines.append(f"{name}_sum{{{labels}}} {hist.sum_ns / 1000}")
            lines.append(f"{name}_count{{{labels}}} {hist.count}")
    return lines


def process_registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    return registry
