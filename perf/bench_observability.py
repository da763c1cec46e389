"""What access lines, latency histograms and tracing cost on the hot path (issue 16 items 6 and 8): `simple`
over gRPC at c=16 with the real perf_analyzer, one server per configuration, all started at once and
measured in turn, round after round (the machine is shared: the rounds show the drift, the medians
damp it).

    bash tools/install_perf_analyzer.sh   # once
    flock /work/probes/bench.lock .venv/bin/python perf/bench_observability.py [--concurrency 16]
        [--interval-ms 3000] [--rounds 4]

Configurations (every one single-process, `--workers 1`):
- `off`: histograms off (`--metrics-config histogram_latencies=false`), no access lines, no tracing (the
  floor);
- `histograms`: the default (histograms on), nothing else;
- `access`: histograms off, `--log-verbose 1 --log-format json --log-file <tmp>`: a JSON line per inference,
  with a generated request id for each (perf_analyzer sends none over gRPC unless --async);
- `trace-1000` / `trace-1`: histograms off, `--trace-config level=TIMESTAMPS` at rate 1000 and rate 1, the
  spans going to a collector in this process (aiohttp on a free port, answering 200 at once);
- `all`: histograms, access lines and tracing at rate 1000.

The report (markdown on stdout) gives inferences per second per configuration and round, each one's ratio
to `off` in the same round, and the median over the rounds with its ratio to `off`'s median.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
from pathlib import Path

from aiohttp import web

from hubserve_harness import ROOT, free_port, start_server
from hubserve_harness.perf_analyzer import perf_analyzer_available, run_perf_analyzer
from hubserve_models import examples


class Collector:
    """An OTLP/HTTP endpoint that takes every POST to /v1/traces and counts its bytes, in its own thread."""

    def __init__(self) -> None:
        self.port = free_port()
        self.bytes = 0
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)

            async def traces(request: web.Request) -> web.Response:
                self.bytes += len(await request.read())
                return web.Response(status=200, content_type="application/json", text="{}")

            app = web.Application(client_max_size=64 << 20)
            app.router.add_post("/v1/traces", traces)
            runner = web.AppRunner(app)
            self._loop.run_until_complete(runner.setup())
            self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
            ready.set()
            self._loop.run_forever()

        threading.Thread(target=run, daemon=True).start()
        assert ready.wait(10)


def configurations(tmp: Path, collector: Collector) -> dict[str, tuple[str, ...]]:
    no_hist = ("--metrics-config", "histogram_latencies=false")
    url = ("--trace-config", f"opentelemetry,url=127.0.0.1:{collector.port}")
    access = ("--log-verbose", "1", "--log-format", "json")
    return {
        "off": no_hist,
        "histograms": (),
        "access": (*no_hist, *access, "--log-file", str(tmp / "access.log")),
        "trace-1000": (*no_hist, *url, "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1000"),
        "trace-1": (*no_hist, *url, "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1"),
        "all": (*access, "--log-file", str(tmp / "access-all.log"), *url, "--trace-config",
                "level=TIMESTAMPS", "--trace-config", "rate=1000"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--interval-ms", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    if not perf_analyzer_available():
        print("perf_analyzer is missing: bash tools/install_perf_analyzer.sh", file=sys.stderr)
        return 2
    collector = Collector()
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_observability.") as tmp_name:
        tmp = Path(tmp_name)
        root = tmp / "repository"
        examples.build_repository(root, ["simple"])
        config = (ROOT / "model_repository" / "simple" / "config.pbtxt").read_text()
        (root / "simple" / "config.pbtxt").write_text(config)
        servers = {}
        try:
            for name, extra in configurations(tmp, collector).items():
                servers[name] = start_server(root, tmp / f"{name}.log", "--workers", "1",
                                             "--model-control-mode", "none", *extra)
            for _ in range(args.rounds):
                for name, server in servers.items():
                    result = run_perf_analyzer("simple", server.grpc_url, "grpc", "--concurrency-range",
                                               str(args.concurrency), "--measurement-interval",
                                               str(args.interval_ms), timeout_s=180)
                    results.setdefault(name, []).append(result.throughput if result.ok else float("nan"))
                    print(f"{name}: {result.throughput:.0f} infer/s (exit {result.returncode})",
                          file=sys.stderr)
        finally:
            for server in servers.values():
                server.stop()
    command = " ".join(["flock /work/probes/bench.lock .venv/bin/python perf/bench_observability.py",
                        *sys.argv[1:]])
    rounds = range(args.rounds)
    print(f"Command: `{command}` (perf_analyzer `-i grpc --concurrency-range {args.concurrency} "
          f"--measurement-interval {args.interval_ms}`, `simple`)\n")
    header = " | ".join(f"round {r + 1}" for r in rounds)
    print(f"| configuration | {header} | median infer/s | vs off |")
    print("|---|" + "---:|" * args.rounds + "---:|---:|")
    base = statistics.median(results["off"])
    for name, values in results.items():
        cells = [f"{v:,.0f} ({v / results['off'][r]:.2f})" for r, v in enumerate(values)]
        median = statistics.median(values)
        print(f"| `{name}` | " + " | ".join(cells) + f" | {median:,.0f} | {median / base:.2f} |")
    print("\nEach round cell: infer/s (its ratio to `off` in the same round). A failed run counts as nan.")
    print(f"\nThe collector received {collector.bytes / 1e6:.1f} MB of OTLP JSON.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
