"""The `hubserve` command line: `hubserve serve ...` (Triton-like flags), `hubserve perf ...` (load tester).

The load tester is a package of its own (perf/hubserve_perf/): `hubserve perf ARGS` is handed to it whole, and
it is imported only then, so the server never loads a client.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from . import __version__, logs
from .logs import LOG_FORMATS

PERF_HELP = "measure a server's throughput and latency (perf_analyzer-style); `hubserve perf --help` for more"


def _resource(text: str) -> tuple[str, int]:
    name, _, count = text.partition(":")
    if not name or not count.isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME:COUNT, got '{text}'")
    return name, int(count)


def _byte_count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number of bytes, got '{text}'")
    return int(text)


def _bool(text: str) -> bool:
    """Triton's boolean flags: `--log-info=false`, `--log-info false` or plain `--log-info`."""
    lowered = text.lower()
    if lowered in ("true", "1", "on", "yes"):
        return True
    if lowered in ("false", "0", "off", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def _verbose(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a verbose level (0 or more), got '{text}'")
    return int(text)


def _workers(text: str) -> int:
    """--workers: a count, or "auto" (0 here; resolved by default_workers)."""
    if text == "auto":
        return 0
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a number of processes (1 or more) or 'auto', "
                                         f"got '{text}'")
    return int(text)


AUTO_WORKERS_MIN_CORES = 4  # below this, one process: measured on 2 cores, frontends cost more than they free
AUTO_WORKERS = 2  # from there: two frontends already do as much work per inference as the one engine


def default_workers() -> int:
    """--workers auto: from the cores this process may use (its affinity, so a container's or taskset's limit
    counts). On 2 cores, shared with the load, --workers 2 and 3 served 35-55 % fewer inferences than one
    process; the engine process alone costs about what its frontends cost together per inference, so more
    than two frontends cannot add throughput while the engine is one thread (docs/architecture.md
    "Processes")."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 1 if cores < AUTO_WORKERS_MIN_CORES else AUTO_WORKERS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hubserve",
                                     description="Serve models over KServe v2 HTTP and gRPC.")
    parser.add_argument("--version", action="version", version=f"hubserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model repository",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    serve.add_argument("--model-repository", required=True, type=Path,
                       help="folder in Triton's layout: <repo>/<model>/config.pbtxt|config.yaml and "
                            "<repo>/<model>/<version>/model.onnx")
    serve.add_argument("--host", default="0.0.0.0", help="address to listen on")
    serve.add_argument("--http-port", type=int, default=8000, help="KServe v2 HTTP/REST port (0 = any free)")
    serve.add_argument("--grpc-port", type=int, default=8001, help="KServe v2 gRPC port (0 = any free)")
    serve.add_argument("--metrics-port", type=int, default=8002,
                       help="Prometheus /metrics port (0 = disabled)")
    serve.add_argument("--model-control-mode", choices=("none", "poll", "explicit"), default="poll",
                       help="none: load every model at start, never rescan; poll: load every model at start "
                            "and pick up added, changed and removed model folders; explicit: load only "
                            "--load-model at start, then only through the repository API")
    serve.add_argument("--repository-poll-secs", type=float, default=2.0,
                       help="poll mode: seconds between full repository scans (with file-system events on, "
                            "the safety net for missed events)")
    serve.add_argument("--repository-quiet-secs", type=float, default=1.0,
                       help="poll mode: a model folder is (re)loaded only once no file in it has changed for "
                            "this long, so a copy in progress is never loaded half-way")
    serve.add_argument("--repository-events", action=argparse.BooleanOptionalAction, default=True,
                       help="poll mode: react to file-system events (watchfiles) as well as scanning")
    serve.add_argument("--load-model", action="append", default=[], metavar="NAME",
                       help="with explicit mode: a model to load at start (repeatable)")
    serve.add_argument("--strict-readiness", action=argparse.BooleanOptionalAction, default=True,
                       help="/v2/health/ready needs every model ready (else: ready once the server is up)")
    serve.add_argument("--max-message-mb", type=int, default=64,
                       help="largest gRPC message accepted or sent, in MiB (and the HTTP body limit, unless "
                            "--http-max-input-size is given)")
    serve.add_argument("--http-max-input-size", type=_byte_count, default=0, metavar="BYTES",
                       help="largest HTTP request body, in bytes, as Triton's flag (0 = --max-message-mb)")
    serve.add_argument("--client-timeout-secs", type=float, default=30.0,
                       help="the longest a client may stall: a request head must arrive within it, a "
                            "request body or HTTP/2 preface may pause no longer, and a client that leaves "
                            "our answers unread that long is disconnected")
    serve.add_argument("--idle-timeout-secs", type=float, default=300.0,
                       help="a connection with no request in flight is closed after this long")
    serve.add_argument("--max-concurrent-executions", type=int, default=0,
                       help="server-wide cap on batches executing at once across all models (0 = no cap)")
    serve.add_argument("--rate-limit-resource", action="append", default=[], type=_resource,
                       metavar="NAME:COUNT",
                       help="server-wide count of a rate-limiter resource named in instance groups")
    serve.add_argument("--exit-timeout-secs", type=float, default=30.0,
                       help="on SIGTERM/SIGINT, how long to let in-flight requests finish")
    serve.add_argument("--workers", type=_workers, default="auto", metavar="N",
                       help="1: one process serves everything; N >= 2: one engine process (models, batchers, "
                            "statistics, metrics) and N frontend processes doing the HTTP and gRPC work; "
                            f"auto: 1 below {AUTO_WORKERS_MIN_CORES} usable cores, else {AUTO_WORKERS} "
                            "(docs/architecture.md \"Processes\")")
    serve.add_argument("--worker-arena-mb", type=int, default=16,
                       help="with --workers N >= 2: each frontend's shared-memory arenas (one for requests, "
                            "one for answers), in MiB; larger tensors cross inline over the socket")
    serve.add_argument("--allow-python-model-upload", action="store_true",
                       help="let a repository load request send the files of a Python model (code the "
                            "server runs); refused by default")
    serve.add_argument("--log-verbose", type=_verbose, default=0, metavar="N",
                       help="Triton's verbose level: 0 none; 1 or more: an access line per inference (model, "
                            "version, request id, status, queue, compute and total time, batch size) and "
                            "debug detail")
    serve.add_argument("--log-info", type=_bool, nargs="?", const=True, default=True, metavar="BOOL",
                       help="write INFO lines (access lines are INFO lines too)")
    serve.add_argument("--log-warning", type=_bool, nargs="?", const=True, default=True, metavar="BOOL",
                       help="write WARNING lines")
    serve.add_argument("--log-error", type=_bool, nargs="?", const=True, default=True, metavar="BOOL",
                       help="write ERROR lines")
    serve.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                       help="text, or json (one object a line; an access line is exactly model, version, "
                            "request_id, status, queue_us, compute_us, total_us, batch_size); Triton's "
                            "default and ISO8601 read as text")
    serve.add_argument("--log-file", default="", metavar="PATH",
                       help="append log lines to this file (default: standard error)")
    serve.add_argument("--metrics-config", action="append", default=[], metavar="SETTING=VALUE",
                       help="histogram_latencies=true|false (the request, queue and compute latency "
                            "histograms; on by default), histogram_buckets_us=50,100,... (their bounds)")
    serve.add_argument("--trace-config", action="append", default=[], metavar="[MODE,]SETTING=VALUE",
                       help="as Triton's: level=OFF|TIMESTAMPS|TENSORS, rate=N (one request in N), count=N "
                            "(-1: no limit), opentelemetry,url=http://host:4318/v1/traces (the OTLP/HTTP "
                            "collector), opentelemetry,resource=key=value, "
                            "opentelemetry,bsp_max_queue_size=N, opentelemetry,bsp_schedule_delay=MS, "
                            "opentelemetry,bsp_max_export_batch_size=N")
    # Listed for `hubserve --help` only: main() hands `perf ...` to the load tester before parsing.
    sub.add_parser("perf", help=PERF_HELP, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["perf"]:
        try:
            from hubserve_perf.cli import main as perf_main
        except ModuleNotFoundError as e:
            if e.name != "hubserve_perf":
                raise
            print("hubserve perf: the load tester (package hubserve_perf, perf/hubserve_perf/ in the "
                  "checkout) is not installed; run `pip install -e .` in the checkout", file=sys.stderr)
            return 2
        return perf_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        from .errors import EngineError
        from .server import Server, ServerOptions

        try:
            logs.configure(args.log_file, args.log_format, args.log_verbose, args.log_info, args.log_warning,
                           args.log_error)
        except (OSError, EngineError) as e:
            print(f"hubserve: cannot log to '{args.log_file}': {e}", file=sys.stderr)
            return 2
        if not args.model_repository.is_dir():
            print(f"hubserve: model repository '{args.model_repository}' is not a folder", file=sys.stderr)
            return 2
        options = ServerOptions(
            model_repository=args.model_repository.resolve(),
            host=args.host,
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            metrics_port=args.metrics_port,
            model_control_mode=args.model_control_mode,
            repository_poll_secs=args.repository_poll_secs,
            repository_quiet_secs=args.repository_quiet_secs,
            repository_events=args.repository_events,
            load_models=tuple(args.load_model),
            strict_readiness=args.strict_readiness,
            max_message_bytes=args.max_message_mb << 20,
            http_max_input_bytes=args.http_max_input_size,
            client_timeout_secs=args.client_timeout_secs,
            idle_timeout_secs=args.idle_timeout_secs,
            max_concurrent_executions=args.max_concurrent_executions,
            rate_limit_resources=dict(args.rate_limit_resource),
            exit_timeout_secs=args.exit_timeout_secs,
            workers=args.workers if args.workers else default_workers(),
            worker_arena_bytes=args.worker_arena_mb << 20,
            log_verbose=args.log_verbose,
            log_file=args.log_file,
            log_format=args.log_format,
            log_info=args.log_info,
            log_warning=args.log_warning,
            log_error=args.log_error,
            metrics_config=tuple(args.metrics_config),
            trace_config=tuple(args.trace_config),
            allow_python_model_upload=args.allow_python_model_upload,
        )
        # Instance threads need the GIL back to hand a finished batch to the loop. With the default 5 ms
        # switch interval a busy loop keeps it that long, so every batch waited up to 5 ms after it had
        # finished.
        sys.setswitchinterval(float(os.environ.get("HUBSERVE_SWITCH_INTERVAL_S", "0.0002")))
        run = asyncio.run
        try:
            import uvloop  # a faster event loop where available; the server is correct without it

            run = uvloop.run
        except ImportError:
            pass
        run(Server(options).run_until_signalled())
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
