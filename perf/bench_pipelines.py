"""Issue 14's benchmarks in one run, beside Triton 2.51's Python backend, with the real perf_analyzer:
(a) the cost of a Python-model hop and (b) an ensemble against its slowest step.

    bash tools/install_perf_analyzer.sh; bash perf/peers/setup_triton.sh   # once
    flock /work/probes/bench.lock .venv/bin/python perf/bench_pipelines.py [--protocol grpc]
        [--hop-concurrency 1,4,16] [--concurrency 16] [--interval-ms 2000] [--servers hubserve,triton]

(a) `add_sub_py` is an add/sub in a Triton Python model (`ADD_SUB_PY` below: OUTPUT0 = INPUT0 + INPUT1,
OUTPUT1 = INPUT0 - INPUT1, INT32 [16], `simple`'s config with `backend: "python"`), measured against the
ONNX `simple` on hubserve, and the same model.py and config on Triton.
(b) the ensemble benchmarks' pipeline (hubserve_harness `build_pipeline_repository`): `prep` (ONNX Identity,
FP32 [1024]) -> `mlp_large` (the compute-bound example MLP), against `mlp_large` alone, on hubserve and on
Triton, where the two steps are Python-backend models running the same ONNX files (perf/peers/triton_model.py:
Triton here has no ONNX Runtime backend) and the ensemble config is the same file.

The servers run one after the other (never both at once), each on its own free loopback ports, from
repositories written to a temporary folder. Every measurement is one perf_analyzer run at one concurrency,
`--input-data zero`; the report is markdown, with every command.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

from hubserve_harness import ROOT, build_pipeline_repository
from hubserve_harness.perf_analyzer import perf_analyzer_available, run_perf_analyzer
from peers import repos, servers

ADD_SUB_PY = '''"""add/sub, a Triton Python model: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""
import sys
from pathlib import Path

_SITE = Path(__file__).with_name("site-packages.txt")
if _SITE.exists():  # Triton's stub ignores PYTHONPATH: its peer venv's numpy (perf/peers/triton_model.py)
    sys.path.insert(0, _SITE.read_text().strip())

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", (a + b).astype(np.int32)),
                pb_utils.Tensor("OUTPUT1", (a - b).astype(np.int32))]))
        return responses
'''


@dataclasses.dataclass
class Row:
    server: str
    part: str  # "hop" or "ensemble"
    model: str
    concurrency: int
    throughput: float = 0.0
    p50_us: float = 0.0
    p99_us: float = 0.0
    error: str = ""


def write_hubserve(root: Path) -> None:
    build_pipeline_repository(root)  # prep, mlp_large, pipeline
    (root / "simple").mkdir(parents=True)
    simple_config = (ROOT / "model_repository" / "simple" / "config.pbtxt").read_text()
    (root / "simple" / "config.pbtxt").write_text(simple_config)
    from hubserve_models import examples

    examples.build_repository(root, ["simple"])
    (root / "add_sub_py" / "1").mkdir(parents=True)
    (root / "add_sub_py" / "1" / "model.py").write_text(ADD_SUB_PY)
    (root / "add_sub_py" / "config.pbtxt").write_text(add_sub_config(simple_config))


def add_sub_config(simple_config: str) -> str:
    return simple_config.replace('name: "simple"', 'name: "add_sub_py"').replace(
        'platform: "onnxruntime_onnx"', 'backend: "python"')


def write_triton(hubserve_root: Path, root: Path, site: Path) -> None:
    """The same models for Triton: ONNX steps as Python-backend models (repos.write_triton_repo), the same
    add_sub model.py and ensemble config."""
    served = [repos.served_model(hubserve_root, name) for name in ("prep", "mlp_large")]
    repos.write_triton_repo(served, root, site)
    for name in ("add_sub_py", "pipeline"):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_bytes((hubserve_root / name / "config.pbtxt").read_bytes())
    (root / "add_sub_py" / "1" / "model.py").write_text(ADD_SUB_PY)
    (root / "add_sub_py" / "1" / "site-packages.txt").write_text(f"{site.resolve()}\n")


def server_kind(name: str, repository: Path) -> servers.ServerKind:
    if name == "hubserve":
        return dataclasses.replace(servers.HUBSERVE, command=lambda p, models: [
            str(ROOT / ".venv/bin/python"), "-m", "engine", "serve", "--model-repository", str(repository),
            "--host", "127.0.0.1", "--http-port", str(p.http), "--grpc-port", str(p.grpc),
            "--metrics-port", str(p.metrics)])
    return dataclasses.replace(servers.TRITON, command=lambda p, models: [
        str(servers.PEERS_DIR / "triton/bin/tritonserver"), "--model-repository", str(repository),
        "--backend-directory", str(servers.PEERS_DIR / "triton/backends"),
        "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
        "--http-port", str(p.http), "--grpc-port", str(p.grpc), "--metrics-port", str(p.metrics)])


def measure(server: servers.RunningServer, protocol: str, plan: list[Row], interval_ms: int,
            commands: list[str]) -> None:
    for row in plan:
        result = run_perf_analyzer(row.model, server.url(protocol), protocol,
                                   "--concurrency-range", str(row.concurrency),
                                   "--measurement-interval", str(interval_ms), "--input-data", "zero",
                                   "--percentile", "99", timeout_s=240)
        if not commands:
            commands.append(" ".join(Path(c).name if c.startswith("/") else c for c in result.command))
        if not result.ok:
            row.error = f"perf_analyzer exit {result.returncode}: {result.output.strip().splitlines()[-1:]}"
            print(result.output, file=sys.stderr)
            continue
        csv = result.csv_rows[0]
        row.throughput = result.throughput
        row.p50_us, row.p99_us = float(csv.get("p50 latency", 0)), float(csv.get("p99 latency", 0))
        print(f"{row.server} {row.model} c={row.concurrency}: {row.throughput:.0f} infer/s", flush=True)


def plan_for(server: str, hop: list[int], concurrency: int) -> list[Row]:
    hop_models = ["simple", "add_sub_py"] if server == "hubserve" else ["add_sub_py"]
    rows = [Row(server, "hop", m, c) for c in hop for m in hop_models]
    return rows + [Row(server, "ensemble", m, concurrency) for m in ("mlp_large", "pipeline")]


def report(rows: list[Row], args: argparse.Namespace, commands: list[str], versions: dict[str, str]) -> str:
    def get(server: str, model: str, c: int) -> Row | None:
        return next((r for r in rows if (r.server, r.model, r.concurrency) == (server, model, c)), None)

    def cell(r: Row | None) -> str:
        if r is None:
            return "—"
        return f"error: {r.error}" if r.error else f"{r.throughput:,.0f} ({r.p50_us / 1000:.2f} / " \
                                                    f"{r.p99_us / 1000:.2f} ms)"

    def ratio(a: Row | None, b: Row | None) -> str:
        ok = a is not None and b is not None and a.throughput and b.throughput
        return f"{a.throughput / b.throughput:.1%}" if ok else "—"  # type: ignore[union-attr]

    out = [f"Command: `flock /work/probes/bench.lock .venv/bin/python perf/bench_pipelines.py --protocol "
           f"{args.protocol} --hop-concurrency {args.hop_concurrency} --concurrency {args.concurrency} "
           f"--interval-ms {args.interval_ms} --servers {args.servers}`",
           f"Servers: {', '.join(f'{k} {v}' for k, v in versions.items())}. Cells: infer/s (p50 / p99).", "",
           f"(a) Python-model hop, {args.protocol}", "",
           "| c | hubserve simple (ONNX) | hubserve add_sub_py | add_sub_py / simple | Triton add_sub_py | "
           "hubserve / Triton (add_sub_py) |", "|---|---|---|---|---|---|"]
    for c in [int(x) for x in args.hop_concurrency.split(",")]:
        onnx, py, tri = get("hubserve", "simple", c), get("hubserve", "add_sub_py", c), \
            get("triton", "add_sub_py", c)
        out.append(f"| {c} | {cell(onnx)} | {cell(py)} | {ratio(py, onnx)} | {cell(tri)} "
                   f"| {ratio(py, tri)} |")
    c = args.concurrency
    out += ["", f"(b) Ensemble against its slowest step, {args.protocol}, c = {c}", "",
            "| server | mlp_large | pipeline (prep → mlp_large) | pipeline / mlp_large |",
            "|---|---|---|---|"]
    for server in args.servers.split(","):
        step, pipe = get(server, "mlp_large", c), get(server, "pipeline", c)
        out.append(f"| {server} | {cell(step)} | {cell(pipe)} | {ratio(pipe, step)} |")
    out += ["", f"hubserve pipeline / Triton pipeline: "
            f"{ratio(get('hubserve', 'pipeline', c), get('triton', 'pipeline', c))}", "",
            f"perf_analyzer (first run; -m, -u and the last --concurrency-range vary): `{commands[0]}`"
            if commands else ""]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--protocol", default="grpc", choices=("grpc", "http"))
    parser.add_argument("--hop-concurrency", default="1,4,16")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--interval-ms", type=int, default=2000)
    parser.add_argument("--servers", default="hubserve,triton")
    args = parser.parse_args()
    if not perf_analyzer_available():
        print("perf_analyzer is missing: bash tools/install_perf_analyzer.sh", file=sys.stderr)
        return 2
    names = args.servers.split(",")
    if "triton" in names and (missing := servers.TRITON.missing()):
        print(missing, file=sys.stderr)
        return 2
    hop = [int(x) for x in args.hop_concurrency.split(",")]
    rows: list[Row] = []
    commands: list[str] = []
    versions: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench_pipelines.") as tmp:
        repositories = {"hubserve": Path(tmp) / "hubserve", "triton": Path(tmp) / "triton"}
        write_hubserve(repositories["hubserve"])
        if "triton" in names:
            site = next((servers.PEERS_DIR / "triton/lib").glob("python3.*/site-packages"))
            write_triton(repositories["hubserve"], repositories["triton"], site)
        for name in names:
            plan = plan_for(name, hop, args.concurrency)
            server = servers.start(server_kind(name, repositories[name]),
                                   sorted({r.model for r in plan}), Path(tmp))
            versions[name] = server.version
            try:
                measure(server, args.protocol, plan, args.interval_ms, commands)
            finally:
                server.stop()
            rows += plan
    print(report(rows, args, commands, versions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
