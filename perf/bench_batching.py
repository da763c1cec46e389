"""Dynamic batching, measured: on vs off, vs in-process ONNX Runtime, a window sweep, and the SLO mode.

One hubserve (explicit model control) serves the example models; between runs the repository load API
reloads a model with a config override (batching off, another window, a p95 target). NVIDIA's real
perf_analyzer drives every run. Everything is printed side by side from this one run.

    .venv/bin/python perf/bench_batching.py [--quick] [--p95-budget-ms 100] [--slo-target-ms 60]
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from pathlib import Path

from bench_serving import ceiling  # perf/, this script's folder
from engine import examples
from hubserve_harness import ROOT, start_server
from hubserve_harness.perf_analyzer import run_perf_analyzer


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


def variant(base: dict, batching: bool, window_us: int | None = None, target_ms: float | None = None) -> dict:
    cfg = {k: v for k, v in base.items() if k not in ("dynamic_batching",)}
    params = {k: v for k, v in cfg.get("parameters", {}).items() if k != "p95_latency_target_ms"}
    if batching:
        db = dict(base.get("dynamic_batching") or {})
        if window_us is not None:
            db["max_queue_delay_microseconds"] = window_us
        cfg["dynamic_batching"] = db
    if target_ms is not None:
        params["p95_latency_target_ms"] = {"string_value": str(target_ms)}
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
    by_window = reasons_after.get("window", 0) - reasons_before.get("window", 0)
    return {"tput": res.throughput, "p50": float(row["p50 latency"]) / 1e3,
            "p95": float(row["p95 latency"]) / 1e3, "p99": float(row["p99 latency"]) / 1e3,
            "batch": infers / execs if execs else 0.0,
            "flushed": by_window / execs if execs else 0.0}


def fmt(r: dict) -> str:
    return (f"{r['tput']:>8.0f} {r['p50']:>7.1f} {r['p95']:>7.1f} {r['p99']:>7.1f} {r['batch']:>6.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="shorter windows, fewer points")
    parser.add_argument("--p95-budget-ms", type=float, default=100.0)
    parser.add_argument("--slo-target-ms", type=float, default=60.0)
    args = parser.parse_args()
    interval = 2000 if args.quick else 4000
    repo = ROOT / "model_repository"
    examples.build_repository(repo, ["simple", "mlp", "mlp_large"])
    server = start_server(repo, Path("/tmp/hubserve-bench-batching.log"), "--model-control-mode", "explicit",
                          "--load-model", "simple", "--load-model", "mlp", "--load-model", "mlp_large")
    hub = Hub(server.http_port)
    lines: list[str] = []

    def out(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    try:
        base = {m: hub.config(m) for m in ("simple", "mlp", "mlp_large")}
        out("## Compute-bound mlp_large at concurrency 16: dynamic batching on vs off")
        out(f"{'proto':<5} {'mode':<4} {'infer/s':>8} {'p50':>7} {'p95':>7} {'p99':>7} {'batch':>6} "
            f"{'ceiling':>8} {'vs ceil':>7}")
        for protocol in ("grpc", "http"):
            results = {}
            for on in (True, False):
                hub.load("mlp_large", variant(base["mlp_large"], on))
                results[on] = run(hub, server, "mlp_large", protocol, 16, interval)
            ceil = ceiling(repo / "mlp_large/1/model.onnx", "mlp_large",
                           max(1, round(results[True]["batch"])))
            for on in (True, False):
                r = results[on]
                ceil_on = ceil if on else ceiling(repo / "mlp_large/1/model.onnx", "mlp_large", 1)
                out(f"{protocol:<5} {'on' if on else 'off':<4} {fmt(r)} {ceil_on:>8.0f} "
                    f"{r['tput'] / ceil_on:>7.2f}")
            out(f"{protocol:<5} on/off throughput {results[True]['tput'] / results[False]['tput']:.2f}x, "
                f"p95 {results[True]['p95']:.1f} vs {results[False]['p95']:.1f} ms")
        hub.load("mlp_large", base["mlp_large"])

        out()
        out("## simple and mlp: batching on vs off")
        out(f"{'model':<7} {'proto':<5} {'conc':>4} {'on infer/s':>10} {'off infer/s':>11} {'ratio':>6} "
            f"{'on p95':>7} {'off p95':>7} {'batch':>6}")
        for model in ("simple", "mlp"):
            for protocol in ("grpc", "http"):
                for c in ((32,) if args.quick else (16, 32)):
                    hub.load(model, variant(base[model], True))
                    on = run(hub, server, model, protocol, c, interval)
                    hub.load(model, variant(base[model], False))
                    off = run(hub, server, model, protocol, c, interval)
                    out(f"{model:<7} {protocol:<5} {c:>4} {on['tput']:>10.0f} {off['tput']:>11.0f} "
                        f"{on['tput'] / off['tput']:>6.2f} {on['p95']:>7.1f} {off['p95']:>7.1f} "
                        f"{on['batch']:>6.1f}")
            hub.load(model, base[model])

        out()
        out("## Window sweep: mlp_large, HTTP, concurrency 16")
        out(f"{'window us':>9} {'infer/s':>8} {'p50':>7} {'p95':>7} {'p99':>7} {'batch':>6} {'by window':>9}")
        sweep = []
        for window in ((0, 2000, 10000) if args.quick else (0, 1000, 2000, 5000, 10000, 20000)):
            hub.load("mlp_large", variant(base["mlp_large"], True, window_us=window))
            r = run(hub, server, "mlp_large", "http", 16, interval)
            sweep.append((window, r))
            out(f"{window:>9} {fmt(r)} {r['flushed']:>9.0%}")
        fits = [(w, r) for w, r in sweep if r["p95"] <= args.p95_budget_ms]
        if fits:
            w, r = max(fits, key=lambda x: x[1]["tput"])
            out(f"a p95 budget of {args.p95_budget_ms:g} ms chooses a window of {w} us "
                f"({r['tput']:.0f} infer/s, p95 {r['p95']:.1f} ms)")
        else:
            out(f"no window meets a p95 budget of {args.p95_budget_ms:g} ms")

        out()
        out(f"## SLO mode: mlp_large, p95_latency_target_ms={args.slo_target_ms:g}, concurrency 16")
        hub.load("mlp_large", variant(base["mlp_large"], True, target_ms=args.slo_target_ms))
        for protocol in ("grpc", "http"):
            run(hub, server, "mlp_large", protocol, 16, 1000)  # let the controller settle
            r = run(hub, server, "mlp_large", protocol, 16, interval)
            out(f"{protocol:<5} {fmt(r)}  target {args.slo_target_ms:g} ms: "
                f"{'held' if r['p95'] <= args.slo_target_ms else 'MISSED'}")
        hub.load("mlp_large", base["mlp_large"])
    finally:
        server.stop()
    results_dir = ROOT / "perf" / "results"
    results_dir.mkdir(exist_ok=True)
    path = results_dir / f"batching-{time.strftime('%Y%m%d-%H%M%S')}.md"
    path.write_text("\n".join(lines) + "\n")
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
