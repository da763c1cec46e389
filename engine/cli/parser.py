"""`hubserve serve`'s flags: Triton's names and meanings where Triton has the flag, in groups by topic, each
default printed once (flags.py). serve.py turns what they parse into `ServerOptions`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .. import __version__
from ..generate.serving.kv_budget import parse_bytes
from ..observability.logs import LOG_FORMATS
from .flags import HelpFormatter, TritonBool

PERF_HELP = "measure a server's throughput and latency (perf_analyzer-style); `hubserve perf --help` for more"


def _resource(text: str) -> tuple[str, int, int | None]:
    """Triton's `--rate-limit-resource NAME:COUNT[:DEVICE]`: the device None means every device."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not all(p.isdigit() for p in parts[1:]):
        raise argparse.ArgumentTypeError(f"expected NAME:COUNT or NAME:COUNT:DEVICE, got '{text}'")
    return parts[0], int(parts[1]), int(parts[2]) if len(parts) == 3 else None


def _byte_count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number of bytes, got '{text}'")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds (0 or more), got '{text}'")
    return value


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number, 1 or more, got '{text}'")
    return int(text)


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"expected a port number (0 to 65535), got '{text}'")
    return int(text)


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


SERVE_USAGE = "hubserve serve --model-repository DIR [FLAGS]"
SERVE_DESCRIPTION = ("Serve a model repository over KServe v2 HTTP and gRPC (and the OpenAI API on the HTTP "
                     "port). The flags by topic; Triton's flags keep Triton's names and spellings.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hubserve",
                                     description="Serve models over KServe v2 HTTP and gRPC.")
    parser.add_argument("--version", action="version", version=f"hubserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model repository", usage=SERVE_USAGE,
                           description=SERVE_DESCRIPTION, formatter_class=HelpFormatter)
    for add_flags in (_repository_flags, _network_flags, _process_flags, _limit_flags, _scheduling_flags,
                      _generation_flags, _access_flags, _client_shm_flags, _tls_flags, _batch_api_flags,
                      _logging_flags, _metrics_flags):
        add_flags(serve)
    # Listed for `hubserve --help` only: main() hands `perf ...` to the load tester before parsing.
    sub.add_parser("perf", help=PERF_HELP, add_help=False)
    return parser


def _repository_flags(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group("models and the repository")
    group.add_argument("--model-repository", required=True, type=Path, metavar="DIR",
                       help="folder in Triton's layout: <repo>/<model>/config.pbtxt|config.yaml and "
                            "<repo>/<model>/<version>/model.onnx")
    group.add_argument("--single-model-name", default=None, metavar="NAME",
                       help="when --model-repository holds one model's files directly (a model.onnx at its "
                            "top, KServe's ONNX layout), serve them as a one-model repository under this "
                            "name (default: the folder's name); ignored for a repository")
    group.add_argument("--model-control-mode", choices=("none", "poll", "explicit"), default="poll",
                       help="none: load every model at start, never rescan; poll: load every model at start "
                            "and pick up added, changed and removed model folders; explicit: load only "
                            "--load-model at start, then only through the repository API (its load and "
                            "unload are refused in none and poll, as in Triton)")
    group.add_argument("--repository-poll-secs", type=float, default=2.0, metavar="SECS",
                       help="poll mode: seconds between full repository scans (with file-system events on, "
                            "the safety net for missed events)")
    group.add_argument("--repository-quiet-secs", type=float, default=1.0, metavar="SECS",
                       help="poll mode: a model folder is (re)loaded only once no file in it has changed for "
                            "this long, so a copy in progress is never loaded half-way")
    group.add_argument("--repository-events", action=argparse.BooleanOptionalAction, default=True,
                       help="poll mode: react to file-system events (watchfiles) as well as scanning")
    group.add_argument("--load-model", action="append", default=[], metavar="NAME",
                       help="with explicit mode: a model to load at start (repeatable)")
    group.add_argument("--strict-readiness", action=TritonBool, negative=True, default=True,
                       help="/v2/health/ready needs every model ready (else: ready once the server is up); "
                            "--strict-readiness=false as Triton writes it, or --no-strict-readiness")
    group.add_argument("--allow-python-model-upload", action="store_true",
                       help="let a repository load request send the files of a Python model (code the "
                            "server runs); refused without this flag")
    group.add_argument("--canary-interval-secs", type=_seconds, default=10.0, metavar="SECS",
                       help="every this many seconds, a synthetic inference on each instance of each served "
                            "version; one that fails or misses --canary-timeout-secs makes the version not "
                            "ready until one passes (0 = no canaries)")
    group.add_argument("--canary-timeout-secs", type=_seconds, default=5.0, metavar="SECS",
                       help="the deadline of a canary inference")


def _network_flags(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group("network")
    group.add_argument("--host", default="0.0.0.0", metavar="ADDRESS", help="address to listen on")
    group.add_argument("--http-port", type=_port, default=8000, metavar="PORT",
                       help="KServe v2 HTTP/REST port, and the OpenAI API's (0 = any free)")
    group.add_argument("--grpc-port", type=_port, default=8001, metavar="PORT",
                       help="KServe v2 gRPC port (0 = any free)")
    group.add_argument("--client-timeout-secs", type=float, default=30.0, metavar="SECS",
                       help="the longest a client may stall: a request head must arrive within it, a "
                            "request body or HTTP/2 preface may pause no longer, and a client that leaves "
                            "our answers unread that long is disconnected")
    group.add_argument("--idle-timeout-secs", type=float, default=300.0, metavar="SECS",
                       help="a connection with no request in flight is closed after this long")
    group.add_argument("--max-connections", type=_byte_count, default=4096, metavar="N",
                       help="connections the server holds at once, HTTP and gRPC together (0 = no limit); "
                            "more are answered 503 (HTTP) or GOAWAY (gRPC) and closed")
    group.add_argument("--max-connections-per-client", type=_byte_count, default=1024, metavar="N",
                       help="connections one client address may hold at once (0 = no limit)")


def _process_flags(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group("processes")
    group.add_argument("--workers", type=_workers, default="auto", metavar="N",
                       help="1: one process serves everything; N >= 2: one engine process (models, batchers, "
                            "statistics, metrics) and N frontend processes doing the HTTP and gRPC work; "
                            f"auto: 1 below {AUTO_WORKERS_MIN_CORES} usable cores, else {AUTO_WORKERS} "
                            "(docs/architecture.md \"Processes\")")
    group.add_argument("--worker-arena-mb", type=int, default=16, metavar="MB",
                       help="with --workers N >= 2: each frontend's shared-memory arenas (one for requests, "
                            "one for answers), in MiB; larger tensors cross inline over the socket")
    group.add_argument("--exit-timeout-secs", type=float, default=30.0, metavar="SECS",
                       help="on SIGTERM/SIGINT, how long to let in-flight requests finish")


def _limit_flags(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group("what one request may hold")
    group.add_argument("--max-message-mb", type=int, default=64, metavar="MB",
                       help="largest gRPC message accepted or sent, in MiB (and the HTTP body limit, unless "
                            "--http-max-input-size is given)")
    group.add_argument("--http-max-input-size", type=_byte_count, default=0, metavar="BYTES",
                       help="largest HTTP request body, in bytes, as Triton's flag (0 = --max-message-mb)")
    group.add_argument("--max-tensor-elements", type=_count, default=1 << 31, metavar="N",
                       help="most elements one input tensor may have; a shape claiming more is refused "
                            "before anything is allocated")
    group.add_argument("--max-bytes-element-size", type=_byte_count, default=16 << 20, metavar="BYTES",
                       help="largest single element of a BYTES (string) input")
    group.add_argument("--max-json-depth", type=_count, default=32, metavar="N",
                       help="deepest nesting of objects and arrays in an HTTP request's JSON (the document "
                            "itself is 1; an input's data of rank R sits at 3 + R)")
    group.add_argument("--max-inflight-bytes", type=_byte_count, default=0, metavar="BYTES",
                       help="server-wide budget of request bytes received and not yet answered; a request "
                            "that does not fit is refused at once (HTTP 429 + Retry-After, gRPC "
                            "RESOURCE_EXHAUSTED) before its body is read (0 = no budget)")
    group.add_argument("--grpc-max-concurrent-streams", type=_count, default=1024, metavar="N",
                       help="HTTP/2 streams one gRPC connection may have open "
                            "(SETTINGS_MAX_CONCURRENT_STREAMS); more are refused with REFUSED_STREAM")
    group.add_argument("--grpc-max-stream-requests", type=_count, default=1024, metavar="N",
                       help="requests one gRPC ModelStreamInfer stream may have in flight; at it, the stream "
                            "is not read (HTTP/2 flow control) until one is answered")
    group.add_argument("--grpc-max-health-watches", type=_count, default=1024, metavar="N",
                       help="grpc.health.v1 Health/Watch streams open at once, server-wide (and at most 16 "
                            "per connection); more are refused RESOURCE_EXHAUSTED")


def _scheduling_flags(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group("execution, batching and sequences")
    group.add_argument("--max-concurrent-executions", type=int, default=0, metavar="N",
                       help="server-wide cap on batches executing at once across all models (0 = no cap)")
    group.add_argument("--rate-limit-resource", action="append", default=[], type=_resource,
                       metavar="NAME:COUNT[:DEVICE]",
                       help="copies of a rate-limiter resource named in instance groups: on every device "
                            "(and for a global resource, the one set), or on DEVICE only; repeatable")
    group.add_argument("--max-sequence-backlog", type=_byte_count, default=4096, metavar="N",
                       help="sequences a sequence model (each version) lets wait for a slot once every slot "
                            "is taken; a START past it is refused (HTTP 429, gRPC UNAVAILABLE); 0 = no limit")
    group.add_argument("--max-sequence-backlog-per-key", type=_byte_count, default=1024, metavar="N",
                       help="of those, how many one API key may have waiting (with --api-keys; 0 = no limit)")
    group.add_argument("--max-sequence-queue", type=_byte_count, default=1024, metavar="N",
                       help="requests one sequence may have waiting behind its running one; more are refused "
                            "(HTTP 429, gRPC UNAVAILABLE; on a ModelStreamInfer stream, an error response "
                            "and the stream goes on); 0 = no limit")


def _kv_cache_bytes(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _generation_flags(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group("generative models (the OpenAI API's engine)")
    group.add_argument("--kv-cache-memory-bytes", type=_kv_cache_bytes, default=None, metavar="SIZE",
                       help="the KV cache's memory for each generative model whose config sets neither "
                            "kv_num_blocks nor kv_cache_memory_bytes, as vLLM's flag: bytes, or 512MiB, 2GB "
                            "(default: a quarter of the memory left once the model is loaded, at most 2 GiB, "
                            "and no more than max_num_seqs sequences of max_model_len fill; "
                            "docs/generative.md, \"Sizing the KV cache\")")


def _access_flags(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group("access and API keys")
    group.add_argument("--api-keys", type=Path, default=None, metavar="FILE",
                       help="YAML file of API keys (docs/security.md): every API but health then needs "
                            "'Authorization: Bearer <key>' (gRPC: authorization metadata) naming a key "
                            "whose groups include it; per-key requests_per_second, max_concurrent and "
                            "tokens_per_minute (the OpenAI API)")
    group.add_argument("--quota-replicas", type=_count, default=1, metavar="N",
                       help="the replicas a key's limits are counted over: each replica counts its own and "
                            "holds 1/N of every key's requests_per_second, max_concurrent and "
                            "tokens_per_minute, so N replicas together never pass them; set it to the "
                            "autoscaler's maximum (docs/replicas.md)")
    group.add_argument("--http-restricted-api", action="append", default=[],
                       metavar="<api>[,<api>...]:<key>=<value>",
                       help="as Triton's flag: the HTTP API groups listed (health, metadata, inference, "
                            "shared-memory, model-config, model-repository, statistics, trace, logging) "
                            "answer 403 unless the request carries header <key> with <value> (repeatable, "
                            "each group in one flag)")
    group.add_argument("--grpc-restricted-protocol", action="append", default=[],
                       metavar="<protocol>[,<protocol>...]:<key>=<value>",
                       help="as Triton's flag: the gRPC groups listed answer UNAVAILABLE unless the call "
                            "carries metadata triton-grpc-protocol-<key> with <value> (repeatable)")
    group.add_argument("--allow-remote-admin-api", action="append", default=[], metavar="<api>[,<api>...]",
                       help="the admin groups (model-repository, logging, trace, shared-memory) answer only "
                            "clients on loopback until a restriction on the group or an API key holding it "
                            "is configured; this opens the groups listed to every client without either, as "
                            "Triton does by default (repeatable)")
    group.add_argument("--trust-request-chat-template", action="store_true",
                       help="the OpenAI API serves a chat request's own 'chat_template' (vLLM's flag): Jinja "
                            "rendered in a sandbox, yet code a client wrote; off, such a request is refused "
                            "and each model's own template is used")


def _client_shm_flags(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group("client shared memory")
    group.add_argument("--allow-client-shm", action=TritonBool, default=False,
                       help="serve the system shared memory extension: clients register their POSIX "
                            "shared-memory objects and place tensors in them (Triton's flag: "
                            "--allow-client-shm or --allow-client-shm=true)")
    group.add_argument("--client-shm-max-regions", type=_byte_count, default=256, metavar="N",
                       help="client shared-memory regions registered at once, server-wide (each holds a "
                            "file descriptor; never more than a quarter of the open-file limit); 0 = only "
                            "that quarter")
    group.add_argument("--client-shm-max-regions-per-key", type=_byte_count, default=64, metavar="N",
                       help="of those, how many one API key may hold (with --api-keys; 0 = no limit)")
    group.add_argument("--client-shm-prefix", action="append", default=[], metavar="PREFIX",
                       help="client shared-memory keys starting with PREFIX may name an object of any user "
                            "(repeatable); without one, the server opens only objects owned by the user of "
                            "the client's socket, a client on this machine. '/' allows every key")


def _tls_flags(serve: argparse.ArgumentParser) -> None:
    """Triton's five gRPC TLS flags, and the same five for HTTPS (Triton has none for HTTP)."""
    group = serve.add_argument_group("TLS")
    for proto, what in (("grpc", "gRPC (ALPN h2)"), ("http", "HTTP (HTTPS)")):
        group.add_argument(f"--{proto}-use-ssl", dest=f"{proto}_use_ssl", action=TritonBool, default=False,
                           help=f"serve {what} over TLS (--{proto}-use-ssl or --{proto}-use-ssl=true)")
        group.add_argument(f"--{proto}-use-ssl-mutual", dest=f"{proto}_use_ssl_mutual", action=TritonBool,
                           default=False, also=(f"{proto}_use_ssl",),
                           help=f"also require a client certificate signed by --{proto}-root-cert (mTLS); "
                                f"given with any value it turns --{proto}-use-ssl on, as in Triton")
        group.add_argument(f"--{proto}-server-cert", default="", metavar="PEM",
                           help="the server's certificate chain (PEM)")
        group.add_argument(f"--{proto}-server-key", default="", metavar="PEM",
                           help="the server's private key (PEM, unencrypted)")
        group.add_argument(f"--{proto}-root-cert", default="", metavar="PEM",
                           help=f"CA certificates client certificates must chain to (with "
                                f"--{proto}-use-ssl-mutual; ignored otherwise)")


def _batch_api_flags(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group("the OpenAI Batch API (on with --batch-dir)")
    group.add_argument("--batch-dir", type=Path, default=None, metavar="PATH",
                       help="turns on the OpenAI Batch API (/v1/files, /v1/batches): its files and jobs "
                            "live in this folder, and jobs left unfinished resume when the server starts "
                            "with it again (default: off)")
    group.add_argument("--batch-max-file-mb", type=int, default=32, metavar="MB",
                       help="largest batch input file an upload may send")
    group.add_argument("--batch-max-requests", type=int, default=50_000, metavar="N",
                       help="most requests (lines) in one batch input file (OpenAI's)")
    group.add_argument("--batch-requests-in-flight", type=int, default=16, metavar="N",
                       help="batch jobs' requests in the generation engines at once, over all jobs; they run "
                            "at low priority, behind every interactive request")
    group.add_argument("--batch-max-storage-mb-per-key", type=int, default=1024, metavar="MB",
                       help="the Batch API files one API key (or a server without keys) may keep, inputs and "
                            "job outputs together; an upload past it is refused until files are deleted")
    group.add_argument("--batch-max-files-per-key", type=int, default=1000, metavar="N",
                       help="the Batch API files one API key may keep")
    group.add_argument("--batch-max-jobs-per-key", type=int, default=1000, metavar="N",
                       help="the batch jobs one API key's history keeps; past it the oldest finished job is "
                            "forgotten (its output files stay)")
    group.add_argument("--batch-max-live-jobs-per-key", type=int, default=8, metavar="N",
                       help="batch jobs validating or in progress at once for one API key; a new one past it "
                            "is refused (429)")
    group.add_argument("--batch-max-live-jobs", type=int, default=64, metavar="N",
                       help="batch jobs validating or in progress at once over all keys")
    group.add_argument("--batch-completion-window-secs", type=int, default=24 * 3600, metavar="SECS",
                       help="how long a batch job has to finish, from its creation (its expires_at); one "
                            "not finished by then ends 'expired', its results so far kept and the requests "
                            "left in its error file as batch_expired (OpenAI's 24h window, whatever "
                            "completion_window says)")
    group.add_argument("--batch-shared", action="store_true",
                       help="the --batch-dir is shared with other replicas (a volume every replica mounts, "
                            "with working POSIX record locks: NFSv4, CephFS, a local disk): every call reads "
                            "it again, so any replica answers any Batch API call; each job runs on the one "
                            "replica that holds its lock, and another takes it over if that one dies "
                            "(docs/replicas.md)")
    group.add_argument("--batch-claim-interval-secs", type=float, default=5.0, metavar="SECS",
                       help="with --batch-shared: how often a replica looks for jobs no replica runs (their "
                            "replica stopped or died) and for cancels made through other replicas")


def _logging_flags(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group("logging and tracing")
    group.add_argument("--log-verbose", type=_verbose, default=0, metavar="N",
                       help="Triton's verbose level: 0 none; 1 or more: an access line per inference (model, "
                            "version, request id, status, queue, compute and total time, batch size) and "
                            "debug detail")
    group.add_argument("--log-info", action=TritonBool, default=True,
                       help="write INFO lines (access lines are INFO lines too)")
    group.add_argument("--log-warning", action=TritonBool, default=True,
                       help="write WARNING lines")
    group.add_argument("--log-error", action=TritonBool, default=True,
                       help="write ERROR lines")
    group.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                       help="text, or json (one object a line; an access line is exactly model, version, "
                            "request_id, status, queue_us, compute_us, total_us, batch_size); Triton's "
                            "'default' and ISO8601 read as text")
    group.add_argument("--log-file", default="", metavar="PATH",
                       help="append log lines to this file (default: standard error)")
    group.add_argument("--trace-config", action="append", default=[], metavar="[MODE,]SETTING=VALUE",
                       help="as Triton's: level=OFF|TIMESTAMPS|TENSORS, rate=N (one request in N), count=N "
                            "(-1: no limit), opentelemetry,url=http://host:4318/v1/traces (the OTLP/HTTP "
                            "collector), opentelemetry,resource=key=value, "
                            "opentelemetry,bsp_max_queue_size=N, opentelemetry,bsp_schedule_delay=MS, "
                            "opentelemetry,bsp_max_export_batch_size=N")


def _metrics_flags(serve: argparse.ArgumentParser) -> None:
    group = serve.add_argument_group("metrics")
    group.add_argument("--metrics-port", type=_port, default=8002, metavar="PORT",
                       help="Prometheus /metrics port (0 = disabled)")
    group.add_argument("--metrics-max-connections", type=_byte_count, default=64, metavar="N",
                       help="connections the metrics port holds at once, apart from the HTTP and gRPC "
                            "ports' (0 = no limit); more are answered 503 and closed. Its request heads "
                            "and idle connections time out as the HTTP port's (--client-timeout-secs, "
                            "--idle-timeout-secs)")
    group.add_argument("--metrics-max-connections-per-client", type=_byte_count, default=16, metavar="N",
                       help="connections one client address may hold on the metrics port (0 = no limit)")
    group.add_argument("--allow-gpu-metrics", action=TritonBool, default=True,
                       help="export Triton's GPU metrics (nv_gpu_utilization, nv_gpu_memory_*_bytes, "
                            "nv_gpu_power_*, nv_energy_consumption) for the visible GPUs, read through NVML "
                            "(the `gpu` extra: nvidia-ml-py); absent where there is no GPU or no NVML")
    group.add_argument("--metrics-interval-ms", type=_count, default=2000, metavar="MS",
                       help="how often the GPU metrics are read (each scrape shows the last reading)")
    group.add_argument("--metrics-config", action="append", default=[], metavar="SETTING=VALUE",
                       help="histogram_latencies=true|false (the request, queue and compute latency "
                            "histograms; on unless set false), histogram_buckets_us=50,100,... (their "
                            "bounds)")
