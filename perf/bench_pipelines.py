"""Issue 14's benchmarks in one run, beside Triton 2.51's Python backend, with the real perf_analyzer:
(a) the cost of a Python-model hop and (b) an ensemble against its slowest step.

    bash tools/install_perf_analyzer.sh; bash perf/peers/setup_triton.sh   # once
    flock /work/probes/bench.lock .venv/bin/python perf/bench_pipelines.py [--protocol grpc,http]
        [--hop-concurrency 1,4,16] [--concurrency 16] [--interval-ms 2000] [--servers hubserve,triton]
        [--parts hop,ensemble] [--rounds 1] [--baseline-tree /tmp/before]

(a) `add_sub_py` is an add/sub in a Triton Python model (`ADD_SUB_PY` below: OUTPUT0 = INPUT0 + INPUT1,
OUTPUT1 = INPUT0 - INPUT1, INT32 [16], `simple`'s config with `backend: "python"`), measured against the
ONNX `simple` on hubserve, and the same model.py and config on Triton.
(b) the ensemble benchmarks' pipeline (hubserve_harness `build_pipeline_repository`): `prep` (ONNX Identity,
FP32 [1024]) -> `mlp_large` (the compute-bound example MLP), against `mlp_large` alone, on hubserve and on
Triton, where the two steps are Python-backend models running the same ONNX files (perf/peers/triton_model.py:
Triton here has no ONNX Runtime backend) and the ensemble config is the same file.

`--protocol grpc,http` measures both protocols in one run (each server started once a round, every point over
gRPC then over HTTP), with a table per protocol and, for the hop, whether issue 32's Python-model goal (≥ 1.0
× Triton at every hop concurrency, both protocols) holds in the run.

The servers run one after the other (never two at once), each on its own free loopback ports, from
repositories written to a temporary folder; `--rounds N` runs the whole sequence N times (servers interleaved,
the order reversed every other round, so drift hits all) and reports each point's median round.
`--baseline-tree` serves another checkout's `engine/` (e.g. `git worktree add /tmp/before HEAD~3`) as
`hubserve@<folder>` right after hubserve, on the same repository: before and after in one run. Every
measurement is one perf_analyzer run at one concurrency, `--input-data zero`, with the server's CPU time
(every process of it, the Python models' instances included) per inference its own counters saw; the report is
markdown, with every command.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

from hubserve_harness import ROOT, build_pipeline_repository
from hubserve_harness.perf_analyzer import run_perf_analyzer
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
    protocol: str = "grpc"
    throughput: float = 0.0
    p50_us: float = 0.0
    p99_us: float = 0.0
    cpu_us: float = 0.0  # server CPU (all its processes) per inference
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


def write_repositories(tmp: Path, names: list[str]) -> dict[str, Path]:
    """hubserve's repository under `tmp`, and Triton's beside it when `names` has "triton"; by server."""
    repositories = {"hubserve": tmp / "hubserve", "triton": tmp / "triton"}
    write_hubserve(repositories["hubserve"])
    if "triton" in names:
        site = next((servers.PEERS_DIR / "triton/lib").glob("python3.*/site-packages"))
        write_triton(repositories["hubserve"], repositories["triton"], site)
    return repositories


def server_kind(name: str, repository: Path, baseline: Path | None = None) -> servers.ServerKind:
    if name.startswith("hubserve"):
        def serve(p: servers.Ports) -> list[str]:
            return ["--model-repository", str(repository), "--host", "127.0.0.1", "--http-port", str(p.http),
                    "--grpc-port", str(p.grpc), "--metrics-port", str(p.metrics)]
        if name != "hubserve" and baseline is not None:  # hubserve@<folder>: the other tree's engine/
            kind = servers.hubserve_from(baseline)
            boot = kind.command(servers.Ports(0, 0, 0), [])[:3]
            return dataclasses.replace(kind, command=lambda p, models: [*boot, "serve", *serve(p)])
        return dataclasses.replace(servers.HUBSERVE, command=lambda p, models: [
            str(ROOT / ".venv/bin/python"), "-m", "engine", "serve", *serve(p)])
    return dataclasses.replace(servers.TRITON, command=lambda p, models: [
        str(servers.PEERS_DIR / "triton/bin/tritonserver"), "--model-repository", str(repository),
        "--backend-directory", str(servers.PEERS_DIR / "triton/backends"),
        "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1",
        "--http-port", str(p.http), "--grpc-port", str(p.grpc), "--metrics-port", str(p.metrics)])


def measure(server: servers.RunningServer, plan: list[Row], args: argparse.Namespace,
            commands: list[str]) -> None:
    for row in plan:
        cpu0, n0 = server.cpu_s(), server.inferences(row.model)
        result = run_perf_analyzer(row.model, server.url(row.protocol), row.protocol,
                                   "--concurrency-range", str(row.concurrency),
                                   "--measurement-interval", str(args.interval_ms), "--input-data", "zero",
                                   "--stability-percentage", str(args.stability), "--percentile", "99",
                                   timeout_s=240)
        if not commands:
            commands.append(" ".join(Path(c).name if c.startswith("/") else c for c in result.command))
        if not result.ok:
            row.error = f"perf_analyzer exit {result.returncode}: {result.output.strip().splitlines()[-1:]}"
            print(result.output, file=sys.stderr)
            continue
        csv = result.csv_rows[0]
        inferences = server.inferences(row.model) - n0
        row.cpu_us = (server.cpu_s() - cpu0) * 1e6 / inferences if inferences else 0.0
        row.throughput = result.throughput
        row.p50_us, row.p99_us = float(csv.get("p50 latency", 0)), float(csv.get("p99 latency", 0))
        print(f"{row.server} {row.protocol} {row.model} c={row.concurrency}: {row.throughput:.0f} infer/s, "
              f"{row.cpu_us:.0f} µs CPU/infer", flush=True)


def plan_for(server: str, hop: list[int], concurrency: int, parts: list[str], protocol: str) -> list[Row]:
    hop_models = ["simple", "add_sub_py"] if server == "hubserve" else ["add_sub_py"]
    rows = [Row(server, "hop", m, c, protocol) for c in hop for m in hop_models] if "hop" in parts else []
    if "ensemble" in parts:
        rows += [Row(server, "ensemble", m, concurrency, protocol) for m in ("mlp_large", "pipeline")]
    return rows


def median_rounds(rounds: list[list[Row]]) -> list[Row]:
    """Each point's median round by throughput (the upper of the middle two for an even count: of two
    rounds, the better; a failed round counts as 0)."""
    out = []
    for same in zip(*rounds, strict=True):
        ranked = sorted(same, key=lambda r: r.throughput)
        out.append(ranked[len(ranked) // 2])
    return out


def find(rows: list[Row], server: str, model: str, c: int, protocol: str) -> Row | None:
    key = (server, model, c, protocol)
    return next((r for r in rows if (r.server, r.model, r.concurrency, r.protocol) == key), None)


def report(rows: list[Row], args: argparse.Namespace, commands: list[str], versions: dict[str, str],
           load: tuple[float, ...]) -> str:
    protocols = args.protocol.split(",")

    def cell(r: Row | None) -> str:
        if r is None:
            return "—"
        return f"error: {r.error}" if r.error else f"{r.throughput:,.0f} ({r.p50_us / 1000:.2f} / " \
                                                    f"{r.p99_us / 1000:.2f} ms, {r.cpu_us:.0f} µs)"

    def ratio(a: Row | None, b: Row | None) -> str:
        ok = a is not None and b is not None and a.throughput and b.throughput
        return f"{a.throughput / b.throughput:.1%}" if ok else "—"  # type: ignore[union-attr]

    baseline = next((n for n in versions if n.startswith("hubserve@")), "")
    extra = f" --baseline-tree {args.baseline_tree}" if args.baseline_tree else ""
    out = [f"Command: `flock /work/probes/bench.lock .venv/bin/python perf/bench_pipelines.py --protocol "
           f"{args.protocol} --hop-concurrency {args.hop_concurrency} --concurrency {args.concurrency} "
           f"--interval-ms {args.interval_ms} --stability {args.stability} --servers {args.servers} "
           f"--parts {args.parts} "
           f"--rounds {args.rounds}{extra}`",
           f"Servers: {', '.join(f'{k} {v}' for k, v in versions.items())}. Load average before / after: "
           f"{load[0]:.2f} / {load[1]:.2f}. Cells: infer/s (p50 / p99, server CPU µs per inference)"
           + (f", the median of {args.rounds} interleaved rounds (of an even count, the upper middle)."
              if args.rounds > 1 else "."), ""]
    hops = [int(x) for x in args.hop_concurrency.split(",")]
    for protocol in protocols:
        def at(server: str, model: str, c: int, protocol: str = protocol) -> Row | None:
            return find(rows, server, model, c, protocol)

        if "hop" in args.parts:
            head = "| c | hubserve simple (ONNX) | hubserve add_sub_py | add_sub_py / simple | " \
                   "Triton add_sub_py | hubserve / Triton (add_sub_py) |"
            if baseline:
                head += f" {baseline} add_sub_py | hubserve / {baseline} |"
            out += [f"(a) Python-model hop, {protocol}", "", head, "|---" * (head.count("|") - 1) + "|"]
            for c in hops:
                onnx, py, tri = at("hubserve", "simple", c), at("hubserve", "add_sub_py", c), \
                    at("triton", "add_sub_py", c)
                line = (f"| {c} | {cell(onnx)} | {cell(py)} | {ratio(py, onnx)} | {cell(tri)} "
                        f"| {ratio(py, tri)} |")
                if baseline:
                    before = at(baseline, "add_sub_py", c)
                    line += f" {cell(before)} | {ratio(py, before)} |"
                out.append(line)
            out.append("")
        if "ensemble" in args.parts:
            c = args.concurrency
            out += [f"(b) Ensemble against its slowest step, {protocol}, c = {c}", "",
                    "| server | mlp_large | pipeline (prep → mlp_large) | pipeline / mlp_large |",
                    "|---|---|---|---|"]
            for server in versions:
                step, pipe = at(server, "mlp_large", c), at(server, "pipeline", c)
                out.append(f"| {server} | {cell(step)} | {cell(pipe)} | {ratio(pipe, step)} |")
            out += ["", f"hubserve pipeline / Triton pipeline: "
                    f"{ratio(at('hubserve', 'pipeline', c), at('triton', 'pipeline', c))}", ""]
    if "hop" in args.parts and "triton" in versions:
        out += hop_goal(rows, protocols, hops)
    if commands:
        out.append("perf_analyzer (first run; -m, -u and the last --concurrency-range vary): "
                   f"`{commands[0]}`")
    return "\n".join(out)


def hop_goal(rows: list[Row], protocols: list[str], hops: list[int]) -> list[str]:
    """Issue 32's Python-model goal in this run: hubserve's add_sub_py ≥ 1.0 × Triton's at every hop
    concurrency and protocol measured (the goal names c = 1, 4, 16 and both protocols)."""
    def tput(server: str, c: int, protocol: str) -> float:
        row = find(rows, server, "add_sub_py", c, protocol)
        return row.throughput if row is not None and not row.error else 0.0

    points = [(p, c, tput("hubserve", c, p), tput("triton", c, p)) for p in protocols for c in hops]
    under = [f"{p} c = {c}" + (f" ({h / t:.2f} ×)" if h and t else " (not measured)")
             for p, c, h, t in points if not (h and t and h >= t)]
    held = len(points) - len(under)
    return [f"Python-model goal (add_sub_py ≥ 1.0 × Triton, {', '.join(protocols)} × c = "
            f"{', '.join(map(str, hops))}): {held} of {len(points)} points"
            + (f"; under: {'; '.join(under)}" if under else "; **holds in this run**"), ""]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--protocol", default="grpc", help="grpc, http, or both (grpc,http) in one run")
    parser.add_argument("--hop-concurrency", default="1,4,16")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--interval-ms", type=int, default=2000)
    parser.add_argument("--servers", default="hubserve,triton")
    parser.add_argument("--stability", type=int, default=50, help="perf_analyzer --stability-percentage")
    parser.add_argument("--parts", default="hop,ensemble", help="hop (a), ensemble (b), or both")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds; each point's median")
    parser.add_argument("--baseline-tree", type=Path,
                        help="another checkout whose engine/ is served too, as hubserve@<folder>")
    args = parser.parse_args()
    names = args.servers.split(",")
    if not args.protocol or not set(args.protocol.split(",")) <= {"grpc", "http"}:
        parser.error(f"--protocol: grpc, http or grpc,http (got {args.protocol!r})")
    if missing := servers.missing_for_bench(names):
        print(missing, file=sys.stderr)
        return 2
    if args.baseline_tree:
        names.insert(names.index("hubserve") + 1 if "hubserve" in names else 0,
                     f"hubserve@{args.baseline_tree.resolve().name}")
    hop = [int(x) for x in args.hop_concurrency.split(",")]
    parts = args.parts.split(",")
    rounds: list[list[Row]] = []
    commands: list[str] = []
    versions: dict[str, str] = {}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench_pipelines.") as tmp:
        repositories = write_repositories(Path(tmp), names)
        for r in range(args.rounds):
            by_server: dict[str, list[Row]] = {}
            for name in names if r % 2 == 0 else names[::-1]:  # the order alternates, round by round
                plan = by_server[name] = [row for protocol in args.protocol.split(",")
                                          for row in plan_for(name, hop, args.concurrency, parts, protocol)]
                repository = repositories["triton" if name == "triton" else "hubserve"]
                server = servers.start(server_kind(name, repository, args.baseline_tree),
                                       sorted({r.model for r in plan}), Path(tmp))
                versions[name] = server.version
                try:
                    measure(server, plan, args, commands)
                finally:
                    server.stop()
            rounds.append([row for name in names for row in by_server[name]])  # one order for the medians
    print(report(median_rounds(rounds), args, commands, versions, (load_before, os.getloadavg()[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
