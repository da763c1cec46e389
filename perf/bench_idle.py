"""What an idle server costs: wake-ups per second per thread and CPU, in poll mode over an empty repository.

    .venv/bin/python perf/bench_idle.py [--trees . /work/main] [--secs 30] [--rounds 2] [-- serve flags]

For each checkout in `--trees` (each round, interleaved), starts `python -m engine serve --model-control-mode
poll` with that checkout's engine (`PYTHONPATH`), lets it start up, then reads every thread's context
switches (/proc/PID/task/*/status, voluntary + involuntary: one per wake-up) and the process's CPU ticks
before and after `--secs`. Why it matters under load: a thread that wakes often takes a core from inference
each time (perf/history/pipelines.md, issue 32). Flags after `--` go to every server
(`--no-repository-events`, `--repository-poll-secs 300`). Also prints how long SIGTERM takes to end it.
Linux only.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START_SECS = 6.0  # start-up work (imports, first scans) ends well before this; the window starts after it


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _threads(pid: int) -> dict[str, tuple[str, int]]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines()
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            continue  # ended meanwhile
        fields = dict(line.split(":", 1) for line in status if ":" in line)
        switches = int(fields["voluntary_ctxt_switches"]) + int(fields["nonvoluntary_ctxt_switches"])
        out[tid] = (name, switches)
    return out


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def measure(tree: Path, secs: float, flags: list[str]) -> str:
    repository = Path(tempfile.mkdtemp(prefix="bench_idle_"))
    cmd = [sys.executable, "-m", "engine", "serve", "--model-repository", str(repository),
           "--http-port", _port(), "--grpc-port", _port(), "--metrics-port", _port(),
           "--model-control-mode", "poll", *flags]
    proc = subprocess.Popen(cmd, cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(START_SECS)
        before, cpu_before = _threads(proc.pid), _cpu_ticks(proc.pid)
        time.sleep(secs)  # the measured window itself
        after, cpu_after = _threads(proc.pid), _cpu_ticks(proc.pid)
    finally:
        proc.terminate()
        t0 = time.monotonic()
        proc.wait(30)
        stop = time.monotonic() - t0
    lines, total = [], 0.0
    for tid, (name, n) in sorted(after.items()):
        rate = (n - before.get(tid, (name, 0))[1]) / secs
        total += rate
        lines.append(f"    thread {tid} {name:16s} {rate:6.1f} wake-ups/s")
    cpu_ms = (cpu_after - cpu_before) / os.sysconf("SC_CLK_TCK") * 1000 / secs
    head = (f"{tree} {' '.join(flags)}: {len(after)} threads, {total:.1f} wake-ups/s, CPU {cpu_ms:.1f} ms/s "
            f"over {secs:.0f} s, SIGTERM to exit {stop:.2f} s, load {os.getloadavg()[0]:.1f}")
    return "\n".join([head, *lines])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trees", nargs="+", type=Path, default=[Path(".")])
    parser.add_argument("--secs", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("flags", nargs="*", help="serve flags (after --)")
    args = parser.parse_args()
    for _ in range(args.rounds):
        for tree in args.trees:
            print(measure(tree.resolve(), args.secs, args.flags), flush=True)


if __name__ == "__main__":
    main()
