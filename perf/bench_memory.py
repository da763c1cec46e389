"""Resident memory across load/unload cycles: does unloading a model give its memory back?

Starts hubserve in explicit model-control mode on a fresh repository holding the example `mlp`, then
`--cycles` times: load `mlp` through the HTTP repository API, run a few inferences (batch sizes 1..32, so the
runtime's arenas are used), unload it, and read the server's resident memory (VmRSS from /proc/<pid>/status).
The same run is repeated, side by side, on a server whose `engine.memory.release_freed_memory` is switched off
(the baseline: what the server did before it called malloc_trim after an unload).

Verdict: the median of the last 10 cycles against the median of cycles 5-15 (after the first loads have warmed
up the allocator and the runtime's one-time state); flat when the growth is within `--tolerance-mib`.

    .venv/bin/python perf/bench_memory.py [--cycles 50] [--tolerance-mib 5] [--no-baseline]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from hubserve_harness import ROOT, free_ports
from hubserve_models import examples

# Runs the server with the post-unload trim switched off; everything else is the shipped server.
BASELINE = ("import sys, engine.memory; engine.memory._libc = None; from engine.__main__ import main; "
            "sys.exit(main())")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc status")


class Server:
    def __init__(self, repository: Path, log_path: Path, trim: bool) -> None:
        self.http, grpc = free_ports(2)
        args = ["serve", "--model-repository", str(repository), "--host", "127.0.0.1", "--http-port",
                str(self.http), "--grpc-port", str(grpc), "--metrics-port", "0",
                "--model-control-mode", "explicit"]
        cmd = [sys.executable, "-m", "engine", *args] if trim else [sys.executable, "-c", BASELINE, *args]
        with open(log_path, "wb") as log:  # the server holds its own copy of the descriptor
            self.process = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/health/live", timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"server did not start; see {log_path}")

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{self.http}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=120) as r:
            text = r.read()
        return json.loads(text) if text else {}

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(30)


def cycle(server: Server, batch_sizes: list[int]) -> tuple[float, float]:
    """One load → infer → unload; the resident MiB while loaded (after the inferences) and after unloading."""
    server.post("/v2/repository/models/mlp/load", {})
    for batch in batch_sizes:
        data = [float(i % 7) for i in range(batch * 256)]
        out = server.post("/v2/models/mlp/infer", {"inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [batch, 256], "data": data}]})
        assert out["outputs"][0]["shape"] == [batch, 256]
    loaded = rss_mib(server.process.pid)
    server.post("/v2/repository/models/mlp/unload", {})
    return loaded, rss_mib(server.process.pid)


def measure(repository: Path, workdir: Path, cycles: int,
            trim: bool) -> tuple[float, list[tuple[float, float]]]:
    server = Server(repository, workdir / f"server-{'trim' if trim else 'baseline'}.log", trim)
    try:
        start = rss_mib(server.process.pid)
        return start, [cycle(server, [1, 4, 32, 7]) for _ in range(cycles)]
    finally:
        server.stop()


def verdict(samples: list[float], tolerance_mib: float) -> tuple[float, float, float, bool]:
    reference = statistics.median(samples[4:15])
    last = statistics.median(samples[-10:])
    return reference, last, last - reference, last - reference <= tolerance_mib


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--tolerance-mib", type=float, default=5.0,
                        help="allowed growth; one leaked mlp per cycle would add well over 2 MiB a cycle")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the run with malloc_trim switched off")
    args = parser.parse_args()
    if args.cycles < 20:
        parser.error("--cycles must be at least 20 (the verdict compares cycles 5-15 with the last 10)")

    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        workdir = Path(tmp)
        repository = workdir / "repository"
        (repository / "mlp").mkdir(parents=True)
        config = (ROOT / "model_repository/mlp/config.yaml").read_text()
        (repository / "mlp" / "config.yaml").write_text(config)
        examples.build_repository(repository, ["mlp"])
        runs = {"shipped": measure(repository, workdir, args.cycles, trim=True)}
        if not args.no_baseline:
            runs["no malloc_trim"] = measure(repository, workdir, args.cycles, trim=False)

    names = list(runs)
    arena_max = os.environ.get("MALLOC_ARENA_MAX", "unset")
    print(f"hubserve resident memory (VmRSS, MiB) in each load → infer → unload cycle of 'mlp': while "
          f"loaded, and after the unload; {os.cpu_count()} CPUs, MALLOC_ARENA_MAX={arena_max}")
    print("       " + "  ".join(f"{n:>23}" for n in names))
    print("cycle  " + "  ".join(f"{'loaded':>11} {'unloaded':>11}" for _ in names))
    print("start  " + "  ".join(f"{'':>11} {runs[n][0]:11.1f}" for n in names))
    for i in range(args.cycles):
        print(f"{i + 1:5d}  " + "  ".join(f"{runs[n][1][i][0]:11.1f} {runs[n][1][i][1]:11.1f}"
                                         for n in names))
    ok = True
    for name in names:
        reference, last, growth, flat = verdict([after for _, after in runs[name][1]], args.tolerance_mib)
        print(f"{name}: after unload, cycles 5-15 median {reference:.1f} MiB, last 10 median {last:.1f} "
              f"MiB, growth {growth:+.1f} MiB → {'FLAT' if flat else 'GROWS'} "
              f"(tolerance {args.tolerance_mib:g} MiB)")
        ok = ok and (flat or name != "shipped")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
