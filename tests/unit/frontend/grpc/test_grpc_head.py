"""A gRPC call's head checks (engine/frontend/grpc/head.py `admit_head`), as plain functions: every refusal,
each with a head that would also fail every later check, so the order is pinned; and what an admitted head
holds. The answers on the wire are tests/test_grpc_api.py's, test_access_server.py's and
test_health_watch.py's.
"""

from __future__ import annotations

from engine.access.api_keys import parse_api_keys
from engine.access.groups import ApiGroup
from engine.access.policy import AccessConfig, AccessPolicy, Admission, LoopbackOnly
from engine.frontend.grpc.api_groups import grpc_group
from engine.frontend.grpc.handlers import GrpcHandlers
from engine.frontend.grpc.handlers import GrpcStatus as S
from engine.frontend.grpc.head import HeadAdmission, HeadRefusal, HeadRules, admit_head
from engine.frontend.grpc.rpcs import rpc_table
from engine.frontend.h2.headers import RequestHead

INFER = b"/inference.GRPCInferenceService/ModelInfer"
STREAM = b"/inference.GRPCInferenceService/ModelStreamInfer"
LOAD = b"/inference.GRPCInferenceService/RepositoryModelLoad"
WATCH = b"/grpc.health.v1.Health/Watch"
RPCS = rpc_table(GrpcHandlers(None))  # type: ignore[arg-type]  # the real table; no handler is called
GROUPS = {path: grpc_group(path) for path in RPCS}
KEYS = {"keys": [{"key": "admin", "groups": ["*"]},
                 {"key": "app", "groups": ["inference", "health"], "requests_per_second": 1}]}


def rules(limit: int = 8192, loopback_only: bool = False, keys: bool = False) -> HeadRules:
    access = None
    if keys:
        access = AccessPolicy(AccessConfig({}, {}, parse_api_keys(KEYS)), 0.0).for_grpc()
    only = LoopbackOnly(frozenset({ApiGroup.MODEL_REPOSITORY}), grpc=True) if loopback_only else None
    return HeadRules(RPCS, GROUPS, limit, only, access)


def head(path: bytes = INFER, size: int = 100, **fields: bytes) -> RequestHead:
    base = {b":method": b"POST", b":path": path, b"content-type": b"application/grpc"}
    base.update({name.replace("_", "-").encode(): value for name, value in fields.items()})
    return RequestHead(base, "", size)


class Watches:
    """GrpcApp.open_watch's answer, as admit_head sees it: "" (counted) until `cap` are open."""

    def __init__(self, cap: int = 1) -> None:
        self.cap, self.open = cap, 0

    def __call__(self) -> str:
        if self.open >= self.cap:
            return "too many watches"
        self.open += 1
        return ""


def refusal(outcome: HeadRefusal | HeadAdmission) -> tuple[int, str, int]:
    assert isinstance(outcome, HeadRefusal), outcome
    return outcome.status, outcome.message, outcome.http_status


def admit(r: HeadRules, h: RequestHead, on_loopback: bool = True,
          watches: Watches | None = None) -> HeadRefusal | HeadAdmission:
    return admit_head(r, h, on_loopback, 0.0, watches or Watches())


def test_a_plain_head_is_admitted_with_its_rpc_and_no_deadline() -> None:
    outcome = admit(rules(), head())
    assert isinstance(outcome, HeadAdmission)
    assert outcome.rpc is RPCS[INFER] and outcome.timeout_s is None and outcome.admission is None
    assert not outcome.watch_counted


def test_grpc_timeout_is_the_deadline_and_a_malformed_one_is_ignored() -> None:
    assert admit(rules(), head(grpc_timeout=b"250m")).timeout_s == 0.25  # type: ignore[union-attr]
    assert admit(rules(), head(grpc_timeout=b"2S")).timeout_s == 2.0  # type: ignore[union-attr]
    assert admit(rules(), head(grpc_timeout=b"soon")).timeout_s is None  # type: ignore[union-attr]


def test_1_a_bad_request_id_comes_first_and_is_not_echoed() -> None:
    bad = head(b"/nowhere", 10**6, x_request_id=b"a\x01b", content_type=b"text/plain")
    outcome = admit(rules(limit=10), bad, on_loopback=False)
    status, message, http_status = refusal(outcome)
    assert status == S.INVALID_ARGUMENT and message.startswith("metadata x-request-id ")
    assert http_status == 200 and outcome.bad_request_id  # type: ignore[union-attr]


def test_2_the_header_list_size() -> None:
    h = head(b"/nowhere", 9000, content_type=b"text/plain")
    assert refusal(admit(rules(limit=8192), h)) == (
        S.RESOURCE_EXHAUSTED, "request headers of 9000 bytes exceed the limit of 8192", 200)
    assert not admit(rules(limit=8192), h).bad_request_id  # type: ignore[union-attr]


def test_3_the_method() -> None:
    h = head(b"/nowhere", content_type=b"text/plain")
    h.fields[b":method"] = b"GET"
    assert refusal(admit(rules(), h)) == (S.UNIMPLEMENTED, "gRPC needs POST", 405)


def test_4_the_content_type() -> None:
    assert refusal(admit(rules(), head(b"/nowhere", content_type=b"text/plain"))) == (
        S.UNKNOWN, "content-type must be application/grpc", 415)
    assert isinstance(admit(rules(), head(content_type=b"application/grpc+proto")), HeadAdmission)


def test_5_an_unknown_method() -> None:
    assert refusal(admit(rules(loopback_only=True, keys=True), head(b"/x/\xff"), on_loopback=False)) == (
        S.UNIMPLEMENTED, "unknown method /x/\ufffd", 200)


def test_6_an_admin_group_off_loopback_before_the_access_policy() -> None:
    status, message, _ = refusal(admit(rules(loopback_only=True, keys=True), head(LOAD), on_loopback=False))
    assert status == S.UNAVAILABLE and "--grpc-restricted-protocol" in message
    admitted = admit(rules(loopback_only=True), head(LOAD), on_loopback=True)
    assert isinstance(admitted, HeadAdmission)  # a client on this machine is not asked
    assert isinstance(admit(rules(loopback_only=True), head(INFER), on_loopback=False), HeadAdmission)


def test_7_the_access_policy_its_refusal_and_its_admission() -> None:
    r = rules(keys=True)
    assert refusal(admit(r, head()))[0] == S.UNAUTHENTICATED
    assert refusal(admit(r, head(LOAD, authorization=b"Bearer app")))[0] == S.PERMISSION_DENIED
    outcome = admit(r, head(authorization=b"Bearer app"))
    assert isinstance(outcome, HeadAdmission) and isinstance(outcome.admission, Admission)
    status, message, _ = refusal(admit(r, head(authorization=b"Bearer app")))  # 1 request a second
    assert status == S.RESOURCE_EXHAUSTED and "(retry after 1 s)" in message
    streamed = admit(r, head(STREAM, authorization=b"Bearer app"))  # a stream takes no quota at its head
    assert isinstance(streamed, HeadAdmission) and streamed.admission is not None


def test_8_the_watch_caps_come_last() -> None:
    watches = Watches(cap=1)
    assert refusal(admit(rules(keys=True), head(WATCH), watches=watches))[0] == S.UNAUTHENTICATED
    assert watches.open == 0  # not counted: refused before the caps are asked
    first = admit(rules(), head(WATCH), watches=watches)
    assert isinstance(first, HeadAdmission) and first.watch_counted and watches.open == 1
    assert refusal(admit(rules(), head(WATCH), watches=watches)) == (S.RESOURCE_EXHAUSTED, "too many watches",
                                                                     200)
    r = rules(keys=True)
    assert refusal(admit(r, head(WATCH, authorization=b"Bearer app"), watches=watches))[0] == \
        S.RESOURCE_EXHAUSTED
