"""What a process's frontends are built from (build.py): one frozen `FrontendOptions` of one frozen value per
component. The engine's Server makes it from its ServerOptions, for its own frontends (one process) or for
each frontend process of `--workers N`, which gets it as JSON on its command line (workers/supervisor.py
writes it, workers/frontend.py reads it back: `to_dict`, `from_dict`).

No secret is in it: a command line is readable by every local user (`ps`, /proc/<pid>/cmdline). The API keys
file goes by its path (each process reads it); the restriction flags' header values, which are secrets, go
through a pipe (`RestrictionSecrets`, workers/supervisor.py).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..access.policy import AccessConfig, access_config
from .connections import ConnectionLimits
from .grpc.app import CallLimits
from .h2.streams import Limits
from .http.types import HttpLimits
from .tls import TlsSettings
from .wire import TensorLimits


@dataclass(frozen=True, slots=True)
class GrpcOptions:
    """The gRPC port's limits: a message's bytes, what each HTTP/2 connection advertises and enforces, and
    what calls may hold (this process's share of the server-wide ones)."""

    max_message_bytes: int
    h2: Limits
    calls: CallLimits


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """Each port's TLS (None: plain), and how long a handshake may take; the handshakes run in the process
    that serves the connection."""

    http: TlsSettings | None
    grpc: TlsSettings | None
    handshake_timeout_secs: float | None


@dataclass(frozen=True, slots=True)
class AccessInputs:
    """The access flags but the secret ones: with `RestrictionSecrets`, what `access_config` parses."""

    api_keys_file: str | None
    max_inflight_bytes: int
    remote_admin_apis: tuple[str, ...]
    quota_replicas: int = 1  # --quota-replicas: the keys' limits are this replica's share

    def config(self, secrets: RestrictionSecrets) -> AccessConfig:
        """The flags parsed and checked (RestrictionError, ApiKeysError); the keys file is read now."""
        keys_file = Path(self.api_keys_file) if self.api_keys_file else None
        return access_config(secrets.http_restricted_apis, secrets.grpc_restricted_protocols, keys_file,
                             self.max_inflight_bytes, self.remote_admin_apis, self.quota_replicas)


@dataclass(frozen=True, slots=True)
class RestrictionSecrets:
    """The restriction flags' values (`group=header:value`): secrets, which never go on a command line."""

    http_restricted_apis: tuple[str, ...] = ()
    grpc_restricted_protocols: tuple[str, ...] = ()

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode()

    @classmethod
    def from_json(cls, data: bytes) -> RestrictionSecrets:
        doc: dict[str, Any] = json.loads(data) if data else {}
        return cls(tuple(doc.get("http_restricted_apis", ())),
                   tuple(doc.get("grpc_restricted_protocols", ())))


@dataclass(frozen=True, slots=True)
class LogOptions:
    """The log flags at start (observability/logs.py `configure`); the logging extension changes them in the
    engine process alone."""

    log_file: str = ""
    log_format: str = "text"
    log_verbose: int = 0
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True


@dataclass(frozen=True, slots=True)
class FrontendOptions:
    """Everything a process's HTTP and gRPC frontends are built from. `frontends`: how many processes share
    the server-wide limits (connections, access budgets; 1 with one process)."""

    http: HttpLimits
    grpc: GrpcOptions
    tls: TlsOptions
    connections: ConnectionLimits
    tensors: TensorLimits
    access: AccessInputs
    log: LogOptions
    frontends: int
    exit_timeout_secs: float

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON values, nested as the dataclasses are (tuples become lists)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> FrontendOptions:
        """The options `to_dict` wrote (read back from JSON), every value the same."""
        grpc, tls, access = doc["grpc"], doc["tls"], doc["access"]
        return cls(http=HttpLimits(**doc["http"]),
                   grpc=GrpcOptions(grpc["max_message_bytes"], Limits(**grpc["h2"]),
                                    CallLimits(**grpc["calls"])),
                   tls=TlsOptions(TlsSettings.from_spec(tls["http"]), TlsSettings.from_spec(tls["grpc"]),
                                  tls["handshake_timeout_secs"]),
                   connections=ConnectionLimits(**doc["connections"]), tensors=TensorLimits(**doc["tensors"]),
                   access=AccessInputs(access["api_keys_file"], access["max_inflight_bytes"],
                                       tuple(access["remote_admin_apis"]), access["quota_replicas"]),
                   log=LogOptions(**doc["log"]), frontends=doc["frontends"],
                   exit_timeout_secs=doc["exit_timeout_secs"])


__all__ = ["AccessInputs", "FrontendOptions", "GrpcOptions", "LogOptions", "RestrictionSecrets", "TlsOptions"]
