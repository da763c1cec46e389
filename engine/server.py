"""Wires the repository, the data plane, the frontends and metrics; start, ready, drain, stop.

Shutdown order keeps every accepted request: readiness turns false, the frontends stop accepting new
connections and wait for in-flight calls, the models drain their queues, then everything is freed.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time

from . import (
    heap,
    kinds,  # noqa: F401  (registers every plug-in kind of model with the repository)
    native,
)
from .access.policy import policies
from .dataplane import DataPlane
from .frontend import wire
from .frontend.build import build_frontends
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
from .frontend.options import (
    AccessInputs,
    FrontendOptions,
    GrpcOptions,
    LogOptions,
    RestrictionSecrets,
    TlsOptions,
)
from .frontend.tls import TlsSettings, handshake_timeout_secs
from .generate.serving.registry import GenerationRegistry
from .instances.canary import CanaryOptions, CanaryRunner
from .instances.devices import discover_visible_gpus
from .instances.rate_limiter import RateLimiter
from .lifecycle_log import process_age_s, ready_line
from .observability import histograms, observe
from .observability.gpu_metrics import GpuSampler, load_nvml, open_sampler
from .observability.histograms import parse_metrics_config
from .observability.metrics import process_registry, render
from .observability.tracing.otlp import OtlpExporter
from .observability.tracing.settings import TraceSettings, parse_trace_config
from .openai.batch.runner import BatchRunner
from .openai.embedding_service import EmbeddingService
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
        every = {name: count for name, count, device in options.rate_limit_resources if device is None}
        one = {(name, device): count for name, count, device in options.rate_limit_resources
               if device is not None}
        limiter = RateLimiter(options.max_concurrent_executions, every, one)
        self.gpus = discover_visible_gpus()  # the GPU metrics' devices; placement's are their ordinals
        self.repository = ModelRepository(options.model_repository, limiter,
                                          tuple(g.ordinal for g in self.gpus),
                                          allow_python_uploads=options.allow_python_model_upload,
                                          files_root=options.model_files_root,
                                          backlog=BacklogLimits(options.max_sequence_backlog,
                                                                options.max_sequence_backlog_per_key,
                                                                options.max_sequence_queue))
        shm = ShmLimits(options.client_shm_max_regions, options.client_shm_max_regions_per_key,
                        options.client_shm_prefixes)
        self.dataplane = DataPlane(self.repository, options.strict_readiness, options.allow_client_shm,
                                   options.max_message_bytes, options.model_control_mode, shm)
        wire.configure(self.tensor_limits())
        # The generative models' engines (one per version, built and checked while it loads), for the OpenAI
        # API on the HTTP port; here, in the process that holds the repository, whatever --workers says.
        self.generation = GenerationRegistry(self.repository, self.repository.gpus,
                                             options.kv_cache_memory_bytes)
        self.repository.generation = self.generation  # Triton's side of the same engines (ModelStreamInfer)
        keys = options.access().keys
        self.openai = OpenAIService(self.generation, keys, options.trust_request_chat_template,
                                    EmbeddingService(self.repository, self.dataplane))
        self.generation.token_quotas = self.openai.quotas  # one bucket per key for both APIs' generation
        self.batches = None if options.batch_dir is None else BatchRunner(
            options.batch_dir, self.openai, options.batch_limits(), options.batch_requests_in_flight, keys,
            options.batch_shared, options.batch_claim_interval_secs)
        self._started = time.monotonic()  # for the ready line's "ready in" where /proc cannot say
        self._listeners: Listeners | None = None
        self._http: http_frontend.HttpApp | None = None
        self._http_servers: list[asyncio.Server] = []
        self._metrics: http_frontend.HttpApp | None = None
        self._process_metrics = process_registry()  # the process's memory and CPU, on each metrics page
        self._gpu_metrics: GpuSampler | None = None  # made in start(), after the ports are bound
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
        # After the ports (a taken one is the only line), before the models: decided as `engine` was imported;
        # a stale build is a warning to rebuild
        compiled = native.status()
        (log.warning if compiled.stale else log.info)("%s", compiled.line())
        self.http_port, self.grpc_port = self._listeners.http_port, self._listeners.grpc_port
        self.metrics_port = self._listeners.metrics_port
        self._exporter = observe.install_tracing(self.trace)  # the engine's: its batchers see every request
        await self._start_gpu_metrics()
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

    def frontend_options(self, frontends: int = 1) -> FrontendOptions:
        """What the HTTP and gRPC frontends are built from (frontend/build.py); `frontends`: the processes
        splitting the server-wide limits (connections, gRPC health watches, access budgets)."""
        opts = self.options
        http = HttpLimits(opts.http_max_input_bytes or opts.max_message_bytes, opts.max_header_bytes,
                          opts.max_header_count, opts.client_timeout_secs, opts.idle_timeout_secs)
        h2 = Limits(max_concurrent_streams=opts.grpc_max_concurrent_streams,
                    max_header_list_bytes=opts.max_header_bytes,
                    max_buffered_request_bytes=2 * opts.max_message_bytes,
                    max_queued_response_bytes=2 * opts.max_message_bytes,
                    client_timeout_secs=opts.client_timeout_secs, idle_timeout_secs=opts.idle_timeout_secs)
        calls = CallLimits(max_stream_requests=opts.grpc_max_stream_requests,
                           max_watches=max(1, opts.grpc_max_health_watches // frontends))
        tls = TlsOptions(opts.http_tls, opts.grpc_tls, handshake_timeout_secs(opts.client_timeout_secs))
        access = AccessInputs(None if opts.api_keys_file is None else str(opts.api_keys_file),
                              opts.max_inflight_bytes, tuple(opts.remote_admin_apis), opts.quota_replicas)
        log = LogOptions(opts.log_file, opts.log_format, opts.log_verbose, opts.log_info, opts.log_warning,
                         opts.log_error)
        return FrontendOptions(http, GrpcOptions(opts.max_message_bytes, h2, calls), tls,
                               ConnectionLimits(opts.max_connections, opts.max_connections_per_client),
                               self.tensor_limits(), access, log, frontends, opts.exit_timeout_secs)

    async def _start_protocols(self) -> None:
        """One process: HTTP and gRPC served here."""
        options = self.frontend_options()
        routes = HttpRoutes(self.dataplane, options.http, openai=self._openai_routes())
        frontends = build_frontends(options, self.options.access(), routes, GrpcHandlers(self.dataplane))
        self._http, self._grpc = frontends.http, frontends.grpc
        assert self._listeners is not None  # start() bound them
        self._http_servers = await http_frontend.serve(self._http, self._listeners.http, frontends.http_ssl,
                                                       frontends.handshake_timeout_secs)
        self._grpc.add_sockets(self._listeners.grpc)
        await self._grpc.start()

    async def _start_frontends(self) -> None:
        """N frontend processes (engine/workers/): the listening sockets are bound and accepted on here, and
        each connection handed to the frontend with the fewest, so the ports stay fixed whichever frontend
        serves and a restarted one serves on."""
        opts = self.options
        assert self._listeners is not None  # start() bound them
        options = self.frontend_options(opts.workers)
        # No secret in the options: they are a frontend's command line, which `ps` and /proc/<pid>/cmdline
        # show to every local user. The keys file goes by its path (the frontend reads it); the restriction
        # flags, whose values are secrets, through a pipe (supervisor.py).
        secrets = RestrictionSecrets(tuple(opts.http_restricted_apis), tuple(opts.grpc_restricted_protocols))
        policies(opts.access(), opts.workers)  # a limit that cannot be split fails here, not in a frontend
        # /v1 requests are forwarded here and answered by the same routes; streams go back in pieces
        # (workers/streams.py)
        self._control = ControlRunner(self.dataplane, options.http, self._openai_routes())
        self._frontends = FrontendPool(opts.workers, self.dataplane, self._control, self._listeners.http,
                                       self._listeners.grpc, options, opts.worker_arena_bytes, secrets)
        await self._frontends.start()

    def _openai_routes(self) -> OpenAIRoutes:
        """The OpenAI API's router, in the process that holds the engines; with vLLM's /metrics, the same
        page as the metrics port's (behind the API port's keys and restrictions: frontend/endpoints.py)."""
        return OpenAIRoutes(self.openai, self.batches, self._metrics_page,
                            lambda: self.dataplane.accepting)

    def _metrics_page(self) -> bytes:
        """The Prometheus page, rendered at each scrape (engine/observability/metrics.py)."""
        return render(self.repository.loaded_models(), self._process_metrics,
                      [driver.sample() for driver in self.generation.drivers()],
                      self._gpu_metrics.lines() if self._gpu_metrics is not None else ())

    async def _start_gpu_metrics(self) -> None:
        """Triton's GPU metrics, read on a thread of their own (gpu_metrics.py), unless
        --allow-gpu-metrics=false: with no NVML or no GPU, one info line and no GPU family. Whatever
        --metrics-port says: the HTTP port serves the same page."""
        opts = self.options
        if not opts.allow_gpu_metrics:
            return
        nvml = load_nvml()
        if nvml is not None:
            # nvmlInit and the first readings take a while on a real driver: not on the loop
            self._gpu_metrics = await asyncio.to_thread(open_sampler, nvml, self.gpus,
                                                        opts.metrics_interval_ms / 1000)
        if self._gpu_metrics is not None:
            self._gpu_metrics.start()

    async def _start_metrics(self) -> None:
        """The metrics port, on the HTTP/1.1 stack of the KServe port with its timeouts and connection caps
        of its own (frontend/http/metrics_routes.py); in the engine process whatever --workers says."""
        opts = self.options
        limits = HttpLimits(METRICS_MAX_BODY_BYTES, opts.max_header_bytes, opts.max_header_count,
                            opts.client_timeout_secs, opts.idle_timeout_secs)
        caps = ConnectionLimits(opts.metrics_max_connections, opts.metrics_max_connections_per_client,
                                "--metrics-max-connections")
        # refused connections linger (holding a descriptor each) no more than the port may hold open
        counter = ConnectionCounter(caps, max_lingering=min(MAX_LINGERING, opts.metrics_max_connections or
                                                            MAX_LINGERING))
        self._metrics = http_frontend.HttpApp(MetricsRoutes(self._metrics_page), limits, counter=counter)
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
        if self._gpu_metrics is not None:
            await asyncio.to_thread(self._gpu_metrics.stop)
        log.info("stopped")

    async def run_until_signalled(self) -> None:
        await self.start()
        heap.settle_after_load()
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

