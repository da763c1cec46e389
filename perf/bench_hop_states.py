"""Where a Python-model batch's cycle goes: the instance process's and the server's threads' scheduler states
over time, both servers, under the real perf_analyzer (issue 32, the hop's HTTP c = 4 point).

    bash tools/install_perf_analyzer.sh; bash perf/peers/setup_triton.sh   # once; `perf` (linux-tools) too
    .venv/bin/python perf/bench_hop_states.py [--protocol http] [--concurrency 4] [--secs 2]
        [--servers hubserve,triton]

Each server serves `add_sub_py` (bench_pipelines.py's model.py and config, Triton's `add_sub`) alone.
perf_analyzer drives it; a few seconds in, `perf record -a -e sched:sched_switch,sched:sched_wakeup` (light:
no syscall tracepoints, which slow a server by a quarter) runs for `--secs`, and the trace is replayed:
every thread of the instance process (hubserve's stub, Triton's `triton_python_backend_stub`) and of the
server (hubserve's event loop and helpers, Triton's threads) is running, runnable (woken or preempted, not
on a CPU), or asleep at each moment. The table is the share of time in each (instance, server) pair, where
a group is running when any of its threads runs, else runnable when any is. Beside it: how often a wake-up
one of the server's threads issued put the woken thread on the waker's own CPU while the other CPU was
idle, and how often the server's threads were preempted.

Why: throughput under a closed loop is set by the chain of hand-offs per batch, not by CPU alone. A point
where the instance sleeps while the server runs is one where the next batch waits on the server; the
2026-12-07 twenty-fourth session's run of this (perf/history/pipelines.md) is what the closing note of
issue 32 rests on. Needs root or `kernel.perf_event_paranoid` ≤ -1 for the tracepoints.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from bench_pipelines import server_kind, write_repositories
from hubserve_harness.perf_analyzer import PERF_ANALYZER
from peers import servers

MODEL = "add_sub_py"
_LINE = re.compile(r"^\s*(?P<comm>\S.*?)\s+(?P<pid>\d+)/(?P<tid>\d+)\s+\[(?P<cpu>\d+)\]\s+(?P<t>[\d.]+):\s+"
                   r"(?P<event>\S+):\s*(?P<args>.*)$")
_FIELD = re.compile(r"(\w+)=(\S+)")


@dataclasses.dataclass(frozen=True)
class Event:
    t_us: float
    pid: int  # of the task that was on the CPU when the event fired
    tid: int
    cpu: int
    name: str  # "sched_switch" or "sched_wakeup"
    fields: dict[str, str]


def parse(lines: Iterable[str]) -> list[Event]:
    """`perf script -F comm,pid,tid,cpu,time,event,trace` lines of sched_switch and sched_wakeup events."""
    events = []
    for line in lines:
        m = _LINE.match(line)
        if m is None:
            continue
        name = m["event"].rpartition(":")[2]
        if name not in ("sched_switch", "sched_wakeup"):
            continue
        events.append(Event(float(m["t"]) * 1e6, int(m["pid"]), int(m["tid"]), int(m["cpu"]), name,
                            dict(_FIELD.findall(m["args"]))))
    return events


def thread_ids(events: list[Event], pid: int) -> set[int]:
    """Every thread of process `pid` seen on a CPU in the trace."""
    return {e.tid for e in events if e.pid == pid}


def state_split(events: list[Event], instance: set[int], server: set[int]) -> dict[tuple[str, str], float]:
    """Share of the traced time in each (instance state, server state) pair. A thread not seen yet counts as
    asleep; a wake-up makes a sleeping thread runnable, a switch makes the previous task runnable (preempted,
    prev_state R) or asleep and the next one running."""
    state: dict[int, str] = {}

    def group(tids: set[int]) -> str:
        seen = {state.get(t, "sleep") for t in tids}
        return "run" if "run" in seen else "runq" if "runq" in seen else "sleep"

    spent: collections.defaultdict[tuple[str, str], float] = collections.defaultdict(float)
    if not events:
        return {}
    last = events[0].t_us
    for e in events:
        spent[(group(instance), group(server))] += e.t_us - last
        last = e.t_us
        if e.name == "sched_switch":
            state[int(e.fields["prev_pid"])] = "runq" if e.fields["prev_state"].startswith("R") else "sleep"
            state[int(e.fields["next_pid"])] = "run"
        elif state.get(woken := int(e.fields["pid"]), "sleep") == "sleep":
            state[woken] = "runq"
    total = sum(spent.values())
    return {k: v / total for k, v in spent.items()} if total else {}


@dataclasses.dataclass
class Placement:
    wakeups: int = 0  # wake-ups the server's threads issued
    on_own_cpu_other_idle: int = 0  # ... that put the woken thread on the waker's CPU while another was idle
    preempted: int = 0  # server threads switched out while still runnable
    preempted_other_idle: int = 0  # ... while another CPU was idle


def placement(events: list[Event], server: set[int]) -> Placement:
    running: dict[int, int] = {}  # cpu -> pid on it (0: idle)
    out = Placement()
    for e in events:
        others_idle = any(p == 0 for c, p in running.items() if c != e.cpu)
        if e.name == "sched_switch":
            if int(e.fields["prev_pid"]) in server and e.fields["prev_state"].startswith("R"):
                out.preempted += 1
                out.preempted_other_idle += others_idle
            running[e.cpu] = int(e.fields["next_pid"])
        elif e.tid in server:
            out.wakeups += 1
            out.on_own_cpu_other_idle += int(e.fields.get("target_cpu", "-1")) == e.cpu and others_idle
    return out


def table(split: dict[tuple[str, str], float]) -> list[str]:
    lines = ["| instance process | server threads | share of time |", "|---|---|---|"]
    for (inst, srv), share in sorted(split.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {inst} | {srv} | {100 * share:.1f} % |")
    return lines


def instance_pid(server: servers.RunningServer) -> int:
    """The model's instance process: the server's descendant whose command line names the stub."""
    for pid in servers.descendants(server.pid):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"stub" in f.read():
                return pid
    raise RuntimeError("no instance process found under the server")


def trace(server: servers.RunningServer, args: argparse.Namespace, out: Path) -> tuple[list[Event], float]:
    """perf_analyzer against `server` for the trace's length and then some; the events and infer/s while
    tracing."""
    command = [str(PERF_ANALYZER), "-m", MODEL, "-u", server.url(args.protocol), "-i", args.protocol,
               "--concurrency-range", str(args.concurrency), "--measurement-interval",
               str(int((args.secs + 6) * 1000)), "--input-data", "zero"]
    client = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              stdin=subprocess.DEVNULL)
    try:
        time.sleep(3)  # past its warm-up
        n0 = server.inferences(MODEL)
        started = time.monotonic()
        subprocess.run(["perf", "record", "-a", "-q", "-e", "sched:sched_switch,sched:sched_wakeup", "-o",
                        str(out), "--", "sleep", str(args.secs)], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        rate = (server.inferences(MODEL) - n0) / (time.monotonic() - started)
    finally:
        client.kill()
        client.wait()
    script = subprocess.run(["perf", "script", "-i", str(out), "-F", "comm,pid,tid,cpu,time,event,trace"],
                            check=True, capture_output=True, text=True)
    return parse(script.stdout.splitlines()), rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--protocol", default="http", choices=("grpc", "http"))
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--secs", type=float, default=2.0, help="how long the scheduler is traced")
    parser.add_argument("--servers", default="hubserve,triton")
    args = parser.parse_args()
    names = args.servers.split(",")
    if missing := servers.missing_for_bench(names):
        print(missing, file=sys.stderr)
        return 2
    if shutil.which("perf") is None:
        print("`perf` is missing (Debian: apt-get install linux-perf)", file=sys.stderr)
        return 2
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench_hop_states.") as tmp:
        repositories = write_repositories(Path(tmp), names)
        print(f"`{MODEL}`, {args.protocol} c = {args.concurrency}, {args.secs:g} s of scheduler trace per "
              f"server, load average {load:.2f} at the start\n")
        for name in names:
            server = servers.start(server_kind(name, repositories[name]), [MODEL], Path(tmp))
            try:
                events, rate = trace(server, args, Path(tmp) / f"{name}.perf")
                inst = thread_ids(events, instance_pid(server))
                srv = thread_ids(events, server.pid)
            finally:
                server.stop()
            where = placement(events, srv)
            print(f"### {name}: {rate:,.0f} infer/s while traced; {len(srv)} server threads, {len(inst)} "
                  "instance threads seen\n")
            print("\n".join(table(state_split(events, inst, srv))))
            print(f"\nWake-ups issued by the server's threads: {where.wakeups}, of which "
                  f"{where.on_own_cpu_other_idle} put the woken thread on the waker's own CPU while another "
                  f"CPU was idle. The server's threads were preempted {where.preempted} times, "
                  f"{where.preempted_other_idle} of them while another CPU was idle.\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
