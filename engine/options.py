"""`ServerOptions`: everything `hubserve serve` was told, as one frozen object. engine/cli/serve.py builds it
from the command line; `Server` (engine/server.py) reads it once, at start, and hands each component the part
it needs (its own limits object: `HttpLimits`, h2 `Limits`, `BatchLimits`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .access.policy import AccessConfig, access_config
from .frontend.tls import TlsSettings
from .openai.batch.limits import BatchLimits


@dataclass(frozen=True)
class ServerOptions:
    model_repository: Path
    # A folder the repository's model files may resolve into besides the repository: the one-model folder
    # `model_repository` was made for (engine/repository/single_model.py), its files linked from there.
    model_files_root: Path | None = None
    host: str = "0.0.0.0"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002  # 0 = no metrics endpoint
    model_control_mode: str = "poll"  # none | poll | explicit
    repository_poll_secs: float = 2.0  # poll mode: the full rescan (with events: the safety net)
    repository_quiet_secs: float = 1.0  # poll mode: a folder loads once unchanged for this long
    repository_events: bool = True  # poll mode: react to file-system events, not only to the rescan
    load_models: tuple[str, ...] = ()
    strict_readiness: bool = True
    max_message_bytes: int = 64 << 20  # largest gRPC message (and, unless http_max_input_bytes, HTTP body)
    http_max_input_bytes: int = 0  # largest HTTP request body; 0 = max_message_bytes (Triton: 64 MiB)
    max_header_bytes: int = 16 << 10  # HTTP/1.1 request head / HTTP/2 header list; larger → 431 / refused
    max_header_count: int = 100  # HTTP/1.1 header fields in one request; more → 431
    client_timeout_secs: float = 30.0  # the longest a client may stall mid-request or leave answers unread
    idle_timeout_secs: float = 300.0  # a connection with nothing in flight is closed after this long
    max_concurrent_executions: int = 0  # 0 = limited only by instances
    # --rate-limit-resource NAME:COUNT[:DEVICE] as given (device None: every device): rate_limiter.py
    rate_limit_resources: tuple[tuple[str, int, int | None], ...] = ()
    exit_timeout_secs: float = 30.0
    # 1: this process serves everything. N >= 2: this process is the engine (repository, batchers, instances,
    # statistics, metrics) and N frontend processes do the HTTP and gRPC work (engine/workers/).
    workers: int = 1
    worker_arena_bytes: int = 16 << 20  # each frontend's request arena and its response arena (shared memory)
    log_verbose: int = 0  # Triton's --log-verbose: 1 or more writes an access line per inference
    log_file: str = ""  # "" = standard error
    log_format: str = "text"  # text | json (and Triton's default | ISO8601, which read as text)
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    # Triton's --metrics-config <setting>=<value> (engine/observability/histograms.py) and --trace-config
    # [<mode>,]<setting>=<value> (engine/observability/tracing/settings.py), as given.
    metrics_config: tuple[str, ...] = ()
    allow_gpu_metrics: bool = True  # Triton's --allow-gpu-metrics (engine/observability/gpu_metrics.py)
    metrics_interval_ms: int = 2000  # Triton's --metrics-interval-ms: how often the GPU metrics are read
    trace_config: tuple[str, ...] = ()
    allow_python_model_upload: bool = False  # a repository `load` may send a Python model's files
    canary_interval_secs: float = 10.0  # each instance's canary this often (instances/canary.py); 0: off
    canary_timeout_secs: float = 5.0  # a canary unanswered this long fails, and the version is not ready
    # What one request may hold (frontend/wire.py TensorLimits) and how many connections the server takes
    # (frontend/connections.py); 0 = no limit for the connection counts.
    max_tensor_elements: int = 1 << 31
    max_bytes_element_bytes: int = 16 << 20
    max_json_depth: int = 32
    grpc_max_concurrent_streams: int = 1024
    # A ModelStreamInfer stream's requests in flight (past it the stream is not read), and Health/Watch
    # streams open server-wide (frontend/grpc/call.py CallLimits).
    grpc_max_stream_requests: int = 1024
    grpc_max_health_watches: int = 1024
    max_connections: int = 4096
    max_connections_per_client: int = 1024
    # The metrics port's own connection caps (frontend/http/metrics_routes.py), apart from the HTTP and gRPC
    # ports'; its head and idle timeouts are client_timeout_secs and idle_timeout_secs.
    metrics_max_connections: int = 64
    metrics_max_connections_per_client: int = 16
    # Sequences one sequence model version lets wait for a slot, in all and per API key
    # (scheduling/sequence/policy.py BacklogLimits); 0 = no limit.
    max_sequence_backlog: int = 4096
    max_sequence_backlog_per_key: int = 1024
    max_sequence_queue: int = 1024  # requests one sequence may have waiting (BacklogLimits)
    http_tls: TlsSettings | None = None  # HTTPS (--http-use-ssl ...); None = plain HTTP
    grpc_tls: TlsSettings | None = None  # gRPC over TLS, ALPN h2 (--grpc-use-ssl ...); None = plain h2c
    allow_client_shm: bool = False  # the system shared memory extension (engine/shm/client.py)
    # What clients may register with it (shm/client.py ShmLimits): regions server-wide (and never more than a
    # quarter of the open-file limit) and per API key (0 = no limit); key prefixes registered whoever owns
    # the object (else only objects of the client's own user).
    client_shm_max_regions: int = 256
    client_shm_max_regions_per_key: int = 64
    client_shm_prefixes: tuple[str, ...] = ()
    # Who may call what (engine/access/policy.py; docs/security.md): Triton's restriction flags as given, the
    # --api-keys file, and the server-wide budget of request bytes in flight (0 = none).
    http_restricted_apis: tuple[str, ...] = ()
    grpc_restricted_protocols: tuple[str, ...] = ()
    api_keys_file: Path | None = None
    max_inflight_bytes: int = 0
    # The admin groups (access/policy.py ADMIN_GROUPS) opened to clients off loopback with neither a
    # restriction nor a key (--allow-remote-admin-api, as given); the others answer only loopback until one is
    # configured.
    remote_admin_apis: tuple[str, ...] = ()
    # Whether the OpenAI API renders a chat request's own `chat_template` (--trust-request-chat-template).
    trust_request_chat_template: bool = False
    # The replicas a key's limits are counted over (--quota-replicas; docs/replicas.md): each replica holds
    # 1/N of every key's limits, so N replicas together never pass them.
    quota_replicas: int = 1
    # The OpenAI Batch API (engine/openai/batch/): its folder (None: the API is off), the largest input file
    # and the most requests in one, and what one key (owner) may hold (engine/openai/batch/limits.py).
    batch_dir: Path | None = None
    batch_max_file_bytes: int = 32 << 20
    batch_max_requests: int = 50_000
    batch_requests_in_flight: int = 16  # the jobs' requests in the engines at once
    batch_max_storage_bytes_per_key: int = 1 << 30
    batch_max_files_per_key: int = 1000
    batch_max_jobs_per_key: int = 1000
    batch_max_live_jobs_per_key: int = 8
    batch_max_live_jobs: int = 64
    batch_completion_window_secs: int = 24 * 3600
    # --batch-dir shared with other replicas (engine/openai/batch/claims.py): read again at every call, jobs
    # claimed by one replica, unclaimed ones looked for every batch_claim_interval_secs
    batch_shared: bool = False
    batch_claim_interval_secs: float = 5.0
    # The KV cache budget of each generative model without kv_num_blocks or kv_cache_memory_bytes in its
    # config (--kv-cache-memory-bytes; engine/generate/serving/kv_budget.py); None: the default budget.
    kv_cache_memory_bytes: int | None = None

    def batch_limits(self) -> BatchLimits:
        return BatchLimits(self.batch_max_file_bytes, self.batch_max_requests,
                           self.batch_max_storage_bytes_per_key, self.batch_max_files_per_key,
                           self.batch_max_jobs_per_key, self.batch_max_live_jobs_per_key,
                           self.batch_max_live_jobs, self.batch_completion_window_secs)

    def access(self) -> AccessConfig:
        """The access flags parsed and checked (RestrictionError, ApiKeysError: fail at start)."""
        return access_config(self.http_restricted_apis, self.grpc_restricted_protocols, self.api_keys_file,
                             self.max_inflight_bytes, self.remote_admin_apis, self.quota_replicas)
