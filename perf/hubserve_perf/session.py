"""Everything one run holds open, set up from the flags in the order perf_analyzer uses: server metadata
(does it list the statistics extension?), model metadata and config, the requests encoded once, then the
load processes. Shared by the sweep (cli.py) and the window tuner (tune.py); closed on exit, in reverse.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from . import client, control
from .inputs import build_requests, parse_shape
from .load import LoadGenerator, LoadSource
from .measure import MeasureSettings, StepResult, describe
from .types import LoadPlan, ModelInfo, Protocol
from .workers import ProcessLoad, WorkerSpec, default_workers

CLIENT_BOUND_SHARE = 0.9  # a load process busy this much of a step's windows warns that it set the pace


@dataclass
class Session:
    args: argparse.Namespace
    protocol: Protocol
    host: str
    port: int
    control: control.ControlClient
    model: ModelInfo
    settings: MeasureSettings
    load: LoadSource
    workers: int

    def progress(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def warn_if_delayed(self, step: StepResult) -> None:
        if step.plan.open_loop and step.delayed > 0.01 * max(step.request_count, 1):
            self.progress(f"warning: {step.delayed} of {step.request_count} requests at "
                          f"{describe(step.plan)} left more than 2 ms behind schedule, so the rate offered "
                          "was lower than asked: the client could not keep up (try --workers), or the server "
                          "fell so far behind that 4,096 requests were in flight")

    def warn_if_client_bound(self, step: StepResult) -> None:
        """A load process busy nearly all the time sets the pace itself: what it measured is partly its own
        speed (perf/README.md shows how far that moves a closed-loop number)."""
        if not step.duration_ns:
            return
        per_process = step.client_cpu_ns / step.duration_ns / max(self.workers, 1)
        if per_process >= CLIENT_BOUND_SHARE:
            hint = "more --workers" if self.workers < (os.cpu_count() or 1) else "a client machine of its own"
            self.progress(f"warning: at {describe(step.plan)} each load process was busy "
                          f"{100 * per_process:.0f} % of the time, so the client may have set the pace "
                          f"rather than the server: try {hint}")

    def describe(self) -> dict[str, Any]:
        a = self.args
        return {
            "model": self.model.name, "version": a.version, "url": f"{self.host}:{self.port}",
            "protocol": self.protocol.value, "batch_size": a.batch_size, "input_data": a.input_data,
            "shapes": a.shape, "measurement_interval_ms": a.interval_ms,
            "stability_percentage": a.stability_percentage, "max_trials": a.max_trials,
            "percentile": a.percentile or None, "workers": self.workers, "grpc_client": a.grpc_client,
            "grpc_calls_per_connection": a.grpc_calls_per_connection,
            "server_statistics": self.settings.server_stats,
        }


@asynccontextmanager
async def open_session(args: argparse.Namespace, largest: LoadPlan) -> AsyncIterator[Session]:
    """Connect, read the model, encode its requests, start the load processes sized for `largest`."""
    protocol = Protocol(args.protocol)
    host, port = control.split_url(args.url or f"localhost:{control.DEFAULT_PORTS[protocol]}", protocol)
    shapes = dict(parse_shape(s) for s in args.shape)
    ctl = control.connect(protocol, host, port)
    try:
        model = await ctl.model_info(args.model, args.version)
        extensions = await ctl.server_extensions()
        requests = build_requests(model, args.batch_size, args.input_data, shapes)
        wires = client.encode_requests(protocol, host, port, args.model, args.version, requests,
                                       model.outputs)
        settings = MeasureSettings(interval_ms=args.interval_ms,
                                   stability_percentage=args.stability_percentage,
                                   max_trials=args.max_trials, percentile=args.percentile,
                                   batch_size=args.batch_size, server_stats="statistics" in extensions)
        workers = args.workers or default_workers(largest.concurrency, largest.request_rate, host)
        if not largest.open_loop:
            workers = min(workers, largest.concurrency)
        spec = WorkerSpec(protocol, host, port, wires, args.grpc_client, args.grpc_calls_per_connection)
        load: LoadSource
        if workers == 1:
            connection = client.connect(protocol, host, port, args.grpc_client,
                                        args.grpc_calls_per_connection)
            load = LoadGenerator(connection, wires)
        else:
            load = await ProcessLoad.open(spec, workers)
        session = Session(args, protocol, host, port, ctl, model, settings, load, workers)
        session.progress(
            f"*** {args.model} at {host}:{port} over {protocol.value}: batch {args.batch_size}, "
            f"{args.interval_ms} ms measurement interval (windows of 1.2x), stable when 3 windows lie within "
            f"{args.stability_percentage:g}% (max/min) "
            f"(at most {args.max_trials}), on {f'p{args.percentile}' if args.percentile else 'avg'} latency, "
            f"{workers} load process{'es' if workers > 1 else ''}"
            + ("" if settings.server_stats else "; the server lists no statistics extension"))
        try:
            yield session
        finally:
            await load.close()
    finally:
        await ctl.close()
