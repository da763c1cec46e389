"""Sequence models (issue 15) with the real perf_analyzer, in one short run: hubserve beside Triton 2.51, and
the `oldest` strategy against `direct` on hubserve.

    bash tools/install_perf_analyzer.sh; bash perf/peers/setup_triton.sh   # once
    flock /work/probes/bench.lock .venv/bin/python perf/bench_sequence.py [--concurrency 8]
        [--oldest-concurrency 16] [--sequence-length 20] [--interval-ms 2000] [--no-triton]

The repository, written to a temporary folder from model_repository/: `simple_sequence`,
`simple_dyna_sequence` and `sequence_accumulator` with their committed configs; `acc_oldest`, the
accumulator with `oldest` (`max_candidate_sequences: 16`, no delay) instead of `direct` (8 slots:
max_batch_size 8, one instance); `acc_direct16`, the accumulator with `direct` and max_batch_size 16 (16
slots); and `py_accumulator`, the same accumulator as a Python model with implicit state (`PY_ACCUMULATOR`,
the accumulator's config with `backend: "python"`).

1. Beside Triton: perf_analyzer `--sequence-length` sync over HTTP and gRPC, and `--streaming` over gRPC, at
   `--concurrency` (perf_analyzer keeps that many sequences live). Triton's repository is generated from the
   same configs by `perf/peers/repos.py` (Python-backend models running the same model.onnx with ONNX
   Runtime, the same `sequence_batching` with its control inputs and state) into `.peers/seq_triton_repo/`.
   Triton's Python backend does not carry implicit state (ACC_IN arrives as the initial zeros on every
   request: ACC_OUT is not kept; `_accumulates` checks it before the run), so only the models without state
   are compared: `simple_sequence` (START) and `simple_dyna_sequence` (Triton's example: `oldest`, 2
   instances, START, END, READY and a UINT64 CORRID). hubserve also runs `sequence_accumulator` and
   `py_accumulator` (implicit state through ONNX Runtime and through a Python model).
2. `direct` vs `oldest`: the accumulator at `--oldest-concurrency` (16 live sequences) over gRPC streaming
   and HTTP sync: `direct` with 8 slots (the example's config) and with 16, `oldest` with 16 candidates.

Each cell is one perf_analyzer run (`--input-data zero`; its default stability rules, see
hubserve_harness/perf_analyzer.py); the report is markdown with the exact commands.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from hubserve_harness import ROOT, start_server
from hubserve_harness.perf_analyzer import PerfResult, perf_analyzer_available, run_perf_analyzer
from hubserve_models import examples
from peers import repos, servers

TRITON_REPO = servers.PEERS_DIR / "seq_triton_repo"
TRITON_SITE_PACKAGES = servers.PEERS_DIR / "triton/lib/python3.11/site-packages"
ACCUMULATOR = "sequence_accumulator"
OLDEST = "acc_oldest"
DIRECT16 = "acc_direct16"
PY_ACCUMULATOR = "py_accumulator"
DYNA = "simple_dyna_sequence"
COMPARED = ("simple_sequence", DYNA)  # beside Triton: control inputs, no state
STRATEGIES = {ACCUMULATOR: "direct, 8 slots", DIRECT16: "direct, 16 slots", OLDEST: "oldest, 16 candidates"}
# The accumulator as a Python model: ACC_OUT = INPUT + ACC_IN * (1 - START), OUTPUT = ACC_OUT, per request.
PY_ACCUMULATOR_SOURCE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            def tensor(name):
                return pb_utils.get_input_tensor_by_name(request, name).as_numpy()

            total = tensor("INPUT") + tensor("ACC_IN") * (1 - tensor("START"))
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT", total), pb_utils.Tensor("ACC_OUT", total)]))
        return responses
'''
MODES = (("http", False), ("grpc", False), ("grpc", True))  # (protocol, --streaming)


def build(root: Path) -> None:
    examples.build_repository(root, ["simple_sequence", DYNA, ACCUMULATOR])
    for name in ("simple_sequence", DYNA, ACCUMULATOR):
        shutil.copy(ROOT / "model_repository" / name / "config.pbtxt", root / name / "config.pbtxt")
    text = (root / ACCUMULATOR / "config.pbtxt").read_text()
    variants = {
        OLDEST: text.replace("max_sequence_idle_microseconds: 5000000", "max_sequence_idle_microseconds: "
                             "5000000\n  oldest { max_candidate_sequences: 16 }"),
        DIRECT16: text.replace("max_batch_size: 8", "max_batch_size: 16"),
    }
    for name, config in variants.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config.replace(f'name: "{ACCUMULATOR}"', f'name: "{name}"'))
        shutil.copy(root / ACCUMULATOR / "1" / "model.onnx", root / name / "1" / "model.onnx")
    (root / PY_ACCUMULATOR / "1").mkdir(parents=True)
    (root / PY_ACCUMULATOR / "1" / "model.py").write_text(PY_ACCUMULATOR_SOURCE)
    python = text.replace(f'name: "{ACCUMULATOR}"\nplatform: "onnxruntime_onnx"',
                          f'name: "{PY_ACCUMULATOR}"\nbackend: "python"')
    assert 'backend: "python"' in python
    (root / PY_ACCUMULATOR / "config.pbtxt").write_text(python)


def _accumulates(url: str, model: str) -> bool:
    """Whether `model` on the server at `url` answers one sequence's running sums (implicit state works)."""
    client = httpclient.InferenceServerClient(url)
    got = []
    for i, v in enumerate((3, 4, 5)):
        inp = httpclient.InferInput("INPUT", [1, 1], "INT32")
        inp.set_data_from_numpy(np.full((1, 1), v, dtype=np.int32))
        result = client.infer(model, [inp], sequence_id=4242, sequence_start=i == 0, sequence_end=i == 2)
        got.append(int(result.as_numpy("OUTPUT")[0, 0]))
    return got == [3, 7, 12]


def _run(model: str, url: str, protocol: str, streaming: bool, concurrency: int, args: argparse.Namespace
         ) -> PerfResult:
    extra = ["--concurrency-range", str(concurrency), "--sequence-length", str(args.sequence_length),
             "--measurement-interval", str(args.interval_ms), "--input-data", "zero"]
    if streaming:
        extra.append("--streaming")
    result = run_perf_analyzer(model, url, protocol, *extra, timeout_s=180)
    if not result.ok:
        print(result.output[-3000:], file=sys.stderr)
    return result


def _mode(protocol: str, streaming: bool) -> str:
    return f"{protocol} {'--streaming' if streaming else 'sync'}"


def _cell(result: PerfResult) -> str:
    if not result.ok:
        return f"failed (rc {result.returncode})"
    row = result.csv_rows[0] if result.csv_rows else {}
    p99 = row.get("p99 latency")
    return f"{result.throughput:.0f}" + (f" (p99 {int(p99) / 1000:.1f} ms)" if p99 else "")


def _command(result: PerfResult) -> str:
    return "`" + " ".join(Path(c).name if c.startswith("/") else c for c in result.command) + "`"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--oldest-concurrency", type=int, default=16)
    parser.add_argument("--sequence-length", type=int, default=20)
    parser.add_argument("--interval-ms", type=int, default=2000)
    parser.add_argument("--no-triton", action="store_true")
    args = parser.parse_args()
    if not perf_analyzer_available():
        print("perf_analyzer is missing: bash tools/install_perf_analyzer.sh", file=sys.stderr)
        return 2
    triton_missing = None if args.no_triton else servers.TRITON.missing()
    lines = ["Command: `" + " ".join(["flock /work/probes/bench.lock .venv/bin/python perf/bench_sequence.py",
                                      *sys.argv[1:]]) + "`", ""]
    side: dict[tuple[str, str], dict[str, PerfResult]] = {}  # (model, mode) -> server -> result
    strategies: dict[tuple[str, str], PerfResult] = {}  # (model, mode)
    with tempfile.TemporaryDirectory(prefix="bench_sequence.") as tmp:
        root = Path(tmp) / "repository"
        build(root)
        server = start_server(root, Path(tmp) / "hubserve.log")
        try:
            assert all(_accumulates(server.http_url, m) for m in (ACCUMULATOR, PY_ACCUMULATOR, *STRATEGIES))
            for model in (*COMPARED, ACCUMULATOR, PY_ACCUMULATOR):
                for protocol, streaming in MODES:
                    url = server.grpc_url if protocol == "grpc" else server.http_url
                    side.setdefault((model, _mode(protocol, streaming)), {})["hubserve"] = _run(
                        model, url, protocol, streaming, args.concurrency, args)
            for model in STRATEGIES:
                for protocol, streaming in (("grpc", True), ("http", False)):
                    url = server.grpc_url if protocol == "grpc" else server.http_url
                    strategies[(model, _mode(protocol, streaming))] = _run(
                        model, url, protocol, streaming, args.oldest_concurrency, args)
        finally:
            server.stop()
        triton_state = "not run"
        if not args.no_triton and triton_missing is None:
            models = [repos.served_model(root, m) for m in (*COMPARED, ACCUMULATOR)]
            repos.write_triton_repo(models, TRITON_REPO, TRITON_SITE_PACKAGES)
            default_repo = str(servers.PEERS_DIR / "triton_repo")
            kind = replace(servers.TRITON, command=lambda p, m: [
                str(TRITON_REPO) if part == default_repo else part for part in servers.TRITON.command(p, m)])
            triton = servers.start(kind, [m.name for m in models], Path(tmp))
            try:
                triton_state = "works" if _accumulates(triton.url("http"), ACCUMULATOR) else \
                    "does not work (running sums wrong: the Python backend does not carry the state)"
                for model in COMPARED:
                    for protocol, streaming in MODES:
                        side[(model, _mode(protocol, streaming))]["triton"] = _run(
                            model, triton.url(protocol), protocol, streaming, args.concurrency, args)
            finally:
                triton.stop()
    lines += [f"### Beside Triton 2.51: concurrency {args.concurrency}, sequence length "
              f"{args.sequence_length}", "",
              "Inferences/s (p99 latency) per perf_analyzer run.", "",
              "| model | mode | hubserve | Triton 2.51 |", "|---|---|---|---|"]
    for (model, mode), results in side.items():
        triton_cell = _cell(results["triton"]) if "triton" in results else \
            ("implicit state unsupported by Triton's Python backend" if model not in COMPARED else "not run")
        lines.append(f"| {model} | {mode} | {_cell(results['hubserve'])} | {triton_cell} |")
    lines += ["", f"Triton, implicit state through its Python backend: {triton_state}."
              + (f" Triton not run: {triton_missing}" if triton_missing else ""), "",
              f"### `direct` vs `oldest` on hubserve, concurrency {args.oldest_concurrency}", "",
              "| model | strategy | mode | infer/s (p99) |", "|---|---|---|---|"]
    for (model, mode), result in strategies.items():
        lines.append(f"| {model} | {STRATEGIES[model]} | {mode} | {_cell(result)} |")
    last = next(iter(strategies.values()))
    lines += ["", "perf_analyzer command (one of them; model, protocol and concurrency vary): "
              + _command(last), ""]
    print("\n".join(lines))
    ok = all(r.ok for results in side.values() for r in results.values()) and \
        all(r.ok for r in strategies.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
