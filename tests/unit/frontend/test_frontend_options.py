"""FrontendOptions (engine/frontend/options.py) and a frontend process's spec (engine/workers/frontend.py)
cross to each frontend process of `--workers N` as JSON on its command line: every value comes back the
same, and no restriction secret is in that text."""

from __future__ import annotations

import json

from engine.frontend.connections import ConnectionLimits
from engine.frontend.grpc.app import CallLimits
from engine.frontend.h2.streams import Limits
from engine.frontend.http.types import HttpLimits
from engine.frontend.options import (
    AccessInputs,
    FrontendOptions,
    GrpcOptions,
    LogOptions,
    RestrictionSecrets,
    TlsOptions,
)
from engine.frontend.tls import TlsSettings
from engine.frontend.wire import TensorLimits
from engine.workers.frontend import FrontendSpec


def _options() -> FrontendOptions:
    """Every field away from its default, so a value dropped on the way would show."""
    return FrontendOptions(
        http=HttpLimits(1 << 20, 4096, 50, 2.5, 60.0),
        grpc=GrpcOptions(3 << 20, Limits(max_concurrent_streams=7, max_header_list_bytes=999,
                                         max_buffered_request_bytes=6 << 20,
                                         max_queued_response_bytes=6 << 20, client_timeout_secs=2.5,
                                         idle_timeout_secs=60.0, max_frame_bytes=1 << 15),
                         CallLimits(max_stream_requests=11, max_watches=13, max_watches_per_connection=3)),
        tls=TlsOptions(TlsSettings("/c.pem", "/k.pem", flag_prefix="--http"),
                       TlsSettings("/c2.pem", "/k2.pem", "/ca.pem", True), 2.5),
        connections=ConnectionLimits(100, 10),
        tensors=TensorLimits(1000, 2000, 5),
        access=AccessInputs("/keys.json", 1 << 30, ("logging", "trace")),
        log=LogOptions("/tmp/log", "json", 2, False, True, False),
        frontends=3,
        exit_timeout_secs=4.5,
    )


def test_options_come_back_the_same_through_json() -> None:
    options = _options()
    assert FrontendOptions.from_dict(json.loads(json.dumps(options.to_dict()))) == options


def test_plain_options_come_back_the_same() -> None:
    """No TLS, no keys file: the None values survive too."""
    options = FrontendOptions(HttpLimits(), GrpcOptions(1 << 20, Limits(), CallLimits()),
                              TlsOptions(None, None, None), ConnectionLimits(), TensorLimits(),
                              AccessInputs(None, 0, ()), LogOptions(), 1, 30.0)
    assert FrontendOptions.from_dict(json.loads(json.dumps(options.to_dict()))) == options


def test_spec_comes_back_the_same() -> None:
    spec = FrontendSpec(2, 10, 11, (12, 1 << 20), (13, 2 << 20), 14, _options())
    assert FrontendSpec.from_json(spec.to_json()) == spec


def test_secrets_come_back_the_same() -> None:
    secrets = RestrictionSecrets(("model-repository=x-admin:s3cret",), ("health=x-h:other",))
    assert RestrictionSecrets.from_json(secrets.to_json()) == secrets
    assert RestrictionSecrets.from_json(b"") == RestrictionSecrets()
