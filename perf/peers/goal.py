"""Issue 32's goal table, from the per-point numbers of one `bench_peers.py` run: hubserve against Triton with
its C++ onnxruntime backend (the anchor), per model × protocol, the concurrencies side by side, and whether
each goal holds there:

- throughput: hubserve ≥ 1.0 × the anchor at every point;
- latency: hubserve's p99 ≤ the anchor's at every point;
- CPU: hubserve's server CPU per inference ≤ the anchor's at the highest concurrency (c = 32 in the issue),
  where both servers are saturated and CPU per inference is what decides throughput.

Pure: the measurements in, markdown lines out, so a recorded run (`report.load`) renders the same table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .report import Measurement, by_server

ANCHOR = "triton-ort"
AIM_RATIO = 1.2
"""The issue's aim at the highest concurrency; reported, not required."""
ALIASES = {"image": "big"}
"""The issue's table calls `image` (3×224×224 FP32, 588 KiB per inference) `big`."""


@dataclass(frozen=True, slots=True)
class GoalPoint:
    model: str
    protocol: str
    concurrency: int
    hub: Measurement | None
    anchor: Measurement | None
    cpu_goal: bool
    """Whether the CPU goal applies here (the highest concurrency of the run)."""

    def both(self) -> tuple[Measurement, Measurement] | None:
        """(hubserve's, the anchor's) where both completed the point, else None."""
        if self.hub is None or self.anchor is None:
            return None
        ok = all(not m.error and m.infer_per_s > 0 for m in (self.hub, self.anchor))
        return (self.hub, self.anchor) if ok else None

    @property
    def measured(self) -> bool:
        return self.both() is not None

    @property
    def ratio(self) -> float:
        both = self.both()
        return both[0].infer_per_s / both[1].infer_per_s if both else math.nan

    @property
    def throughput_holds(self) -> bool | None:
        return self.ratio >= 1.0 if self.measured else None

    @property
    def p99_holds(self) -> bool | None:
        both = self.both()
        return both[0].p99_ms <= both[1].p99_ms if both else None

    @property
    def cpu_holds(self) -> bool | None:
        """None where the CPU goal does not apply or a side's CPU could not be counted."""
        both = self.both()
        if not self.cpu_goal or both is None:
            return None
        hub, anchor = both[0].cpu_us_per_infer, both[1].cpu_us_per_infer
        return None if math.isnan(hub) or math.isnan(anchor) else hub <= anchor

    @property
    def misses(self) -> list[str]:
        """The goals that do not hold here, by name; a point that was not measured misses all of them."""
        if not self.measured:
            return ["not measured"]
        return [name for name, holds in (("throughput", self.throughput_holds), ("p99", self.p99_holds),
                                         ("CPU", self.cpu_holds)) if holds is False]


def goal_points(measurements: list[Measurement], reference: str, variant: str,
                anchor: str = ANCHOR) -> list[GoalPoint]:
    """One GoalPoint per (model, protocol, concurrency) of `variant` that either server measured, in the
    run's order."""
    pairs: dict[tuple[str, str, int], dict[str, Measurement]] = {}
    for m in measurements:
        if m.point.variant == variant and m.server in (reference, anchor):
            pairs.setdefault((m.point.model, m.point.protocol, m.point.concurrency), {})[m.server] = m
    top = max((c for _, _, c in pairs), default=0)
    return [GoalPoint(model, protocol, c, row.get(reference), row.get(anchor), c == top)
            for (model, protocol, c), row in pairs.items()]


def _num(value: float, digits: int, missed: bool = False) -> str:
    text = "—" if math.isnan(value) else f"{value:,.{digits}f}"
    return f"**{text}**" if missed else text


def _pair(p: GoalPoint, field: str, digits: int, missed: bool | None) -> str:
    """hubserve's value / the anchor's, hubserve's in bold where it misses its goal."""
    both = p.both()
    hub, anchor = (getattr(m, field) for m in both) if both else (math.nan, math.nan)
    return f"{_num(hub, digits, missed is False)} / {_num(anchor, digits)}"


def render(points: list[GoalPoint], reference: str = "hubserve", anchor: str = ANCHOR) -> list[str]:
    """The issue's table shape: a row per model × protocol, each cell the concurrencies joined by " / " (pairs
    by " · "), a value that misses its goal in bold; then the count of points where each goal holds."""
    rows: dict[tuple[str, str], list[GoalPoint]] = {}
    for p in points:
        rows.setdefault((p.model, p.protocol), []).append(p)
    out = [f"| model | proto | c | {reference} ÷ {anchor} | p99 ms {reference} / {anchor} "
           f"| server µs CPU per inference, {reference} / {anchor} | goals missed |",
           "|---|---|---|---|---|---|---|"]
    for (model, protocol), row in rows.items():
        name = f"{model} ({ALIASES[model]})" if model in ALIASES else model
        ratio = " / ".join(_num(p.ratio, 2, p.throughput_holds is False) for p in row)
        p99 = " · ".join(_pair(p, "p99_ms", 2, p.p99_holds) for p in row)
        cpu = " · ".join(_pair(p, "cpu_us_per_infer", 0, p.cpu_holds) for p in row)
        missed = "; ".join(f"c={p.concurrency}: {', '.join(p.misses)}" for p in row if p.misses) or "none"
        out.append(f"| {name} | {protocol} | {' / '.join(str(p.concurrency) for p in row)} | {ratio} | {p99} "
                   f"| {cpu} | {missed} |")
    out += ["", *verdict(points)]
    return out


def verdict(points: list[GoalPoint]) -> list[str]:
    """How many points meet each goal, and whether all do."""
    measured = [p for p in points if p.measured]
    top = [p for p in points if p.cpu_goal]
    top_c = top[0].concurrency if top else 0
    counts = [
        ("throughput ≥ 1.0 ×", sum(p.throughput_holds is True for p in points), len(points)),
        ("p99 ≤ the anchor's", sum(p.p99_holds is True for p in points), len(points)),
        (f"CPU per inference ≤ the anchor's at c = {top_c}", sum(p.cpu_holds is True for p in top), len(top)),
    ]
    aim = sum(p.measured and p.ratio >= AIM_RATIO for p in top)
    holds = all(n == total for _, n, total in counts) and len(measured) == len(points) and bool(points)
    lost = len(points) - len(measured)
    return [f"- {label}: {n} of {total} points" for label, n, total in counts] + [
        f"- aim, ≥ {AIM_RATIO} × at c = {top_c}: {aim} of {len(top)} points",
        f"- **goal {'holds' if holds else 'does not hold'}**"
        + (f" ({lost} point{'s' if lost > 1 else ''} not measured)" if lost else ""),
    ]


def by_round(rounds: list[list[Measurement]], reference: str, variant: str,
             anchor: str = ANCHOR) -> list[str]:
    """Each round of a `--rounds` run on its own (the i-th measurement of each server at each point), the
    goal's counts as that round alone would give them: how much the medians' verdict owes to the rounds."""
    grouped = [by_server(at_point) for at_point in rounds]
    count = max((len(g.get(reference, [])) for g in grouped), default=0)
    out = []
    for i in range(count):
        alone = [own[i] for g in grouped for server in (reference, anchor)
                 if i < len(own := g.get(server, []))]
        lines = verdict(goal_points(alone, reference, variant, anchor))
        counts = "; ".join(line.removeprefix("- ") for line in lines[:3])
        held = "holds" if lines[-1].startswith("- **goal holds") else "does not hold"
        out.append(f"- round {i + 1} alone: {counts}; the goal {held}")
    return out
