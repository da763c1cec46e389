"""Dynamic batching, measured: on vs off, vs in-process ONNX Runtime, early dispatch, a window sweep, and the
SLO mode.

One hubserve (explicit model control) serves the example models; between runs the repository load API
reloads a model with a config override (batching off, another window, a p95 target). NVIDIA's real
perf_analyzer drives every run. Everything is printed side by side from this one run.

    .venv/bin/python perf/bench_batching.py [--quick] [--p95-budget-ms 100] [--slo-target-ms 60]
                                            [--sections onoff,wire,early,sweep,slo]

Sections: onoff (mlp_large at c=16, batching on vs off, vs the ONNX Runtime ceiling), wire (simple, mlp),
early (issue 13 point 5: early dispatch on vs off vs batching off at c = 1, 4, 16, 32), sweep (fixed windows
on mlp_large at c=16, both protocols, early dispatch on and off) and slo (the p95-target window against the
sweep's best fixed window, both protocols).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

from bench_serving import ceiling  # perf/, this script's folder
from hubserve_harness import ROOT, start_server
from hubserve_harness.perf_analyzer import run_perf_analyzer
from hubserve_models import examples


class Hub:
    def __init__(self, http_port: int) -> None:
        self.base = f"http://127.0.0.1:{http_port}"

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        with urllib.request.urlopen(req, timeout=120) as r:
            text = r.read()
        return json.loads(text) if text else {}

    def config(self, model: str) -> dict:
        return self.call("GET", f"/v2/models/{model}/config")

    def load(self, model: str, config: dict) -> None:
        body = {"parameters": {"config": json.dumps(config)}}
        self.call("POST", f"/v2/repository/models/{model}/load", body)

    def stats(self, model: str) -> dict:
        return self.call("GET", f"/v2/models/{model}/stats")["model_stats"][0]


def dispatch_reasons(metrics_url: str, model: str) -> dict[str, int]:
    """hubserve_batch_dispatch_total by reason, for one model, from the Prometheus endpoint."""
    with urllib.request.urlopen(metrics_url, timeout=30) as r:
        text = r.read().decode()
    out: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("hubserve_batch_dispatch_total{") and f'model="{model}"' in line:
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            out[reason] = int(float(line.rsplit(" ", 1)[1]))
    return out


def variant(base: dict, batching: bool, window_us: int | None = None, target_ms: float | None = None,
            early: bool | None = None, max_batch_size: int | None = None) -> dict:
    """`base` (the config the server reports) with batching on or off, another window, a p95 target, early
    dispatch forced on or off (None = the server's default), another max_batch_size."""
    cfg = {k: v for k, v in base.items() if k not in ("dynamic_batching",)}
    ours = ("p95_latency_target_ms", "early_dispatch")
    params = {k: v for k, v in cfg.get("parameters", {}).items() if k not in ours}
    if batching:
        db = dict(base.get("dynamic_batching") or {})
        if window_us is not None:
            db["max_queue_delay_microseconds"] = window_us
        cfg["dynamic_batching"] = db
    if max_batch_size is not None:
        cfg["max_batch_size"] = max_batch_size
    if target_ms is not None:
        params["p95_latency_target_ms"] = {"string_value": str(target_ms)}
    if early is not None and batching:
        params["early_dispatch"] = {"string_value": "true" if early else "false"}
    cfg["parameters"] = params
    return cfg


def run(hub: Hub, server, model: str, protocol: str, concurrency: int, interval_ms: int) -> dict:
    before = hub.stats(model)
    reasons_before = dispatch_reasons(server.metrics_url, model)
    url = server.grpc_url if protocol == "grpc" else server.http_url
    res = run_perf_analyzer(model, url, protocol, "--concurrency-range", str(concurrency),
                            "--measurement-interval", str(interval_ms), timeout_s=300)
    after = hub.stats(model)
    if not res.ok or not res.csv_rows:
        raise RuntimeError(f"perf_analyzer failed ({model} {protocol} c={concurrency}):\n"
                           f"{res.output[-3000:]}")
    row = res.csv_rows[0]
    execs = after["execution_count"] - before["execution_count"]
    infers = after["inference_count"] - before["inference_count"]
    reasons_after = dispatch_reasons(server.metrics_url, model)

    def share(reason: str) -> float:
        sent = reasons_after.get(reason, 0) - reasons_before.get(reason, 0)
        return sent / execs if execs else 0.0

    return {"tput": res.throughput, "p50": float(row["p50 latency"]) / 1e3,
            "p95": float(row["p95 latency"]) / 1e3, "p99": float(row["p99 latency"]) / 1e3,
            "batch": infers / execs if execs else 0.0,
            "flushed": share("window"), "early": share("early")}


def fmt(r: dict) -> str:
    return (f"{r['tput']:>8.0f} {r['p50']:>7.2f} {r['p95']:>7.2f} {r['p99']:>7.2f} {r['batch']:>6.1f}")


SECTIONS = ("onoff", "wire", "early", "sweep", "slo")


class Bench:
    """One server, its models' base configs, and the lines printed so far (written to perf/results/)."""

    def __init__(self, hub: Hub, server, repo: Path, interval_ms: int, quick: bool) -> None:
        self.hub, self.server, self.repo, self.interval, self.quick = hub, server, repo, interval_ms, quick
        self.base = {m: hub.config(m) for m in ("simple", "mlp", "mlp_large")}
        self.lines: list[str] = []

    def out(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def measure(self, model: str, config: dict, protocol: str, concurrency: int) -> dict:
        self.hub.load(model, config)
        return run(self.hub, self.server, model, protocol, concurrency, self.interval)

    def restore(self, model: str) -> None:
        self.hub.load(model, self.base[model])

    # ------------------------------------------------------------------ sections

    def onoff(self) -> None:
        self.out("## Compute-bound mlp_large at concurrency 16: dynamic batching on vs off")
        self.out(f"{'proto':<5} {'mode':<4} {'infer/s':>8} {'p50':>7} {'p95':>7} {'p99':>7} {'batch':>6} "
                 f"{'ceiling':>8} {'vs ceil':>7}")
        onnx = self.repo / "mlp_large/1/model.onnx"
        for protocol in ("grpc", "http"):
            results = {on: self.measure("mlp_large", variant(self.base["mlp_large"], on), protocol, 16)
                       for on in (True, False)}
            ceil = ceiling(onnx, "mlp_large", max(1, round(results[True]["batch"])))
            for on in (True, False):
                r = results[on]
                ceil_on = ceil if on else ceiling(onnx, "mlp_large", 1)
                self.out(f"{protocol:<5} {'on' if on else 'off':<4} {fmt(r)} {ceil_on:>8.0f} "
                         f"{r['tput'] / ceil_on:>7.2f}")
            ratio = results[True]["tput"] / results[False]["tput"]
            self.out(f"{protocol:<5} on/off throughput {ratio:.2f}x, "
                     f"p95 {results[True]['p95']:.1f} vs {results[False]['p95']:.1f} ms")
        self.restore("mlp_large")

    def wire(self) -> None:
        self.out("## simple and mlp: batching on vs off")
        self.out(f"{'model':<7} {'proto':<5} {'conc':>4} {'on infer/s':>10} {'off infer/s':>11} {'ratio':>6} "
                 f"{'on p95':>7} {'off p95':>7} {'batch':>6}")
        for model in ("simple", "mlp"):
            for protocol in ("grpc", "http"):
                for c in ((32,) if self.quick else (16, 32)):
                    on = self.measure(model, variant(self.base[model], True), protocol, c)
                    off = self.measure(model, variant(self.base[model], False), protocol, c)
                    self.out(f"{model:<7} {protocol:<5} {c:>4} {on['tput']:>10.0f} {off['tput']:>11.0f} "
                             f"{on['tput'] / off['tput']:>6.2f} {on['p95']:>7.1f} {off['p95']:>7.1f} "
                             f"{on['batch']:>6.1f}")
            self.restore(model)

    def early(self) -> None:
        """Issue 13, point 5: early dispatch on vs off vs batching off, at c = 1, 4, 16, 32, with the
        configuration that gives Triton its best here (max_batch_size 64, a 1000 us window)."""
        self.out("## Early dispatch: max_batch_size 64, max_queue_delay 1000 us; "
                 "early = early_dispatch true, wait = false, off = no dynamic_batching")
        self.out(f"{'model':<9} {'proto':<5} {'c':>3} {'mode':<5} {'infer/s':>8} {'p50':>7} {'p95':>7} "
                 f"{'p99':>7} {'batch':>6} {'early':>6} {'tput/off':>8} {'p50/off':>7}")
        plan = [("simple", "grpc"), ("simple", "http"), ("mlp_large", "grpc")]
        if not self.quick:
            plan += [("mlp", "grpc"), ("mlp", "http"), ("mlp_large", "http")]
        for model, protocol in plan:
            base = self.base[model]
            modes = {"early": variant(base, True, window_us=1000, early=True, max_batch_size=64),
                     "wait": variant(base, True, window_us=1000, early=False, max_batch_size=64),
                     "off": variant(base, False, max_batch_size=64)}
            for i, c in enumerate((1, 4, 16, 32)):
                order = list(modes) if i % 2 == 0 else list(reversed(modes))  # no mode always runs first
                results = {mode: self.measure(model, modes[mode], protocol, c) for mode in order}
                off = results["off"]
                for mode in modes:
                    r = results[mode]
                    self.out(f"{model:<9} {protocol:<5} {c:>3} {mode:<5} {fmt(r)} {r['early']:>6.0%} "
                             f"{r['tput'] / off['tput']:>8.2f} {r['p50'] / off['p50']:>7.2f}")
                e, w = results["early"], results["wait"]
                self.out(f"{'':<9} {protocol:<5} {c:>3} early/wait: throughput {e['tput'] / w['tput']:.2f}x, "
                         f"p50 {e['p50'] / w['p50']:.2f}x")
            self.restore(model)

    def sweep(self) -> dict[str, tuple[str, dict]]:
        """Fixed windows on mlp_large at c=16, early dispatch on and off; returns each protocol's best."""
        self.out("## Window sweep: mlp_large, concurrency 16 (early: early_dispatch)")
        self.out(f"{'proto':<5} {'window us':>9} {'early':<5} {'infer/s':>8} {'p50':>7} {'p95':>7} "
                 f"{'p99':>7} {'batch':>6} {'by window':>9} {'by early':>8}")
        windows = (0, 2000, 10000) if self.quick else (0, 1000, 2000, 5000, 10000, 20000)
        best: dict[str, tuple[str, dict]] = {}
        for protocol in ("grpc", "http"):
            fits = []
            for window in windows:
                for early in ((True,) if window == 0 else (True, False)):  # no window, nothing to cut short
                    r = self.measure("mlp_large", variant(self.base["mlp_large"], True, window_us=window,
                                                          early=early), protocol, 16)
                    label = f"{window} us{'' if early else ', early off'}"
                    self.out(f"{protocol:<5} {window:>9} {'on' if early else 'off':<5} {fmt(r)} "
                             f"{r['flushed']:>9.0%} {r['early']:>8.0%}")
                    if r["p95"] <= self.budget_ms:
                        fits.append((label, r))
            if fits:
                best[protocol] = max(fits, key=lambda x: x[1]["tput"])
                label, r = best[protocol]
                self.out(f"{protocol:<5} a p95 budget of {self.budget_ms:g} ms chooses {label} "
                         f"({r['tput']:.0f} infer/s, p95 {r['p95']:.1f} ms)")
            else:
                self.out(f"{protocol:<5} no window meets a p95 budget of {self.budget_ms:g} ms")
        self.restore("mlp_large")
        return best

    def slo(self, best: dict[str, tuple[str, dict]]) -> None:
        target = self.target_ms
        self.out(f"## SLO mode: mlp_large, p95_latency_target_ms={target:g}, concurrency 16, "
                 "against the best fixed window of the sweep")
        self.out(f"{'proto':<5} {'early':<5} {'infer/s':>8} {'p50':>7} {'p95':>7} {'p99':>7} {'batch':>6} "
                 f"{'by early':>8}  result")
        for protocol in ("grpc", "http"):
            for early in (True, False):  # early dispatch off: the SLO window as it was before issue 13
                config = variant(self.base["mlp_large"], True, target_ms=target, early=early)
                self.hub.load("mlp_large", config)
                run(self.hub, self.server, "mlp_large", protocol, 16, 1000)  # let the controller settle
                r = run(self.hub, self.server, "mlp_large", protocol, 16, self.interval)
                held = "held" if r["p95"] <= target else "MISSED"
                vs = ""
                if protocol in best:
                    label, b = best[protocol]
                    vs = (f", {r['tput'] / b['tput']:.2f} of the best fixed window "
                          f"({label}, {b['tput']:.0f}/s)")
                self.out(f"{protocol:<5} {'on' if early else 'off':<5} {fmt(r)} {r['early']:>8.0%}  "
                         f"target {target:g} ms {held}{vs}")
        self.restore("mlp_large")

    budget_ms = 100.0
    target_ms = 60.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="shorter windows, fewer points")
    parser.add_argument("--p95-budget-ms", type=float, default=100.0)
    parser.add_argument("--slo-target-ms", type=float, default=60.0)
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated, run in this order: {','.join(SECTIONS)} "
                             "(slo compares with sweep)")
    args = parser.parse_args()
    sections = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {','.join(SECTIONS)}")
    interval = 2000 if args.quick else 4000
    repo = ROOT / "model_repository"
    examples.build_repository(repo, ["simple", "mlp", "mlp_large"])
    server = start_server(repo, Path("/tmp/hubserve-bench-batching.log"), "--model-control-mode", "explicit",
                          "--load-model", "simple", "--load-model", "mlp", "--load-model", "mlp_large")
    bench = Bench(Hub(server.http_port), server, repo, interval, args.quick)
    bench.budget_ms, bench.target_ms = args.p95_budget_ms, args.slo_target_ms
    best: dict[str, tuple[str, dict]] = {}
    try:
        for name in SECTIONS:
            if name not in sections:
                continue
            if bench.lines:
                bench.out()
            if name == "sweep":
                best = bench.sweep()
            elif name == "slo":
                bench.slo(best)
            else:
                getattr(bench, name)()
    finally:
        server.stop()
    results_dir = ROOT / "perf" / "results"
    results_dir.mkdir(exist_ok=True)
    path = results_dir / f"batching-{time.strftime('%Y%m%d-%H%M%S')}.md"
    path.write_text(f"command: {' '.join(sys.argv)}\n\n" + "\n".join(bench.lines) + "\n")
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
