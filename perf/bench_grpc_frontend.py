"""The two gRPC frontends side by side: `--grpc-frontend grpcio` (grpc.aio) vs `h2` (engine/frontend/h2/).

For each frontend, in alternation (`--repeat` rounds), a fresh hubserve serves `model_repository/` and NVIDIA's
real perf_analyzer drives `simple` over gRPC:

    .tools/bin/perf_analyzer -m simple -u 127.0.0.1:<grpc port> -i grpc --concurrency-range 32
                             --measurement-interval 3000 -s 50

Server CPU per inference = (utime + stime of the server process, from /proc/<pid>/stat, after - before) /
(success count after - before, from GET /v2/models/simple/stats). The deltas span the whole perf_analyzer run
(its start-up calls and every window), so the few non-inference RPCs are included. The cores are shared with
perf_analyzer and whatever else runs on the machine: compare within one run.

    .venv/bin/python perf/bench_grpc_frontend.py [--repeat 2] [--concurrency 32] [--interval-ms 3000]
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.request
from pathlib import Path

from hubserve_harness import ROOT, start_server
from hubserve_harness.perf_analyzer import run_perf_analyzer


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (proc(5))


def successes(http_port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/simple/stats", timeout=10) as r:
        return int(json.load(r)["model_stats"][0]["inference_stats"]["success"]["count"])


def measure(frontend: str, concurrency: str, interval_ms: int) -> tuple[float, float, str]:
    server = start_server(ROOT / "model_repository", Path(f"/tmp/hubserve-bench-{frontend}.log"),
                          "--grpc-frontend", frontend, "--model-control-mode", "none", "--no-strict-readiness")
    try:
        cpu0, n0 = cpu_seconds(server.process.pid), successes(server.http_port)
        result = run_perf_analyzer("simple", server.grpc_url, "grpc", "--concurrency-range", concurrency,
                                   "--measurement-interval", str(interval_ms), "-s", "50", timeout_s=300)
        cpu1, n1 = cpu_seconds(server.process.pid), successes(server.http_port)
    finally:
        server.stop()
    if not result.ok:
        return 0.0, 0.0, f"perf_analyzer exited {result.returncode}"
    return result.throughput, (cpu1 - cpu0) / max(n1 - n0, 1) * 1e6, ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--concurrency", default="32")
    parser.add_argument("--interval-ms", type=int, default=3000)
    args = parser.parse_args()
    print(f"{'frontend':<8} {'round':>5} {'infer/s':>10} {'server CPU µs/infer':>20}")
    for round_ in range(1, args.repeat + 1):
        for frontend in ("grpcio", "h2"):
            throughput, cpu_us, error = measure(frontend, args.concurrency, args.interval_ms)
            print(f"{frontend:<8} {round_:>5} {throughput:>10.0f} {cpu_us:>20.1f} {error}", flush=True)


if __name__ == "__main__":
    main()
