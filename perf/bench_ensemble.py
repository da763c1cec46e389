"""An ensemble against its slowest step (issue 14), with the real perf_analyzer, in one run.

    bash tools/install_perf_analyzer.sh
    .venv/bin/python perf/bench_ensemble.py [--protocols grpc,http] [--concurrency 16] [--interval-ms 3000]
        [--rounds 2]

The repository, written to a temporary folder (hubserve_harness `build_pipeline_repository`): `prep`, a cheap
ONNX step (Identity on FP32 [1024], dynamic batching), `mlp_large` (the example repository's compute-bound
MLP, its config as committed), and `pipeline`, the ensemble prep -> mlp_large. `mlp_large` alone is the
slowest step; the goal is the ensemble at >= 90 % of its throughput at concurrency 16. For each protocol the
two targets are measured in turn, `--rounds` times (A, B, A, B: drift on this shared machine hits both), each
a perf_analyzer run at one concurrency with `--input-data zero`; the report gives every run and the ratio of
the medians, with the exact commands, and is printed as markdown.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from hubserve_harness import build_pipeline_repository, start_server
from hubserve_harness.perf_analyzer import perf_analyzer_available, run_perf_analyzer

TARGETS = ("mlp_large", "pipeline")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--protocols", default="grpc")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--interval-ms", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if not perf_analyzer_available():
        print("perf_analyzer is missing: bash tools/install_perf_analyzer.sh", file=sys.stderr)
        return 2
    lines = [f"Command: `.venv/bin/python perf/bench_ensemble.py --protocols {args.protocols} --concurrency "
             f"{args.concurrency} --interval-ms {args.interval_ms} --rounds {args.rounds}`", ""]
    with tempfile.TemporaryDirectory(prefix="bench_ensemble.") as tmp:
        root = Path(tmp) / "repository"
        build_pipeline_repository(root)
        server = start_server(root, Path(tmp) / "server.log")
        try:
            for protocol in args.protocols.split(","):
                url = server.grpc_url if protocol == "grpc" else server.http_url
                runs: dict[str, list[float]] = {t: [] for t in TARGETS}
                command: tuple[str, ...] = ()
                for _ in range(args.rounds):
                    for target in TARGETS:
                        result = run_perf_analyzer(
                            target, url, protocol, "--concurrency-range", str(args.concurrency),
                            "--measurement-interval", str(args.interval_ms), "--input-data", "zero",
                            timeout_s=300)
                        if not result.ok:
                            print(result.output, file=sys.stderr)
                            return 1
                        runs[target].append(result.throughput)
                        command = result.command
                medians = {t: statistics.median(v) for t, v in runs.items()}
                ratio = medians["pipeline"] / medians["mlp_large"]
                lines += [f"### {protocol}, concurrency {args.concurrency}", "",
                          "| target | infer/s per run | median |", "|---|---|---|"]
                lines += [f"| {t} | {', '.join(f'{x:.0f}' for x in runs[t])} | {medians[t]:.0f} |"
                          for t in TARGETS]
                lines += ["", f"pipeline / mlp_large = **{ratio:.1%}** (goal >= 90 %)", "",
                          "perf_analyzer command (last run; the model name varies): `"
                          + " ".join(Path(c).name if c.startswith("/") else c for c in command) + "`", ""]
        finally:
            server.stop()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
