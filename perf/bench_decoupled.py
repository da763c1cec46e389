"""Issue 15's decoupled benchmark: perf_analyzer `--streaming` against the example `repeat_stream`, on
hubserve and on Triton 2.51 running the same model.py and config in its Python backend, in one run.

    bash tools/install_perf_analyzer.sh; bash perf/peers/setup_triton.sh   # once
    flock /work/probes/bench.lock .venv/bin/python perf/bench_decoupled.py [--concurrency 1,4,16]
        [--pieces 1,16] [--interval-ms 2000] [--servers hubserve,triton] [--workers 1]

`repeat_stream` (model_repository/repeat_stream) answers a request IN of n INT32 with n responses (OUT, IDX)
sent from a thread the model starts, then the final flag alone. perf_analyzer sends IN of `--pieces` zeros
(`--shape IN:n --input-data zero`, so DELAY_MS is 0: no pause) over gRPC `--streaming`, which a decoupled
model needs. Triton's copy of model.py gets two lines in front that put its peer venv's numpy on the path
(Triton's stub ignores PYTHONPATH; perf/peers/triton_model.py does the same), nothing else.

The servers run one after the other, never both at once, each on free loopback ports, from repositories
written to a temporary folder. Every cell is one perf_analyzer run at one concurrency (`--stability-percentage
100`: see STABILITY_PERCENT); perf_analyzer counts
a request once its final response came, so infer/s is requests per second and the responses per second are
n times that.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import tempfile
from pathlib import Path

from hubserve_harness import ROOT
from hubserve_harness.perf_analyzer import run_perf_analyzer
from peers import servers

MODEL = "repeat_stream"
# perf_analyzer's stability rule, looser than the harness's 50: at 16 responses per request a window's
# request count is small, and on the shared 2-core machine 50 % failed at c = 1 and 16.
STABILITY_PERCENT = 100
SITE_SHIM = '''import sys
sys.path.insert(0, {site!r})  # Triton's stub ignores PYTHONPATH: the peer venv's numpy
'''


@dataclasses.dataclass
class Row:
    server: str
    pieces: int
    concurrency: int
    throughput: float = 0.0
    p50_us: float = 0.0
    p99_us: float = 0.0
    error: str = ""


def write_repositories(tmp: Path, site: Path | None) -> dict[str, Path]:
    source = ROOT / "model_repository" / MODEL
    hub = tmp / "hubserve"
    shutil.copytree(source, hub / MODEL)
    out = {"hubserve": hub}
    if site is not None:
        tri = tmp / "triton"
        shutil.copytree(source, tri / MODEL)
        model = tri / MODEL / "1" / "model.py"
        model.write_text(SITE_SHIM.format(site=str(site.resolve())) + model.read_text())
        out["triton"] = tri
    return out


def server_kind(name: str, repository: Path, workers: int) -> servers.ServerKind:
    if name == "hubserve":
        return dataclasses.replace(servers.HUBSERVE, command=lambda p, models: [
            str(ROOT / ".venv/bin/python"), "-m", "engine", "serve", "--model-repository", str(repository),
            "--host", "127.0.0.1", "--http-port", str(p.http), "--grpc-port", str(p.grpc),
            "--metrics-port", str(p.metrics), "--workers", str(workers)])
    return dataclasses.replace(servers.TRITON, command=lambda p, models: [
        str(servers.PEERS_DIR / "triton/bin/tritonserver"), "--model-repository", str(repository),
        "--backend-directory", str(servers.PEERS_DIR / "triton/backends"),
        "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
        "--http-port", str(p.http), "--grpc-port", str(p.grpc), "--metrics-port", str(p.metrics)])


def measure(server: servers.RunningServer, plan: list[Row], interval_ms: int, commands: list[str]) -> None:
    for row in plan:
        result = run_perf_analyzer(MODEL, server.url("grpc"), "grpc", "--streaming",
                                   "--concurrency-range", str(row.concurrency), "--shape", f"IN:{row.pieces}",
                                   "--measurement-interval", str(interval_ms), "--input-data", "zero",
                                   "--percentile", "99", "--stability-percentage", str(STABILITY_PERCENT),
                                   timeout_s=240)
        if not commands:
            commands.append(" ".join(Path(c).name if c.startswith("/") else c for c in result.command))
        if not result.ok:
            row.error = f"perf_analyzer exit {result.returncode}: {result.output.strip().splitlines()[-1:]}"
            print(result.output, file=sys.stderr)
            continue
        csv = result.csv_rows[0]
        row.throughput = result.throughput
        row.p50_us, row.p99_us = float(csv.get("p50 latency", 0)), float(csv.get("p99 latency", 0))
        print(f"{row.server} n={row.pieces} c={row.concurrency}: {row.throughput:.0f} req/s", flush=True)


def report(rows: list[Row], args: argparse.Namespace, commands: list[str], versions: dict[str, str]) -> str:
    def get(server: str, n: int, c: int) -> Row | None:
        return next((r for r in rows if (r.server, r.pieces, r.concurrency) == (server, n, c)), None)

    def cell(r: Row | None) -> str:
        if r is None:
            return "—"
        if r.error:
            return f"error: {r.error}"
        return f"{r.throughput:,.0f} = {r.throughput * r.pieces:,.0f} ({r.p50_us / 1000:.2f} / " \
               f"{r.p99_us / 1000:.2f} ms)"

    def ratio(a: Row | None, b: Row | None) -> str:
        ok = a is not None and b is not None and a.throughput and b.throughput
        return f"{a.throughput / b.throughput:.2f}×" if ok else "—"  # type: ignore[union-attr]

    out = [f"Command: `flock /work/probes/bench.lock .venv/bin/python perf/bench_decoupled.py --concurrency "
           f"{args.concurrency} --pieces {args.pieces} --interval-ms {args.interval_ms} --servers "
           f"{args.servers} --workers {args.workers}`",
           f"Servers: {', '.join(f'{k} {v}' for k, v in versions.items())}. Cells: requests/s = responses/s "
           "(p50 / p99 latency of a whole request).", "",
           "| responses per request | c | hubserve | Triton 2.51 | hubserve / Triton |",
           "|---|---|---|---|---|"]
    for n in [int(x) for x in args.pieces.split(",")]:
        for c in [int(x) for x in args.concurrency.split(",")]:
            hub, tri = get("hubserve", n, c), get("triton", n, c)
            out.append(f"| {n} | {c} | {cell(hub)} | {cell(tri)} | {ratio(hub, tri)} |")
    if commands:
        out += ["", f"perf_analyzer (first run; -u, --shape and the last --concurrency-range vary): "
                    f"`{commands[0]}`"]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--pieces", default="1,16")
    parser.add_argument("--interval-ms", type=int, default=2000)
    parser.add_argument("--servers", default="hubserve,triton")
    parser.add_argument("--workers", type=int, default=1, help="hubserve's --workers")
    args = parser.parse_args()
    names = args.servers.split(",")
    if missing := servers.missing_for_bench(names):
        print(missing, file=sys.stderr)
        return 2
    rows: list[Row] = []
    commands: list[str] = []
    versions: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench_decoupled.") as tmp:
        site = next((servers.PEERS_DIR / "triton/lib").glob("python3.*/site-packages")) \
            if "triton" in names else None
        repositories = write_repositories(Path(tmp), site)
        for name in names:
            plan = [Row(name, n, c) for n in (int(x) for x in args.pieces.split(","))
                    for c in (int(x) for x in args.concurrency.split(","))]
            server = servers.start(server_kind(name, repositories[name], args.workers), [MODEL], Path(tmp))
            versions[name] = server.version
            try:
                measure(server, plan, args.interval_ms, commands)
            finally:
                server.stop()
            rows += plan
    print(report(rows, args, commands, versions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
