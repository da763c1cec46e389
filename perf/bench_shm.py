"""System shared memory (issue 16) against plain requests, with the real perf_analyzer, in one short run.

    bash tools/install_perf_analyzer.sh   # once
    flock /work/probes/bench.lock .venv/bin/python perf/bench_shm.py [--mib 1] [--concurrency 1,4]
        [--interval-ms 2000] [--workers 1]

The model, written to a temporary folder: `big`, an FP32 identity (INPUT0 → OUTPUT0) of `--mib` MiB per
tensor (max_batch_size 8, no dynamic batching), so the bytes are the work. hubserve runs with
`--allow-client-shm`. For each protocol and concurrency, perf_analyzer runs once plain (tensors in the request
and the answer: HTTP's binary extension, gRPC raw contents) and once with `--shared-memory system
--output-shared-memory-size <tensor bytes>` (its regions registered once; each request names them). Each
cell is one perf_analyzer run (`--input-data zero`, `-s 50`); the server's CPU time per inference is read from
/proc (utime + stime of the server's processes) and its statistics around each run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import urllib.request
from pathlib import Path

from hubserve_harness import start_server
from hubserve_harness.perf_analyzer import perf_analyzer_available, run_perf_analyzer
from hubserve_models import examples

MODEL = "big"
CONFIG = """name: "big"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ {n} ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ {n} ] }} ]
"""


def build(root: Path, elements: int) -> None:
    examples.write_model(examples.identity_model("FP32", (-1, elements)), root / MODEL / "1" / "model.onnx")
    (root / MODEL / "config.pbtxt").write_text(CONFIG.format(n=elements))


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` and its children alive now (the frontends with --workers N)."""
    tick = os.sysconf("SC_CLK_TCK")
    pids = [pid]
    with contextlib.suppress(OSError):
        pids += [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    total = 0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / tick


def inference_count(http_url: str) -> int:
    with urllib.request.urlopen(f"http://{http_url}/v2/models/{MODEL}/stats", timeout=10) as r:
        return int(json.load(r)["model_stats"][0]["inference_count"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=float, default=1.0, help="MiB per tensor (input and output)")
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--interval-ms", type=int, default=2000)
    parser.add_argument("--workers", default="1")
    args = parser.parse_args()
    if not perf_analyzer_available():
        print("perf_analyzer is missing: bash tools/install_perf_analyzer.sh", file=sys.stderr)
        return 1
    elements = int(args.mib * (1 << 20)) // 4
    tensor_bytes = elements * 4
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_shm.") as tmp:
        root = Path(tmp) / "repo"
        build(root, elements)
        server = start_server(root, Path(tmp) / "server.log", "--model-control-mode", "none",
                              "--allow-client-shm", "--workers", args.workers)
        try:
            for protocol in ("http", "grpc"):
                url = server.http_url if protocol == "http" else server.grpc_url
                for concurrency in args.concurrency.split(","):
                    for mode in ("plain", "shm"):
                        extra = ["--concurrency-range", concurrency, "--input-data", "zero",
                                 "--measurement-interval", str(args.interval_ms)]
                        if mode == "shm":
                            extra += ["--shared-memory", "system",
                                      "--output-shared-memory-size", str(tensor_bytes)]
                        cpu0, n0 = cpu_seconds(server.process.pid), inference_count(server.http_url)
                        result = run_perf_analyzer(MODEL, url, protocol, *extra, timeout_s=180)
                        cpu1, n1 = cpu_seconds(server.process.pid), inference_count(server.http_url)
                        row = result.csv_rows[0] if result.csv_rows else {}
                        cpu_us = (cpu1 - cpu0) / max(n1 - n0, 1) * 1e6
                        rows.append((protocol, concurrency, mode, result.returncode, result.throughput,
                                     row.get("p50 latency", "-"), cpu_us, " ".join(result.command[1:])))
                        print(rows[-1][:7], flush=True)
        finally:
            server.stop()
    print(f"\n`big`: FP32 identity, {tensor_bytes} bytes in and out per inference; hubserve --workers "
          f"{args.workers} --allow-client-shm\n")
    print("| protocol | concurrency | tensors | exit | infer/s | p50 µs | server CPU µs / inference |")
    print("|---|---|---|---|---|---|---|")
    for protocol, concurrency, mode, rc, throughput, p50, cpu_us, _ in rows:
        print(f"| {protocol} | {concurrency} | {mode} | {rc} | {throughput:.0f} | {p50} | {cpu_us:.0f} |")
    print("\nCommands (perf_analyzer, one run each; -f <csv> is a temporary file):\n")
    for *_, command in rows:
        print(f"    perf_analyzer {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
