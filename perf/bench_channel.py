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
"""

from __future__ import annotations

import argparse
import asyncio
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_channel.") as tmp:
        shutil.copytree(ROOT / "model_repository" / "simple", Path(tmp) / "simple")
        uvloop.run(run(Path(tmp), args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
