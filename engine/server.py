"""Wires the repository, the data plane, the frontends and metrics; start, ready, drain, stop.

Shutdown order keeps every accepted request: readiness turns false, the frontends stop accepting new
connections and wait for in-flight calls, the models drain their queues, then everything is freed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import time

from .access.policy import policies
from .dataplane import DataPlane
from .frontend import wire
from .frontend.connections import MAX_LINGERING, ConnectionCounter, ConnectionLimits
from .frontend.grpc.app import CallLimits
from .frontend.grpc.handlers import GrpcHandlers
from .frontend.grpc.server import H2GrpcServer
from .frontend.h2.streams import Limits
from .frontend.http import app as http_frontend
from .frontend.http.metrics_routes import MAX_BODY_BYTES as METRICS_MAX_BODY_BYTES
from .frontend.http.metrics_routes import MetricsRoutes
from .frontend.http.routes import HttpRoutes
from .frontend.http.types import HttpLimits
from .frontend.listeners import Listeners, bind_ports
from .frontend.openai.routes import OpenAIRoutes
from .frontend.tls import ALPN_GRPC, ALPN_HTTP, TlsSettings, handshake_timeout_secs, server_context
from .generate.serving.registry import GenerationRegistry
from .instances.canary import CanaryOptions, CanaryRunner
from .instances.devices import discover_gpus
from .instances.rate_limiter import RateLimiter
from .lifecycle_log import process_age_s, ready_line
from .observability import histograms, observe
from .observability.histograms import parse_metrics_config
from .observability.metrics import process_registry, render
from .observability.tracing.otlp import OtlpExporter
from .observability.tracing.settings import TraceSettings, parse_trace_config
from .openai.batch.runner import BatchRunner
from .openai.service import OpenAIService
from .options import ServerOptions
from .repository.lifecycle import ModelRepository
from .repository.watcher import RepositoryWatcher
from .scheduling.sequence.policy import BacklogLimits
from .shm.client import ShmLimits
from .workers.control import ControlRunner
from .workers.supervisor import FrontendPool

log = logging.getLogger("hubserve")


class Server:
    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        config = parse_metrics_config(list(options.metrics_config))  # before any model's stats exist
        histograms.CONFIG.enabled, histograms.CONFIG.buckets_us = config.enabled, config.buckets_us
        values, mode, exporter = parse_trace_config(list(options.trace_config))
        self.trace = TraceSettings(values, mode, exporter)
        self._exporter: OtlpExporter | None = None
        limiter = RateLimiter(options.max_concurrent_executions, options.rate_limit_resources)
        self.repository = ModelRepository(options.model_repository, limiter, discover_gpus(),
                                          allow_python_uploads=options.allow_python_model_upload,
                                          backlog=BacklogLimits(options.max_sequence_backlog,
                                                                options.max_sequence_backlog_per_key,
                                                                options.max_sequence_queue))
        shm = ShmLimits(options.client_shm_max_regions, options.client_shm_max_regions_per_key,
                        options.client_shm_prefixes)
        self.dataplane = DataPlane(self.repository, options.strict_readiness, options.allow_client_shm,
                                   options.max_message_bytes, options.model_control_mode, shm)
        wire.configure(self.tensor_limits())
        # The generative models' engines (one per version, built on first use), for the OpenAI API on the
        # HTTP port; here, in the process that holds the repository, whatever --workers says.
        self.generation = GenerationRegistry(self.repository)
        self.repository.generation = self.generation  # Triton's side of the same engines (ModelStreamInfer)
        keys = options.access().keys
        self.openai = OpenAIService(self.generation, keys)
        self.generation.token_quotas = self.openai.quotas  # one bucket per key for both APIs' generation
        self.batches = None if options.batch_dir is None else BatchRunner(
            options.batch_dir, self.openai, options.batch_limits(), options.batch_requests_in_flight, keys)
        self._started = time.monotonic()  # for the ready line's "ready in" where /proc cannot say
        self._listeners: Listeners | None = None
        self._http: http_frontend.HttpApp | None = None
        self._http_servers: list[asyncio.Server] = []
        self._metrics: http_frontend.HttpApp | None = None
        self._metrics_servers: list[asyncio.Server] = []
        self._grpc: H2GrpcServer | None = None
        self._frontends: FrontendPool | None = None
        self._control: ControlRunner | None = None
        self._poller: asyncio.Task[None] | None = None
        self._canaries: asyncio.Task[None] | None = None
        self.http_port = options.http_port
        self.grpc_port = options.grpc_port
        self.metrics_port = options.metrics_port

    async def start(self) -> None:
        """Bind the ports (PortError, naming the flag, before any model loads), load the models, serve, and
        write the ready line."""
        opts = self.options
        self._listeners = bind_ports(opts.host, opts.http_port, opts.grpc_port, opts.metrics_port)
        self.http_port, self.grpc_port = self._listeners.http_port, self._listeners.grpc_port
        self.metrics_port = self._listeners.metrics_port
        self._exporter = observe.install_tracing(self.trace)  # the engine's: its batchers see every request
        self._exporter.start()
        if opts.model_control_mode == "explicit":
            await asyncio.gather(*(self.repository.load(name) for name in opts.load_models))
        else:
            await self.repository.load_all()
        if self.batches is not None:  # the models are loaded: jobs the last run left unfinished go on
            self.batches.resume()
        if opts.workers > 1:
            await self._start_frontends()
        else:
            await self._start_protocols()

        if opts.metrics_port:
            await self._start_metrics()

        if opts.model_control_mode == "poll":
            watcher = RepositoryWatcher(self.repository, opts.repository_poll_secs,
                                        opts.repository_quiet_secs, opts.repository_events)
            self._poller = asyncio.get_running_loop().create_task(watcher.run())
        if opts.canary_interval_secs > 0:
            runner = CanaryRunner(self.repository, CanaryOptions(opts.canary_interval_secs,
                                                                 opts.canary_timeout_secs))
            self._canaries = asyncio.get_running_loop().create_task(runner.run())
        log.info("%s", ready_line(process_age_s(self._started), self.repository.index(), self._where()))

    def _where(self) -> str:
        """Where the ready line says the server listens."""
        opts = self.options
        metrics = f"on {opts.host}:{self.metrics_port}" if opts.metrics_port else "off"
        processes = f"; {opts.workers} frontend processes" if opts.workers > 1 else ""
        return (f"HTTP{_tls_words(opts.http_tls)} on {opts.host}:{self.http_port}, gRPC"
                f"{_tls_words(opts.grpc_tls)} on {opts.host}:{self.grpc_port}, metrics {metrics}{processes}")

    def tensor_limits(self) -> wire.TensorLimits:
        opts = self.options
        return wire.TensorLimits(opts.max_tensor_elements, opts.max_bytes_element_bytes, opts.max_json_depth)

    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits(self.options.max_connections, self.options.max_connections_per_client)

    def _http_limits(self) -> http_frontend.HttpLimits:
        opts = self.options
        return http_frontend.HttpLimits(opts.http_max_input_bytes or opts.max_message_bytes,
                                        opts.max_header_bytes, opts.max_header_count,
                                        opts.client_timeout_secs, opts.idle_timeout_secs)

    def _h2_limits(self) -> Limits:
        opts = self.options
        return Limits(max_concurrent_streams=opts.grpc_max_concurrent_streams,
                      max_header_list_bytes=opts.max_header_bytes,
                      max_buffered_request_bytes=2 * opts.max_message_bytes,
                      max_queued_response_bytes=2 * opts.max_message_bytes,
                      client_timeout_secs=opts.client_timeout_secs,
                      idle_timeout_secs=opts.idle_timeout_secs)

    def call_limits(self, share: int = 1) -> CallLimits:
        """What gRPC calls may hold; `share`: the frontend processes splitting the server-wide ones."""
        opts = self.options
        return CallLimits(max_stream_requests=opts.grpc_max_stream_requests,
                          max_watches=max(1, opts.grpc_max_health_watches // share))

    async def _start_protocols(self) -> None:
        """One process: HTTP and gRPC served here."""
        opts = self.options
        handshake_secs = handshake_timeout_secs(opts.client_timeout_secs)
        counter = ConnectionCounter(self.connection_limits())  # HTTP and gRPC together
        access = opts.access()
        http_access, grpc_access = policies(access)
        limits = self._http_limits()
        routes = HttpRoutes(self.dataplane, limits, openai=OpenAIRoutes(self.openai, self.batches))
        self._http = http_frontend.HttpApp(routes, limits, counter=counter,
                                           access=http_access, loopback_only=access.loopback_only(grpc=False))
        http_ssl = server_context(opts.http_tls, ALPN_HTTP) if opts.http_tls else None
        assert self._listeners is not None  # start() bound them
        self._http_servers = await http_frontend.serve(self._http, self._listeners.http, http_ssl,
                                                       handshake_secs)

        grpc_ssl = server_context(opts.grpc_tls, ALPN_GRPC) if opts.grpc_tls else None
        self._grpc = H2GrpcServer(GrpcHandlers(self.dataplane), opts.max_message_bytes, self._h2_limits(),
                                  ssl_context=grpc_ssl, handshake_timeout_secs=handshake_secs,
                                  counter=counter, access=grpc_access,
                                  loopback_only=access.loopback_only(grpc=True),
                                  call_limits=self.call_limits())
        self._grpc.add_sockets(self._listeners.grpc)
        await self._grpc.start()

    async def _start_frontends(self) -> None:
        """N frontend processes (engine/workers/): the listening sockets are bound and accepted on here, and
        each connection handed to the frontend with the fewest, so the ports stay fixed whichever frontend
        serves and a restarted one serves on."""
        opts = self.options
        assert self._listeners is not None  # start() bound them
        http_sockets, grpc_sockets = self._listeners.http, self._listeners.grpc
        http = self._http_limits()
        h2 = self._h2_limits()
        spec = {"http": {"max_body_bytes": http.max_body_bytes, "max_header_bytes": http.max_header_bytes,
                         "max_header_count": http.max_header_count,
                         "client_timeout_secs": http.client_timeout_secs,
                         "idle_timeout_secs": http.idle_timeout_secs},
                "grpc": {"max_message_bytes": opts.max_message_bytes,
                         "max_concurrent_streams": h2.max_concurrent_streams,
                         "max_header_list_bytes": h2.max_header_list_bytes,
                         "max_buffered_request_bytes": h2.max_buffered_request_bytes,
                         "max_queued_response_bytes": h2.max_queued_response_bytes,
                         "client_timeout_secs": h2.client_timeout_secs,
                         "idle_timeout_secs": h2.idle_timeout_secs,
                         "call_limits": dataclasses.asdict(self.call_limits(opts.workers))},
                "tls": {"http": opts.http_tls.to_spec() if opts.http_tls else None,
                        "grpc": opts.grpc_tls.to_spec() if opts.grpc_tls else None,
                        "handshake_timeout_secs": handshake_timeout_secs(opts.client_timeout_secs)},
                "exit_timeout_secs": opts.exit_timeout_secs, "log_verbose": opts.log_verbose,
                "log": {"log_file": opts.log_file, "log_format": opts.log_format,
                        "log_verbose": opts.log_verbose,
                        "log_info": opts.log_info, "log_warning": opts.log_warning,
                        "log_error": opts.log_error},
                "tensor_limits": dataclasses.asdict(self.tensor_limits()),
                "connection_limits": dataclasses.asdict(self.connection_limits()),
                "frontends": opts.workers,
                # No secret here: the spec is a frontend's command line, which `ps` and /proc/<pid>/cmdline
                # show to every local user. The keys file goes by its path (the frontend reads it); the
                # restriction flags, whose values are secrets, through a pipe (`secrets`: supervisor.py).
                "access": {"api_keys_file": None if opts.api_keys_file is None else str(opts.api_keys_file),
                           "max_inflight_bytes": opts.max_inflight_bytes, "workers": opts.workers,
                           "remote_admin_apis": list(opts.remote_admin_apis)}}
        secrets = {"http_restricted_apis": list(opts.http_restricted_apis),
                   "grpc_restricted_protocols": list(opts.grpc_restricted_protocols)}
        policies(opts.access(), opts.workers)  # a limit that cannot be split fails here, not in a frontend
        # /v1 requests are forwarded here and answered by the same routes; streams go back in pieces
        # (workers/streams.py)
        self._control = ControlRunner(self.dataplane, http, OpenAIRoutes(self.openai, self.batches))
        self._frontends = FrontendPool(opts.workers, self.dataplane, self._control, http_sockets,
                                       grpc_sockets, spec, opts.worker_arena_bytes, secrets)
        await self._frontends.start()

    async def _start_metrics(self) -> None:
        """The metrics port, on the HTTP/1.1 stack of the KServe port with its timeouts and connection caps
        of its own (frontend/http/metrics_routes.py); in the engine process whatever --workers says."""
        opts = self.options
        registry = process_registry()

        def page() -> bytes:
            return render(self.repository.loaded_models(), registry, self.generation.drivers())

        limits = HttpLimits(METRICS_MAX_BODY_BYTES, opts.max_header_bytes, opts.max_header_count,
                            opts.client_timeout_secs, opts.idle_timeout_secs)
        caps = ConnectionLimits(opts.metrics_max_connections, opts.metrics_max_connections_per_client,
                                "--metrics-max-connections")
        # refused connections linger (holding a descriptor each) no more than the port may hold open
        counter = ConnectionCounter(caps, max_lingering=min(MAX_LINGERING, opts.metrics_max_connections or
                                                            MAX_LINGERING))
        self._metrics = http_frontend.HttpApp(MetricsRoutes(page), limits, counter=counter)
        assert self._listeners is not None  # start() bound them
        self._metrics_servers = await http_frontend.serve(self._metrics, self._listeners.metrics)

    async def stop(self) -> None:
        self.dataplane.accepting = False
        if self.batches is not None:  # first: the jobs' requests must not fail as their engines close
            await self.batches.close()
        for task in (self._poller, self._canaries):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        grace = self.options.exit_timeout_secs
        waits = []
        if self._grpc is not None:
            waits.append(self._grpc.stop(grace))
        if self._http is not None:
            waits.append(http_frontend.shutdown(self._http, self._http_servers, grace))
        if self._frontends is not None:
            waits.append(self._frontends.stop(grace))  # closes the listening sockets first
        await asyncio.gather(*waits, return_exceptions=True)
        if self._control is not None:
            await self._control.close()
        await self.generation.close()
        await self.repository.close()
        if self._exporter is not None:
            await self._exporter.close()
        if self._metrics is not None:  # last: scrapes see the drain
            await http_frontend.shutdown(self._metrics, self._metrics_servers, min(grace, 1.0))
        log.info("stopped")

    async def run_until_signalled(self) -> None:
        await self.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("shutting down: finishing in-flight requests")
        await self.stop()


def _tls_words(tls: TlsSettings | None) -> str:
    if tls is None:
        return ""
    return " over TLS with client certificates" if tls.mutual else " over TLS"

