"""What the `--workers N` channel costs per request, both ends in one process, without the noise of three
processes and a load generator sharing two cores.

    flock /work/probes/bench.lock env PYTHONPATH=. .venv/bin/python perf/bench_channel.py [--repeats 5]

A repository holding only `simple` (copied from the checkout's model_repository/, models built) is loaded into
a DataPlane. 16 concurrent tasks each send `simple` requests (two INT32[1,16] inputs, one RequestPlan
shared, as a codec's cached header would be) one after another, 20,000 in all, either straight to
`DataPlane.submit` or through `EngineClient.submit` (a frontend's) over a Unix socketpair to a
`FrontendSession` (the engine's) and back: the same frames, arenas and callbacks as across processes,
with both ends on this loop (uvloop). CPU time of this process per request (`time.process_time`), the
best of `--repeats` runs each, alternated; the difference is the channel's whole cost per request: both
ends' Python, the frames and their system calls. It measures the `engine` package the venv has
(`PYTHONPATH=.`: this checkout's, where a venv is shared); to measure another checkout, run its own copy.

`--python-hop`: the Python-model hop instead (issue 32), without a frontend or a load generator: one instance
process of `bench_pipelines.py`'s add_sub model.py (engine/backends/python/process.py), batches of 1 and of
8 requests (two INT32 [1,16] inputs each) sent one after another from this loop, `--batches` of each; the
CPU time per batch of this process (the engine's side: framing, the socket, the loop's reading, the futures)
and of the instance process (the stub: reading, pb_utils objects, the model, the answer), the best of
`--repeats`. `PYTHONPATH=<other checkout>` measures that checkout's engine (and its stub) with this script:

    flock /work/probes/bench.lock env PYTHONPATH=. .venv/bin/python perf/bench_channel.py --python-hop
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import uvloop

import engine.kinds  # noqa: F401  (every kind of model, as the server serves them)
from bench_pipelines import ADD_SUB_PY
from engine.backends.python.messages import RequestHeader
from engine.backends.python.process import InstanceProcess, LaunchSpec
from engine.dataplane import DataPlane
from engine.instances.rate_limiter import RateLimiter
from engine.repository.lifecycle import ModelRepository
from engine.shm.regions import Region
from engine.types import DataType, InferenceRequest, RequestPlan, Tensor
from engine.workers.remote import EngineClient
from engine.workers.session import FrontendSession
from hubserve_harness import ROOT

REQUESTS, CONCURRENCY = 20000, 16


async def drive(submit: Callable[..., Awaitable[Any]], request: Callable[[], Any], stats: Any
                ) -> tuple[float, float]:
    """CPU µs per request and the average batch, for REQUESTS sent by CONCURRENCY tasks."""
    left = [REQUESTS]

    async def client() -> None:
        while left[0] > 0:
            left[0] -= 1
            await submit(request(), time.perf_counter_ns())

    for _ in range(200):  # warm-up
        await submit(request(), 0)
    n0, e0 = stats.inference_count, stats.execution_count
    t0 = time.process_time()
    await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
    cpu = time.process_time() - t0
    return cpu / REQUESTS * 1e6, (stats.inference_count - n0) / max(stats.execution_count - e0, 1)


async def run(repo_dir: Path, repeats: int) -> None:

    loop = asyncio.get_running_loop()
    repository = ModelRepository(repo_dir, RateLimiter())
    await repository.load_all()
    try:
        dataplane = DataPlane(repository)
        stats = repository.get("simple", "").stats
        plan = RequestPlan()
        ones = np.ones((1, 16), np.int32)

        def request() -> InferenceRequest:
            inputs = [Tensor("INPUT0", DataType.INT32, (1, 16), ones),
                      Tensor("INPUT1", DataType.INT32, (1, 16), ones)]
            return InferenceRequest("simple", "", inputs, plan=plan)

        requests, responses = Region.create(16 << 20), Region.create(16 << 20)
        engine_end, frontend_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        handoff, _their_handoff = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        session = FrontendSession(0, dataplane, None, requests, responses, handoff,  # type: ignore[arg-type]
                                  lambda s: None)
        for end in (engine_end, frontend_end):
            end.setblocking(False)
        await loop.connect_accepted_socket(lambda: session, engine_end)
        client = EngineClient(requests, responses, lambda: None)
        await loop.connect_accepted_socket(lambda: client, frontend_end)
        direct, channel = [], []
        for _ in range(repeats):
            direct.append(await drive(dataplane.submit, request, stats))
            channel.append(await drive(client.submit, request, stats))
        d, c = min(direct), min(channel)
        print(f"direct {d[0]:.1f} µs/request (batch {d[1]:.1f}), through the channel {c[0]:.1f} (batch "
              f"{c[1]:.1f}): the channel costs {c[0] - d[0]:.1f} µs/request; runs "
              f"{[round(x[0], 1) for x in direct]} / {[round(x[0], 1) for x in channel]}")
        client.close()
    finally:
        await repository.close()


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def python_hop(folder: Path, batches: int, repeats: int) -> None:
    (folder / "1").mkdir()
    (folder / "1" / "model.py").write_text(ADD_SUB_PY)
    spec = LaunchSpec(sys.executable, folder / "1" / "model.py", folder, "add_sub/", "add_sub_0", {})
    proc = InstanceProcess(spec, lambda *a: None, lambda reason: None)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, proc.start)
    if hasattr(proc, "attach"):
        proc.attach(loop)

    async def call(headers: list[Any], tensors: list[Any]) -> Any:
        if hasattr(proc, "call_async"):
            return await proc.call_async(headers, tensors)
        return await asyncio.wrap_future(proc.call(headers, tensors))  # a checkout before issue 32

    zeros = np.zeros((1, 16), np.int32)
    try:
        for size in (1, 8):
            headers = [RequestHeader("", 0, 0, "{}", ["OUTPUT0", "OUTPUT1"], 2, 0)] * size
            tensors = [("INPUT0", DataType.INT32, zeros), ("INPUT1", DataType.INT32, zeros)] * size
            for _ in range(200):
                await call(headers, tensors)
            runs = []
            for _ in range(repeats):
                engine0, stub0, wall0 = time.process_time(), _cpu_s(proc.pid), time.perf_counter()
                for _ in range(batches):
                    await call(headers, tensors)
                runs.append(((time.process_time() - engine0) / batches * 1e6,
                             (_cpu_s(proc.pid) - stub0) / batches * 1e6,
                             (time.perf_counter() - wall0) / batches * 1e6))
            best = min(runs, key=lambda r: r[0] + r[1])
            print(f"batch of {size}: engine {best[0]:.0f} µs CPU, instance process {best[1]:.0f} µs CPU, "
                  f"round trip {best[2]:.0f} µs per batch (best of {repeats}; load "
                  f"{os.getloadavg()[0]:.1f})", flush=True)
    finally:
        await loop.run_in_executor(None, proc.stop)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--python-hop", action="store_true", help="the Python-model hop instead")
    parser.add_argument("--batches", type=int, default=2000, help="batches per run of --python-hop")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_channel.") as tmp:
        if args.python_hop:
            uvloop.run(python_hop(Path(tmp), args.batches, args.repeats))
            return 0
        shutil.copytree(ROOT / "model_repository" / "simple", Path(tmp) / "simple")
        uvloop.run(run(Path(tmp), args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
