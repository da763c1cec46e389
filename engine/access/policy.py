"""Who may call what, and how much: `AccessPolicy`, the one object that decides, pure (time is passed in), so
its tests are plain functions. Each frontend only asks it, once per request, as soon as the request's head is
in and before its body is buffered (HTTP: frontend/http/reader.py; gRPC: frontend/grpc/call.py `Call`),
and turns a `Refusal` into its own protocol's answer (`HTTP_STATUS`, `GRPC_STATUS`).

The checks, in order (docs/security.md "Who may call what"):
0. Before the policy, in the frontend (no cost for a client on loopback): the admin groups (ADMIN_GROUPS:
   model-repository, logging, trace, shared-memory) answer only clients on loopback until the operator opens
   one, with a restriction on it (per protocol), an API key holding it, or --allow-remote-admin-api
   (`AccessConfig.loopback_only`, `LoopbackOnly`); a client elsewhere gets RESTRICTED saying how to open it.
   A request whose HTTP path cannot be read one way only (frontend/http/path.py) is MALFORMED (400) before
   anything is asked.
1. Triton's restrictions (`--http-restricted-api`, `--grpc-restricted-protocol`): the group's header must
   carry its value, else RESTRICTED with Triton's message (HTTP 403, gRPC UNAVAILABLE, as Triton answers).
2. hubserve's keys (`--api-keys`): every group but health needs `authorization: Bearer <key>` naming a
   known key (else UNAUTHENTICATED) that may call the group (else FORBIDDEN). Health's one-shot checks
   (HTTP `/v2/health/*` and model readiness, gRPC ServerLive/ServerReady/ModelReady/Check) stay keyless, for
   load balancers and probes; gRPC Health/Watch, a stream the server holds for as long as the client likes,
   needs a key with the health group like any other RPC (the caller says so: `needs_key`). The secret is
   hashed and compared with every key's hash by `hmac.compare_digest`, all of them every time, so neither
   the time taken nor an early exit tells which key (or how much of one) matched.
3. The key's quotas: `max_concurrent` requests in flight, then `requests_per_second` (a token bucket,
   burst one second's worth), else EXHAUSTED with a Retry-After.
4. The server-wide budget of request bytes in flight (`--max-inflight-bytes`): a request whose declared
   size does not fit is EXHAUSTED before its bytes are read. A body whose size is not declared up front
   (chunked HTTP, a gRPC stream) grows its reservation as it arrives (`grow`).

An admitted request holds an `Admission` until it is answered or dropped; the frontend calls `release`
exactly once. A gRPC ModelStreamInfer call is admitted without quotas (`holds_quotas=False`: who may call,
nothing held); each request on it is then admitted as a unary request would be (`admit_part`: its key's
concurrency slot and rate token, and its message's bytes, reserved in the call's admission as the message's
length prefix arrived, moved to it), and holds that until it is answered (a decoupled model's final
response). With `--workers N` each frontend process holds its own policy with 1/N of every limit
(`share`), so the limits hold server-wide whichever process a connection lands in (docs/security.md).
"""

from __future__ import annotations

import copy
import enum
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .api_keys import ApiKey, digest, load_api_keys, per_replica
from .groups import GRPC_RESTRICTED_PREFIX, ApiGroup, Restriction, RestrictionError, parse_restrictions
from .quotas import ByteBudget, Concurrency, TokenBucket, retry_after_secs

_BEARER = b"bearer "
_AUTHORIZATION = b"authorization"


class RefusalKind(enum.Enum):
    RESTRICTED = "restricted"  # Triton's restriction header missing or wrong
    UNAUTHENTICATED = "unauthenticated"  # no key, or one we do not know
    FORBIDDEN = "forbidden"  # a known key outside its groups
    EXHAUSTED = "exhausted"  # a quota or the byte budget: retry later
    MALFORMED = "malformed"  # an HTTP path that cannot be read one way only (frontend/http/path.py)


# How each frontend answers a refusal (gRPC as status numbers: frontend/grpc/handlers.py GrpcStatus).
HTTP_STATUS = {RefusalKind.RESTRICTED: 403, RefusalKind.UNAUTHENTICATED: 401, RefusalKind.FORBIDDEN: 403,
               RefusalKind.EXHAUSTED: 429, RefusalKind.MALFORMED: 400}
GRPC_STATUS = {RefusalKind.RESTRICTED: 14, RefusalKind.UNAUTHENTICATED: 16, RefusalKind.FORBIDDEN: 7,
               RefusalKind.EXHAUSTED: 8, RefusalKind.MALFORMED: 3}


# Triton's answers to a restricted request (server src/http_server.cc, src/grpc/grpc_server.cc).
HTTP_RESTRICTED = "This API is restricted, expecting header '{}'"
GRPC_RESTRICTED = "This protocol is restricted, expecting header '{}'"

# The groups that change the server rather than use it: loopback only by default (`loopback_only`).
ADMIN_GROUPS = frozenset({ApiGroup.MODEL_REPOSITORY, ApiGroup.LOGGING, ApiGroup.TRACE,
                          ApiGroup.SHARED_MEMORY})
_LOOPBACK_ONLY = ("This {what} is restricted to clients on loopback: the '{group}' API answers other clients "
                  "only once it is opened, by {flag} {group}:<header>=<value>, an API key holding the "
                  "'{group}' group (--api-keys), or --allow-remote-admin-api {group}")


@dataclass(frozen=True, slots=True)
class Refusal:
    kind: RefusalKind
    message: str
    retry_after_secs: int = 0  # EXHAUSTED only: whole seconds (HTTP Retry-After)


class Admission:
    """What an admitted request holds until `AccessPolicy.release`: a slot of its key's concurrency and
    its bytes of the budget; whose key it is (`key`: `admit_part` admits a stream's requests as that key);
    and `owner`, that key's owner id (api_keys.py `owner_id`; "" when the server has no keys, or for
    a health request, which needs none): who sent the request, as everything downstream knows it (its client
    shared-memory regions, its sequence backlog share, its tokens_per_minute, its Batch API files and jobs:
    caller.py). Decided here, once, as the request's head arrives; nothing past the frontend looks at
    the `Authorization` header again."""

    __slots__ = ("bytes", "concurrency", "key", "owner")

    def __init__(self, concurrency: Concurrency | None, nbytes: int, key: _KeyState | None = None) -> None:
        self.concurrency = concurrency
        self.bytes = nbytes
        self.key = key
        self.owner = key.key.owner if key is not None else ""


class _KeyState:
    __slots__ = ("bucket", "concurrency", "key")

    def __init__(self, key: ApiKey, share: int, index: int, now: float) -> None:
        self.key = key
        rps = key.requests_per_second
        self.bucket = TokenBucket(rps / share, now) if rps is not None else None
        limit = key.max_concurrent
        # Split so the shares add up to the limit: the first `limit % share` processes get one more.
        self.concurrency = None if limit is None else Concurrency(limit // share + (index < limit % share))


class PolicyError(ValueError):
    """Options the policy cannot honour (a limit that cannot be split across the frontend processes)."""


@dataclass(frozen=True, slots=True)
class AccessConfig:
    """What the policy is built from (the server builds it from its options; each frontend process too)."""

    http_restrictions: Mapping[ApiGroup, Restriction] = field(default_factory=dict)
    grpc_restrictions: Mapping[ApiGroup, Restriction] = field(default_factory=dict)
    keys: tuple[ApiKey, ...] = ()
    max_inflight_bytes: int = 0  # 0: no budget
    remote_admin: frozenset[ApiGroup] = frozenset()  # admin groups opened to every client (the flag)

    def loopback_only(self, grpc: bool) -> LoopbackOnly | None:
        """The admin groups that answer only clients on loopback over this protocol: those with no
        restriction for this protocol, no key holding them and no --allow-remote-admin-api (None: none)."""
        restricted = self.grpc_restrictions if grpc else self.http_restrictions
        held = frozenset().union(*(k.groups for k in self.keys))
        groups = ADMIN_GROUPS - restricted.keys() - held - self.remote_admin
        return LoopbackOnly(frozenset(groups), grpc) if groups else None

    def needs_policy(self, grpc: bool) -> bool:
        """False when nothing configured concerns this protocol: it then gets no policy at all, and its
        requests pay nothing."""
        return bool((self.grpc_restrictions if grpc else self.http_restrictions) or self.keys
                    or self.max_inflight_bytes)


@dataclass(frozen=True, slots=True)
class LoopbackOnly:
    """The secure default for the admin groups (check 0 above). A connection asks `refusal` only when its
    peer is not on loopback (connections.is_loopback), so clients on this machine pay nothing."""

    groups: frozenset[ApiGroup]
    grpc: bool = False

    def refusal(self, group: ApiGroup | None) -> Refusal | None:
        if group not in self.groups:
            return None
        what, flag = ("protocol", "--grpc-restricted-protocol") if self.grpc else \
            ("API", "--http-restricted-api")
        return Refusal(RefusalKind.RESTRICTED,
                       _LOOPBACK_ONLY.format(what=what, group=group.value, flag=flag))  # type: ignore[union-attr]


class AccessPolicy:
    """One per process, built for HTTP; `for_grpc()` is the gRPC frontend's view, which shares the keys'
    quotas and the byte budget (a key's limits and the server's budget are one whichever protocol a request
    uses) but checks gRPC's restrictions. `share` is the number of frontend processes splitting the limits
    and `index` this one's place among them."""

    def __init__(self, config: AccessConfig, now: float, share: int = 1, index: int = 0) -> None:
        for key in config.keys:
            if key.max_concurrent is not None and key.max_concurrent < share:
                raise PolicyError(f"--api-keys: {key.label}: max_concurrent {key.max_concurrent} cannot be "
                                  f"split across {share} frontend processes (--workers {share}): give it at "
                                  f"least {share}, or run fewer workers")
            if key.requests_per_second is not None and key.requests_per_second < share:
                raise PolicyError(f"--api-keys: {key.label}: requests_per_second {key.requests_per_second:g} "
                                  f"cannot be split across {share} frontend processes (--workers {share}): "
                                  f"give it at least {share}, or run fewer workers")
        self.restrictions = dict(config.http_restrictions)
        self._grpc_restrictions = dict(config.grpc_restrictions)
        self._restricted = HTTP_RESTRICTED
        self._keys = [_KeyState(k, share, index, now) for k in config.keys]
        self._digests = [k.digest for k in config.keys]
        budget = config.max_inflight_bytes // share
        self.budget = ByteBudget(budget) if config.max_inflight_bytes else None

    def for_grpc(self) -> AccessPolicy:
        view = copy.copy(self)
        view.restrictions = self._grpc_restrictions
        view._restricted = GRPC_RESTRICTED
        return view

    def admit(self, group: ApiGroup | None, headers: Mapping[bytes, bytes], nbytes: int,
              now: float, holds_quotas: bool = True, needs_key: bool | None = None) -> Admission | Refusal:
        """Whether a request to `group` (None: an endpoint that is in none, such as an unknown path, which
        still needs a key) with these request headers (lower-case names) and `nbytes` of body declared may
        go on. An Admission must be released once the request is answered or dropped. `holds_quotas` False:
        only who may call is checked (a stream whose requests are admitted one by one, `admit_part`).
        `needs_key`: whether the request needs a key when keys are configured (None: every group but
        health)."""
        if group is not None:
            restriction = self.restrictions.get(group)
            if restriction is not None and not _carries(headers, restriction):
                return Refusal(RefusalKind.RESTRICTED, self._restricted.format(restriction.header))
        state = None
        if needs_key is None:
            needs_key = group is not ApiGroup.HEALTH
        if self._keys and needs_key:
            state = self._identify(headers.get(_AUTHORIZATION))
            if state is None:
                return Refusal(RefusalKind.UNAUTHENTICATED,
                               "missing or unknown API key: send the header 'Authorization: Bearer <key>'")
            if group is not None and group not in state.key.groups:
                return Refusal(RefusalKind.FORBIDDEN,
                               f"this API key may not call the '{group.value}' API")
        if not holds_quotas:
            return Admission(None, 0, state)
        return self._quotas(state, nbytes, now)

    def admit_part(self, whole: Admission, nbytes: int, now: float) -> Admission | Refusal:
        """One request of a stream admitted as `whole` (holds_quotas=False), as a unary request of the same
        key would be: a slot of the key's concurrency and a token of its rate; and `nbytes` of its message,
        reserved in `whole` (`grow`) as its length arrived, leave `whole`: moved to the new Admission, or,
        on refusal, given back (the message is dropped)."""
        moved = min(nbytes, whole.bytes)
        whole.bytes -= moved
        verdict = self._quotas(whole.key, 0, now)
        if type(verdict) is Refusal:
            if moved and self.budget is not None:
                self.budget.give(moved)
            return verdict
        verdict.bytes = moved  # type: ignore[union-attr]
        return verdict

    def _identify(self, authorization: bytes | None) -> _KeyState | None:
        if authorization is None or authorization[:7].lower() != _BEARER:
            return None
        presented = digest(authorization[7:].strip())
        compare = hmac.compare_digest
        matches = [compare(known, presented) for known in self._digests]  # every key, every time
        return self._keys[matches.index(True)] if True in matches else None

    def _quotas(self, state: _KeyState | None, nbytes: int, now: float) -> Admission | Refusal:
        concurrency = bucket = None
        if state is not None:
            concurrency, bucket = state.concurrency, state.bucket
            if concurrency is not None and not concurrency.enter():
                return Refusal(RefusalKind.EXHAUSTED, "too many requests in flight for this API key "
                                                      f"(max_concurrent {state.key.max_concurrent})", 1)
        budget = self.budget
        if budget is not None and nbytes and not budget.take(nbytes):
            if concurrency is not None:
                concurrency.leave()
            return self._over_budget(nbytes)
        if bucket is not None:
            wait = bucket.take(now)
            if wait:
                if concurrency is not None:
                    concurrency.leave()
                if budget is not None and nbytes:
                    budget.give(nbytes)
                rps = state.key.requests_per_second  # type: ignore[union-attr]
                return Refusal(RefusalKind.EXHAUSTED,
                               f"request rate over this API key's limit (requests_per_second {rps:g})",
                               retry_after_secs(wait))
        return Admission(concurrency, nbytes if budget is not None else 0, state)

    def grow(self, admission: Admission, nbytes: int) -> Refusal | None:
        """A request's body turned out `nbytes` larger than reserved (no declared size): reserve them too,
        or refuse; on refusal the admission still holds what it held, for `release`."""
        budget = self.budget
        if budget is None or not nbytes:
            return None
        if not budget.take(nbytes):
            return self._over_budget(admission.bytes + nbytes)
        admission.bytes += nbytes
        return None

    def release(self, admission: Admission) -> None:
        """The request was answered or dropped: its slot and its bytes go back. Called once per Admission."""
        if admission.concurrency is not None:
            admission.concurrency.leave()
            admission.concurrency = None
        if admission.bytes and self.budget is not None:
            self.budget.give(admission.bytes)
            admission.bytes = 0

    def _over_budget(self, nbytes: int) -> Refusal:
        budget = self.budget
        assert budget is not None
        if nbytes > budget.limit:
            return Refusal(RefusalKind.EXHAUSTED, f"request of {nbytes} bytes is larger than the server's "
                                                  f"budget of {budget.limit} bytes in flight "
                                                  "(--max-inflight-bytes)", 1)
        return Refusal(RefusalKind.EXHAUSTED, f"the server holds {budget.used} bytes of requests in flight; "
                                              f"{nbytes} more would exceed --max-inflight-bytes "
                                              f"({budget.limit}): retry shortly", 1)


def access_config(http_restricted: tuple[str, ...] = (), grpc_restricted: tuple[str, ...] = (),
                  api_keys_file: Path | None = None, max_inflight_bytes: int = 0,
                  remote_admin: tuple[str, ...] = (), quota_replicas: int = 1) -> AccessConfig:
    """The flags as given, parsed and checked: RestrictionError (Triton's words) or ApiKeysError. The keys'
    limits are this replica's share of them (`--quota-replicas`: api_keys.per_replica)."""
    keys = load_api_keys(api_keys_file) if api_keys_file is not None else ()
    return AccessConfig(parse_restrictions(list(http_restricted), "http-restricted-api"),
                        parse_restrictions(list(grpc_restricted), "grpc-restricted-protocol",
                                           GRPC_RESTRICTED_PREFIX),
                        per_replica(keys, quota_replicas),
                        max_inflight_bytes, parse_admin_groups(remote_admin))


def parse_admin_groups(values: tuple[str, ...]) -> frozenset[ApiGroup]:
    """--allow-remote-admin-api's values (`model-repository,logging`, repeatable): admin groups only."""
    groups = set()
    for value in values:
        for name in value.split(","):
            try:
                group = ApiGroup(name.strip())
            except ValueError:
                group = None
            if group not in ADMIN_GROUPS:
                admin = ", ".join(sorted(g.value for g in ADMIN_GROUPS))
                raise RestrictionError(f"--allow-remote-admin-api: '{name.strip()}' is not an admin API "
                                       f"group; admin groups: {admin}")
            groups.add(group)
    return frozenset(groups)  # type: ignore[arg-type]


def policies(config: AccessConfig, share: int = 1, index: int = 0
             ) -> tuple[AccessPolicy | None, AccessPolicy | None]:
    """The HTTP and gRPC frontends' policies of one process (None where nothing concerns a protocol)."""
    if not (config.needs_policy(False) or config.needs_policy(True)):
        return None, None
    policy = AccessPolicy(config, time.monotonic(), share, index)
    return (policy if config.needs_policy(False) else None,
            policy.for_grpc() if config.needs_policy(True) else None)


def _carries(headers: Mapping[bytes, bytes], restriction: Restriction) -> bool:
    value = headers.get(restriction.field)
    return value is not None and hmac.compare_digest(value, restriction.value.encode("latin-1"))


__all__ = ["ADMIN_GROUPS", "GRPC_RESTRICTED", "GRPC_STATUS", "HTTP_RESTRICTED", "HTTP_STATUS", "AccessConfig",
           "AccessPolicy", "Admission", "LoopbackOnly", "PolicyError", "Refusal", "RefusalKind",
           "access_config", "parse_admin_groups", "policies"]
