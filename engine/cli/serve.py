"""What `hubserve serve`'s parsed flags become: `ServerOptions`, checked before any model loads, then a
running `Server` on the fastest event loop available."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys

from ..access.api_keys import ApiKeysError, file_mode_warning
from ..access.groups import RestrictionError
from ..access.policy import PolicyError, policies
from ..errors import EngineError
from ..frontend.listeners import PortError
from ..frontend.tls import ALPN_GRPC, ALPN_HTTP, TlsConfigError, TlsSettings, server_context
from ..memory import keep_heap_while_serving
from ..names import name_problem
from ..observability import logs
from ..openai.batch.claims import ClaimsUnsupported
from ..options import ServerOptions
from ..repository.single_model import is_single_model, single_model_repository
from ..server import Server
from .parser import default_workers


def _tls_settings(args: argparse.Namespace, proto: str) -> TlsSettings | None:
    """One protocol's TLS from its flags, checked by building its context now (before any model loads).
    Raises TlsConfigError with a message naming the flag."""
    if not getattr(args, f"{proto}_use_ssl"):
        return None
    settings = TlsSettings(server_cert=getattr(args, f"{proto}_server_cert"),
                           server_key=getattr(args, f"{proto}_server_key"),
                           root_cert=getattr(args, f"{proto}_root_cert"),
                           mutual=getattr(args, f"{proto}_use_ssl_mutual"), flag_prefix=f"--{proto}")
    server_context(settings, ALPN_GRPC if proto == "grpc" else ALPN_HTTP)
    return settings


def options_from_args(args: argparse.Namespace, http_tls: TlsSettings | None,
                      grpc_tls: TlsSettings | None) -> ServerOptions:
    """The parsed flags as one frozen object: units converted (MB to bytes, paths resolved), `auto` workers
    resolved for this machine."""
    return ServerOptions(
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
        rate_limit_resources=tuple(args.rate_limit_resource),
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
        allow_gpu_metrics=args.allow_gpu_metrics,
        metrics_interval_ms=args.metrics_interval_ms,
        trace_config=tuple(args.trace_config),
        allow_python_model_upload=args.allow_python_model_upload,
        canary_interval_secs=args.canary_interval_secs,
        canary_timeout_secs=args.canary_timeout_secs,
        max_tensor_elements=args.max_tensor_elements,
        max_bytes_element_bytes=args.max_bytes_element_size,
        max_json_depth=args.max_json_depth,
        grpc_max_concurrent_streams=args.grpc_max_concurrent_streams,
        grpc_max_stream_requests=args.grpc_max_stream_requests,
        grpc_max_health_watches=args.grpc_max_health_watches,
        max_connections=args.max_connections,
        max_connections_per_client=args.max_connections_per_client,
        metrics_max_connections=args.metrics_max_connections,
        metrics_max_connections_per_client=args.metrics_max_connections_per_client,
        max_sequence_backlog=args.max_sequence_backlog,
        max_sequence_backlog_per_key=args.max_sequence_backlog_per_key,
        max_sequence_queue=args.max_sequence_queue,
        http_tls=http_tls,
        grpc_tls=grpc_tls,
        allow_client_shm=args.allow_client_shm,
        client_shm_max_regions=args.client_shm_max_regions,
        client_shm_max_regions_per_key=args.client_shm_max_regions_per_key,
        client_shm_prefixes=tuple(args.client_shm_prefix),
        http_restricted_apis=tuple(args.http_restricted_api),
        grpc_restricted_protocols=tuple(args.grpc_restricted_protocol),
        api_keys_file=args.api_keys.resolve() if args.api_keys is not None else None,
        max_inflight_bytes=args.max_inflight_bytes,
        remote_admin_apis=tuple(args.allow_remote_admin_api),
        trust_request_chat_template=args.trust_request_chat_template,
        quota_replicas=args.quota_replicas,
        batch_dir=args.batch_dir.resolve() if args.batch_dir is not None else None,
        batch_max_file_bytes=max(1, args.batch_max_file_mb) << 20,
        batch_max_requests=max(1, args.batch_max_requests),
        batch_requests_in_flight=max(1, args.batch_requests_in_flight),
        batch_max_storage_bytes_per_key=max(1, args.batch_max_storage_mb_per_key) << 20,
        batch_max_files_per_key=max(1, args.batch_max_files_per_key),
        batch_max_jobs_per_key=max(1, args.batch_max_jobs_per_key),
        batch_max_live_jobs_per_key=max(1, args.batch_max_live_jobs_per_key),
        batch_max_live_jobs=max(1, args.batch_max_live_jobs),
        batch_completion_window_secs=max(1, args.batch_completion_window_secs),
        batch_shared=args.batch_shared,
        batch_claim_interval_secs=max(0.05, args.batch_claim_interval_secs),
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
    )


def serve(args: argparse.Namespace) -> int:
    """Run `hubserve serve` until a signal stops it. Every refusal that can be known before a model loads
    (log file, TLS files, keys file, flag combinations Triton refuses, a taken port) is one line on stderr
    and exit status 2."""
    try:
        logs.configure(args.log_file, args.log_format, args.log_verbose, args.log_info, args.log_warning,
                       args.log_error)
    except (OSError, EngineError) as e:
        print(f"hubserve: cannot log to '{args.log_file}': {e}", file=sys.stderr)
        return 2
    if args.load_model and args.model_control_mode != "explicit":  # Triton's refusal, in its words
        print("hubserve: Use of '--load-model' requires setting '--model-control-mode=explicit' as well.",
              file=sys.stderr)
        return 2
    if not args.model_repository.is_dir():
        print(f"hubserve: model repository '{args.model_repository}' is not a folder", file=sys.stderr)
        return 2
    try:
        http_tls, grpc_tls = _tls_settings(args, "http"), _tls_settings(args, "grpc")
    except TlsConfigError as e:
        print(f"hubserve: {e}", file=sys.stderr)
        return 2
    if is_single_model(args.model_repository):
        name = args.single_model_name or args.model_repository.resolve().name
        problem = name_problem(name)
        if problem is not None:
            print(f"hubserve: --single-model-name '{name}': {problem}", file=sys.stderr)
            return 2
        folder = args.model_repository.resolve()
        args.model_repository = single_model_repository(folder, name)
        logging.getLogger("hubserve").info("%s holds one model's files: serving them as model '%s'",
                                           folder, name)
    else:
        folder = None
    options = dataclasses.replace(options_from_args(args, http_tls, grpc_tls), model_files_root=folder)
    try:  # a flag Triton would refuse, or an unusable keys file: fail now, saying why
        policies(options.access(), options.workers)
    except (RestrictionError, ApiKeysError, PolicyError) as e:
        print(f"hubserve: {e}", file=sys.stderr)
        return 2
    keys_warning = file_mode_warning(options.api_keys_file) if options.api_keys_file else None
    if keys_warning is not None:
        logging.getLogger("hubserve").warning(keys_warning)
    # Instance threads need the GIL back to hand a finished batch to the loop. With the default 5 ms
    # switch interval a busy loop keeps it that long, so every batch waited up to 5 ms after it had
    # finished.
    sys.setswitchinterval(float(os.environ.get("HUBSERVE_SWITCH_INTERVAL_S", "0.0002")))
    keep_heap_while_serving()  # large requests' buffers are not given back and faulted in again per batch
    run = asyncio.run
    try:
        import uvloop  # a faster event loop where available; the server is correct without it

        run = uvloop.run
    except ImportError:
        pass
    try:
        run(Server(options).run_until_signalled())
    except (PortError, ClaimsUnsupported) as e:  # raised before any model loads
        print(f"hubserve: {e}", file=sys.stderr)
        return 2
    return 0
