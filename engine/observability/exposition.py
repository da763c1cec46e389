"""Prometheus' text exposition format, the pieces every family of /metrics is written with (metrics.py,
vllm_metrics.py): label values escaped, and a histogram family's lines."""

from __future__ import annotations

from collections.abc import Callable

from .histograms import Histogram


def escape(value: str) -> str:
    """A label value as the text format quotes it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _bound(b: float) -> str:
    return str(int(b)) if b == int(b) else repr(b)


def float_bound(b: float) -> str:
    """A bucket bound as prometheus_client writes it, always as a float ("1.0", "2560.0"): vLLM's pages have
    it so, and a query matching `le` as a string (Prometheus before 3.0 keeps it as written) needs it so."""
    return repr(float(b))


def histogram_family(name: str, help_text: str, series: list[tuple[str, Histogram]],
                     buckets: tuple[float, ...] | None = None, bound: Callable[[float], str] = _bound
                     ) -> list[str]:
    """One histogram family in Prometheus' form: cumulative `_bucket{le}`, `_sum` and `_count` per series
    (its labels), in the unit each histogram is shown in. `buckets`: the bounds to show, each one of the
    histograms' own (None: all of them); `bound` writes each (ours: "1", "0.5")."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    for labels, hist in series:
        shown = buckets if buckets is not None else tuple(b / hist.unit for b in hist.bounds)
        counts = hist.cumulative_at(shown) if buckets is not None else hist.cumulative()
        for le, count in zip([*map(bound, shown), "+Inf"], counts, strict=True):
            lines.append(f'{name}_bucket{{{labels},le="{le}"}} {count}')
        lines.append(f"{name}_sum{{{labels}}} {hist.sum / hist.unit}")
        lines.append(f"{name}_count{{{labels}}} {hist.count}")
    return lines
