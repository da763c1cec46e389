"""The load spread over several processes, for when one event loop cannot saturate the server.

Each worker is a spawned process with its own event loop, client and `LoadGenerator`; the parent's
`ProcessLoad` splits each step's plan between them (concurrency divided as evenly as possible, the request
rate divided with distinct seeds and interleaved phases) and merges their records. Timestamps come from the
machine-wide monotonic clock, so records of different processes compare directly.

The parent talks to each worker over a pipe: ("start", LoadPlan) | ("drain", None) | ("stop", None) |
("close", None), each answered ("ok", value) or ("error", message). A worker exits when its pipe closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from . import client
from .load import LoadGenerator
from .types import Drained, LoadPlan, PerfError, Protocol, Records

START_TIMEOUT_S = 60.0
REPLY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class WorkerSpec:
    protocol: Protocol
    host: str
    port: int
    wires: list[bytes]
    grpc_client: str = "h2"
    grpc_calls_per_connection: int | None = None


def default_workers(concurrency: int, request_rate: float, host: str) -> int:
    """One process per 32 requests in flight or 2,000 requests/s, at most one per core — half the cores
    when the server runs on this machine too, since it needs them as much as we do."""
    cores = os.cpu_count() or 1
    local = host in ("localhost", "127.0.0.1", "::1", "0.0.0.0") or host.startswith("127.")
    cap = max(1, cores // 2 if local else cores)
    wanted = max(-(-concurrency // 32), int(-(-request_rate // 2000)), 1)
    return min(wanted, cap)


def split_plan(plan: LoadPlan, workers: int) -> list[LoadPlan]:
    if plan.open_loop:
        return [LoadPlan(request_rate=plan.request_rate / workers, distribution=plan.distribution,
                         seed=plan.seed * 1009 + i, phase=i / workers) for i in range(workers)]
    base, extra = divmod(plan.concurrency, workers)
    return [LoadPlan(concurrency=base + (1 if i < extra else 0)) for i in range(workers)]


class ProcessLoad:
    """A LoadSource over `count` worker processes. Create with `await ProcessLoad.open(...)`."""

    def __init__(self, processes: list[Any], conns: list[Connection]) -> None:
        self._processes = processes
        self._conns = conns

    @classmethod
    async def open(cls, spec: WorkerSpec, count: int) -> ProcessLoad:
        ctx = multiprocessing.get_context("spawn")  # grpc's threads do not survive fork
        processes, conns = [], []
        for _ in range(count):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(child, spec), daemon=True)
            proc.start()
            child.close()
            processes.append(proc)
            conns.append(parent)
        load = cls(processes, conns)
        try:
            await asyncio.gather(*(_reply(c, START_TIMEOUT_S) for c in conns))
        except BaseException:
            await load.close()
            raise
        return load

    async def _all(self, commands: list[tuple[str, Any]]) -> list[Any]:
        for conn, command in zip(self._conns, commands, strict=True):
            conn.send(command)
        return list(await asyncio.gather(*(_reply(c, REPLY_TIMEOUT_S) for c in self._conns)))

    async def start(self, plan: LoadPlan) -> None:
        await self._all([("start", p) for p in split_plan(plan, len(self._conns))])

    async def drain(self) -> Drained:
        answers = await self._all([("drain", None)] * len(self._conns))
        return Drained(Records.concat([Records(*columns) for columns, _, _ in answers]),
                       sum(late for _, late, _ in answers), sum(cpu for _, _, cpu in answers))

    async def stop(self) -> None:
        await self._all([("stop", None)] * len(self._conns))

    async def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send(("close", None))
        loop = asyncio.get_running_loop()
        for proc in self._processes:
            await loop.run_in_executor(None, proc.join, 10)
            if proc.is_alive():
                proc.terminate()
                await loop.run_in_executor(None, proc.join, 5)
        for conn in self._conns:
            conn.close()


async def _receive(conn: Connection) -> Any:
    """conn.recv() on a thread, so the event loop keeps driving load meanwhile. (Not loop.add_reader: uvloop
    makes the descriptor non-blocking, and then a large message arrives in pieces that recv() cannot take.)"""
    return await asyncio.get_running_loop().run_in_executor(None, conn.recv)


async def _reply(conn: Connection, timeout_s: float) -> Any:
    try:
        status, value = await asyncio.wait_for(_receive(conn), timeout_s)
    except (EOFError, OSError):
        raise PerfError("a load worker process died; run with --workers 1 to see its error") from None
    except asyncio.TimeoutError:
        raise PerfError(f"a load worker process did not answer within {timeout_s:.0f} s") from None
    if status == "error":
        raise PerfError(value)
    return value


# ------------------------------------------------------------------------------------------ worker process


def run_loop(main: Any) -> Any:
    """Run a coroutine on uvloop where available (a faster loop; the tool is correct without it)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def worker_main(conn: Connection, spec: WorkerSpec) -> None:
    """Entry point of a worker process."""
    run_loop(_serve(conn, spec))


async def _serve(conn: Connection, spec: WorkerSpec) -> None:
    generator = LoadGenerator(client.connect(spec.protocol, spec.host, spec.port, spec.grpc_client,
                                              spec.grpc_calls_per_connection), spec.wires)
    conn.send(("ok", None))
    while True:
        try:
            command, arg = await _receive(conn)
        except (EOFError, OSError):  # the parent went away
            await generator.close()
            return
        try:
            if command == "start":
                await generator.start(arg)
                conn.send(("ok", None))
            elif command == "drain":
                drained = await generator.drain()
                r = drained.records
                timing = (r.start_ns, r.end_ns, r.send_ns, r.recv_ns)
                conn.send(("ok", (timing, drained.delayed, drained.cpu_ns)))
            elif command == "stop":
                await generator.stop()
                conn.send(("ok", None))
            elif command == "close":
                await generator.close()
                return
        except PerfError as e:
            conn.send(("error", e.message))
