"""TLS for both frontends: the settings a protocol's `--*-use-ssl` flags give, and the server-side
`ssl.SSLContext` built from them.

Who calls it: `hubserve serve` builds every context once before anything loads, so a missing, unreadable or
mismatched certificate or key stops the server at once with a message naming the flag and the path as the
user wrote it; then the process that runs the handshakes builds its own (the single process, or each
frontend process of `--workers N`: the engine only accepts and hands the raw socket over, so no handshake
ever runs on the engine's loop).

The certificate and key are read when the context is built; replacing the files takes a restart.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

ALPN_GRPC = ("h2",)  # gRPC clients (grpc-core) insist on h2 being negotiated
ALPN_HTTP = ("http/1.1",)


class TlsConfigError(Exception):
    """A TLS setting that cannot be served; the message names the flag and the path as given."""


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """One protocol's TLS, as its flags gave it (paths exactly as the user wrote them, so errors never
    name more of the file system than the user did). `flag_prefix` is `--grpc` or `--http`."""

    server_cert: str
    server_key: str
    root_cert: str = ""  # CA bundle that client certificates must chain to; needed with `mutual`
    mutual: bool = False  # require and verify a client certificate (mTLS)
    flag_prefix: str = "--grpc"

    @classmethod
    def from_spec(cls, spec: dict[str, Any] | None) -> TlsSettings | None:
        """Settings read back from their plain fields (FrontendOptions.from_dict: a frontend process's JSON
        spec, written by dataclasses.asdict); None stays None."""
        return None if spec is None else cls(**spec)


def _refuse_password() -> str:
    raise TlsConfigError("")  # replaced with the flag's message below; OpenSSL must never prompt


def _read_check(flag: str, path: str) -> None:
    """A readable, non-empty file, or a TlsConfigError naming the flag and the path as given."""
    try:
        with open(path, "rb") as f:
            if not f.read(1):
                raise TlsConfigError(f"{flag} '{path}' is empty")
    except IsADirectoryError:
        raise TlsConfigError(f"{flag} '{path}' is a folder, not a PEM file") from None
    except FileNotFoundError:
        raise TlsConfigError(f"{flag} '{path}' does not exist") from None
    except PermissionError:
        raise TlsConfigError(f"{flag} '{path}' cannot be read (permission denied)") from None
    except OSError as e:
        raise TlsConfigError(f"{flag} '{path}' cannot be read ({e.strerror or type(e).__name__})") from None


def _reason(e: ssl.SSLError) -> str:
    """OpenSSL's reason without the file name it may append (an absolute path after resolution)."""
    reason = e.reason if e.reason and e.reason != "PEM lib" else "no PEM data of the kind expected"
    return str(reason).replace("_", " ").lower()


def server_context(tls: TlsSettings, alpn: tuple[str, ...]) -> ssl.SSLContext:
    """A server context for one protocol: TLS 1.2 and later, the certificate chain and key, client
    certificates required and verified against `root_cert` when `mutual`, ALPN `alpn` offered."""
    p = tls.flag_prefix
    if not tls.server_cert or not tls.server_key:
        raise TlsConfigError(f"{p}-use-ssl needs {p}-server-cert and {p}-server-key")
    if tls.mutual and not tls.root_cert:
        raise TlsConfigError(f"{p}-use-ssl-mutual needs {p}-root-cert (the CA that client certificates "
                             "must chain to)")
    _read_check(f"{p}-server-cert", tls.server_cert)
    _read_check(f"{p}-server-key", tls.server_key)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(tls.server_cert, tls.server_key, password=_refuse_password)
    except TlsConfigError:
        raise TlsConfigError(f"{p}-server-key '{tls.server_key}' is encrypted; hubserve needs an "
                             "unencrypted PEM key") from None
    except ssl.SSLError as e:
        if "KEY_VALUES_MISMATCH" in str(e):
            raise TlsConfigError(f"{p}-server-key '{tls.server_key}' does not match the certificate in "
                                 f"{p}-server-cert '{tls.server_cert}'") from None
        raise TlsConfigError(f"{p}-server-cert '{tls.server_cert}' or {p}-server-key '{tls.server_key}' "
                             f"is not a PEM certificate and key ({_reason(e)})") from None
    if tls.mutual:
        _read_check(f"{p}-root-cert", tls.root_cert)
        try:
            ctx.load_verify_locations(cafile=tls.root_cert)
        except ssl.SSLError as e:
            raise TlsConfigError(f"{p}-root-cert '{tls.root_cert}' holds no PEM certificate "
                                 f"({_reason(e)})") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.set_alpn_protocols(list(alpn))
    return ctx


def handshake_timeout_secs(client_timeout_secs: float) -> float:
    """How long a TLS handshake may take: the client timeout (a handshake is part of the request's head),
    or asyncio's 60 s when that timeout is off."""
    return client_timeout_secs if client_timeout_secs > 0 else 60.0
