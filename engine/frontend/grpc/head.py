"""A gRPC call's request head, checked once as it arrives: `admit_head` turns it into a `HeadRefusal` (the
status, message and HTTP status of a trailers-only answer) or a `HeadAdmission` (the RPC, its deadline, what
the access policy let it hold, whether it holds a Health/Watch slot). Called by `Call.__init__` (call.py) for
every stream; `GrpcApp` (app.py) builds the `HeadRules` its calls are checked against, once.

The checks, in their order (the first that fails answers):
1. an `x-request-id` that may not be echoed or logged: INVALID_ARGUMENT;
2. a header list over `max_header_list_bytes`: RESOURCE_EXHAUSTED;
3. a method other than POST: UNIMPLEMENTED, HTTP 405;
4. a content-type other than application/grpc*: UNKNOWN, HTTP 415 (PROTOCOL-HTTP2.md);
5. a `:path` we do not serve: UNIMPLEMENTED;
6. an admin group's call from a peer off loopback while the operator has not opened the group
   (access/policy.py `LoopbackOnly`): UNAVAILABLE, as Triton answers a restriction;
7. the access policy (Triton's restriction metadata, the `authorization` key, the key's quotas), when one is
   configured: its refusal's status (`GRPC_STATUS`), a quota's with when to retry;
8. a Health/Watch over the server's or the connection's cap (`GrpcApp.open_watch`): RESOURCE_EXHAUSTED.

A malformed `grpc-timeout` is ignored (no deadline), as grpc does. Nothing here has side effects but what
the policies it asks take: an admitted call's `Admission` and Watch slot are the caller's to release, and a
refusal holds neither (a Watch refused by its cap has its admission released here).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...access.groups import ApiGroup
from ...access.policy import GRPC_STATUS, AccessPolicy, Admission, LoopbackOnly, Refusal
from ...observability.request_ids import header_request_id_problem
from ..endpoints import Kind
from ..h2.headers import RequestHead
from .handlers import GrpcStatus as S
from .messages import response_encoding
from .rpcs import Rpc, parse_timeout, with_retry


@dataclass(frozen=True, slots=True)
class HeadRules:
    """What a server's calls are checked against (GrpcApp builds it once): the method table by `:path`, each
    method's API group, the header list limit, and the policies (None: not configured)."""

    rpcs: dict[bytes, Rpc]
    groups: dict[bytes, ApiGroup | None]
    max_header_list_bytes: int
    loopback_only: LoopbackOnly | None = None
    access: AccessPolicy | None = None


@dataclass(frozen=True, slots=True)
class HeadRefusal:
    """A call refused at its head: answered trailers-only, before any message is read."""

    status: int
    message: str
    http_status: int = 200
    bad_request_id: bool = False  # the client's x-request-id is not echoed in the answer


@dataclass(frozen=True, slots=True)
class HeadAdmission:
    """A call admitted: its RPC, its deadline in seconds (None: none), what the access policy let it hold
    (None: no policy), and whether it holds a Health/Watch slot."""

    rpc: Rpc
    timeout_s: float | None
    admission: Admission | None
    watch_counted: bool


class CallHead:
    """What a call reads from its head besides the checks: its `x-request-id`, the encoding of its messages
    and of its responses, and the checks' verdict where nothing but the head and the connection decide it
    (no access policy asked, no Watch slot taken). Worked out by the first call that sends a header block and
    kept on that block's RequestHead (`memo`), which its connection's decoder reuses for every later request
    with the same block: a client repeating its metadata (perf_analyzer, tritonclient) pays for it once per
    connection. The response head is the first successful answer's."""

    __slots__ = ("admitted", "answer_head", "encoding", "request_id", "response_encoding")

    def __init__(self, head: RequestHead) -> None:
        fields = head.fields
        self.request_id = fields.get(b"x-request-id")
        self.encoding = fields.get(b"grpc-encoding", b"identity").decode("latin-1")
        self.response_encoding = response_encoding(self.encoding, fields.get(b"grpc-accept-encoding", b""))
        self.admitted: HeadAdmission | None = None
        self.answer_head: bytes | None = None

    def remember(self, outcome: HeadRefusal | HeadAdmission) -> None:
        """Keep `outcome` for later calls with this head when it holds nothing of its own."""
        if isinstance(outcome, HeadAdmission) and outcome.admission is None and not outcome.watch_counted:
            self.admitted = outcome


def call_head(head: RequestHead) -> CallHead:
    """The head's CallHead: the one kept on it, or a new one kept there."""
    memo = head.memo
    if memo is None:
        memo = head.memo = CallHead(head)
    return memo  # type: ignore[no-any-return]


def admit_head(rules: HeadRules, head: RequestHead, on_loopback: bool, now: float,
               open_watch: Callable[[], str]) -> HeadRefusal | HeadAdmission:
    """The checks of the module docstring, in order, on `head` from a peer `on_loopback` or not, at
    monotonic time `now`. `open_watch`, asked only for a Health/Watch that passed every other check, counts
    it against the caps and says why not ("" when counted): `GrpcApp.open_watch` on the call's connection."""
    fields = head.fields
    request_id = fields.get(b"x-request-id")
    if request_id is not None and (bad_id := header_request_id_problem(request_id)):
        return HeadRefusal(S.INVALID_ARGUMENT, f"metadata x-request-id {bad_id}", bad_request_id=True)
    if head.list_size > rules.max_header_list_bytes:
        return HeadRefusal(S.RESOURCE_EXHAUSTED, f"request headers of {head.list_size} bytes exceed the "
                                                 f"limit of {rules.max_header_list_bytes}")
    if fields[b":method"] != b"POST":
        return HeadRefusal(S.UNIMPLEMENTED, "gRPC needs POST", 405)
    if not fields.get(b"content-type", b"").startswith(b"application/grpc"):
        return HeadRefusal(S.UNKNOWN, "content-type must be application/grpc", 415)
    path = fields.get(b":path", b"")
    rpc = rules.rpcs.get(path)
    if rpc is None:
        return HeadRefusal(S.UNIMPLEMENTED, f"unknown method {fields[b':path'].decode('utf-8', 'replace')}")
    timeout = fields.get(b"grpc-timeout")
    timeout_s = None if timeout is None else parse_timeout(timeout)
    if rules.loopback_only is not None and not on_loopback:
        refusal = rules.loopback_only.refusal(rules.groups[path])
        if refusal is not None:
            return HeadRefusal(GRPC_STATUS[refusal.kind], refusal.message)
    admission: Admission | None = None
    access = rules.access
    if access is not None:
        # A stream's requests are admitted one by one (StreamInfer._stream_request); a Watch, held as long as
        # its client likes, takes no slot of its key's concurrency (its own caps bound it) but needs a key.
        kind = rpc.kind
        verdict = access.admit(rules.groups[path], fields, 0, now,
                               holds_quotas=kind is not Kind.STREAM_INFER and kind is not Kind.WATCH,
                               needs_key=True if kind is Kind.WATCH else None)
        if isinstance(verdict, Refusal):
            return HeadRefusal(GRPC_STATUS[verdict.kind], with_retry(verdict))
        admission = verdict
    if rpc.kind is Kind.WATCH:
        refused = open_watch()
        if refused:
            if admission is not None:
                access.release(admission)  # type: ignore[union-attr]  # (set only with a policy)
            return HeadRefusal(S.RESOURCE_EXHAUSTED, refused)
        return HeadAdmission(rpc, timeout_s, admission, True)
    return HeadAdmission(rpc, timeout_s, admission, False)
