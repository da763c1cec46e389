"""The access policy, pure (engine/access/policy.py, groups.py, api_keys.py, quotas.py and
frontend/grpc/api_groups.py): Triton's restriction flags parsed as Triton parses them, the keys file, and
every decision the frontends ask for, with time passed in. The real servers are test_access_server.py's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.access.api_keys import ApiKeysError, owner_id, parse_api_keys, per_replica
from engine.access.groups import (
    GRPC_RESTRICTED_PREFIX,
    ApiGroup,
    Restriction,
    RestrictionError,
    parse_restrictions,
)
from engine.access.policy import (
    AccessConfig,
    AccessPolicy,
    Admission,
    PolicyError,
    Refusal,
    RefusalKind,
    access_config,
    policies,
)
from engine.access.quotas import TokenBucket
from engine.frontend.grpc.api_groups import GRPC_GROUPS, grpc_group
from engine.frontend.grpc.handlers import GrpcHandlers
from engine.frontend.grpc.rpcs import rpc_table
from engine.frontend.http.path import parse_target

G = ApiGroup
KEYS = {"keys": [{"key": "admin", "groups": ["*"]},
                 {"key": "app", "groups": ["inference", "metadata", "health"], "requests_per_second": 2,
                  "max_concurrent": 2, "tokens_per_minute": 100}]}


def bearer(key: str) -> dict[bytes, bytes]:
    return {b"authorization": b"Bearer " + key.encode()}


def policy(keys: dict | None = KEYS, budget: int = 0, http: tuple[str, ...] = (), share: int = 1,
           index: int = 0) -> AccessPolicy:
    config = AccessConfig(parse_restrictions(list(http), "http-restricted-api"), {},
                          parse_api_keys(keys) if keys else (), budget)
    return AccessPolicy(config, 0.0, share, index)


def refused(verdict: Admission | Refusal, kind: RefusalKind) -> Refusal:
    assert isinstance(verdict, Refusal), verdict
    assert verdict.kind is kind, verdict
    return verdict


# ---------------------------------------------------------------------------- Triton's flags

def test_restriction_flag_is_split_as_triton_splits_it() -> None:
    parsed = parse_restrictions(["model-repository,model-config:admin-key=a=b:c"], "http-restricted-api")
    assert parsed == {G.MODEL_REPOSITORY: Restriction("admin-key", "a=b:c"),
                      G.MODEL_CONFIG: Restriction("admin-key", "a=b:c")}


def test_multiple_flags_merge_and_grpc_keys_get_tritons_prefix() -> None:
    parsed = parse_restrictions(["inference:infer-key=1", "health,statistics:Ops-Key=2"],
                                "grpc-restricted-protocol", GRPC_RESTRICTED_PREFIX)
    assert parsed[G.INFERENCE].header == "triton-grpc-protocol-infer-key"
    assert parsed[G.HEALTH] == parsed[G.STATISTICS] == Restriction("triton-grpc-protocol-Ops-Key", "2")
    assert parsed[G.HEALTH].field == b"triton-grpc-protocol-ops-key"  # matched case-insensitively


@pytest.mark.parametrize("arg", ["inference", "inference:key", ":k=v", "inference:=v", "inference:k="])
def test_malformed_flag_is_refused_in_tritons_words(arg: str) -> None:
    with pytest.raises(RestrictionError, match=r"^--http-restricted-api option format is "
                                               r"'<config name>:<setting>=<value>'\. Got "):
        parse_restrictions([arg], "http-restricted-api")


def test_unknown_and_repeated_groups_are_refused_in_tritons_words() -> None:
    with pytest.raises(RestrictionError, match="^unknown restricted api 'admin'$"):
        parse_restrictions(["admin:k=v"], "http-restricted-api")
    with pytest.raises(RestrictionError, match="^unknown restricted protocol 'admin'$"):
        parse_restrictions(["admin:k=v"], "grpc-restricted-protocol")
    with pytest.raises(RestrictionError, match="^restricted api 'inference' can not be specified in multiple "
                                               "config groups$"):
        parse_restrictions(["inference:a=1", "metadata,inference:b=2"], "http-restricted-api")


# ---------------------------------------------------------------------------- the keys file

def test_keys_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.touch(0o600)  # a keys file others can read is refused (api_keys.file_mode_problem)
    path.write_text("keys:\n  - key: \"s3cret-admin\"\n    groups: [\"*\"]\n"
                    "  - key: \"s3cret-app\"\n    groups: [inference, metadata, health]\n"
                    "    requests_per_second: 50\n    max_concurrent: 4\n    tokens_per_minute: 20000\n")
    admin, app = access_config(api_keys_file=path).keys
    assert admin.groups == frozenset(ApiGroup)
    assert app.groups == {G.INFERENCE, G.METADATA, G.HEALTH}
    assert (app.requests_per_second, app.max_concurrent, app.tokens_per_minute) == (50.0, 4, 20000)
    assert b"s3cret" not in admin.digest


def test_a_keys_owner_id_follows_its_secret_and_is_what_batch_files_on_disk_name() -> None:
    """The owner id is the one identity past the access policy, and the Batch API keeps it on disk with each
    file and job: the id of a secret must be what it was when those were written (this hex is what
    engine/openai/batch/owners.py's `owner_id` gave for "s3cret-app" before the id moved to api_keys.py)."""
    app, admin = parse_api_keys({"keys": [{"key": "s3cret-app", "groups": ["inference"]},
                                          {"key": "s3cret-admin", "groups": ["*"]}]})
    assert app.owner == owner_id(app.digest) == "key-a8abce1ffea5a2f3287edd48c5cf5f7f"
    swapped = parse_api_keys({"keys": [{"key": "s3cret-admin", "groups": ["*"]},
                                       {"key": "s3cret-app", "groups": ["metadata"]}]})
    assert (swapped[1].owner, swapped[0].owner) == (app.owner, admin.owner) and app.owner != admin.owner
    assert "s3cret" not in app.owner and app.digest.hex()[:32] not in app.owner
    p = policy({"keys": [{"key": "s3cret-app", "groups": ["inference"]}]})
    admitted = p.admit(G.INFERENCE, bearer("s3cret-app"), 0, 0.0)
    assert isinstance(admitted, Admission) and admitted.owner == app.owner


@pytest.mark.parametrize("doc, words", [
    ({}, "must hold one field, 'keys'"),
    ({"keys": []}, "must hold one field, 'keys'"),
    ({"keys": [{"key": "a", "groups": ["inference"], "max_concurent": 2}]},
     "unknown field(s) 'max_concurent'"),
    ({"keys": [{"key": "", "groups": ["inference"]}]}, "'key' must be a non-empty string"),
    ({"keys": [{"key": "a", "groups": []}]}, "'groups' must be a non-empty list"),
    ({"keys": [{"key": "a", "groups": ["admin"]}]}, "unknown API group 'admin'"),
    ({"keys": [{"key": "a", "groups": ["*"], "requests_per_second": 0}]}, "'requests_per_second' must be"),
    ({"keys": [{"key": "a", "groups": ["*"], "max_concurrent": 1.5}]}, "'max_concurrent' must be a positive "
                                                                       "whole number"),
    ({"keys": [{"key": "a", "groups": ["*"]}, {"key": "a", "groups": ["health"]}]}, "keys[1] repeats"),
])
def test_bad_keys_files_are_refused_saying_where(doc: dict, words: str) -> None:
    with pytest.raises(ApiKeysError) as e:
        parse_api_keys(doc)
    assert words in str(e.value)
    assert "'a'" not in str(e.value)  # never the secret


# ---------------------------------------------------------------------------- decisions

def test_restricted_group_needs_its_header_with_its_value() -> None:
    p = policy(None, http=("model-repository:admin-key=xyz",))
    r = refused(p.admit(G.MODEL_REPOSITORY, {}, 0, 0.0), RefusalKind.RESTRICTED)
    assert r.message == "This API is restricted, expecting header 'admin-key'"
    refused(p.admit(G.MODEL_REPOSITORY, {b"admin-key": b"xy"}, 0, 0.0), RefusalKind.RESTRICTED)
    assert isinstance(p.admit(G.MODEL_REPOSITORY, {b"admin-key": b"xyz"}, 0, 0.0), Admission)
    assert isinstance(p.admit(G.INFERENCE, {}, 0, 0.0), Admission)  # other groups stay open


def test_grpc_view_answers_with_tritons_grpc_words() -> None:
    config = access_config(grpc_restricted=("inference:infer-key=1",))
    http, grpc = policies(config)
    assert http is None  # nothing concerns HTTP: it pays nothing
    assert grpc is not None
    r = refused(grpc.admit(G.INFERENCE, {}, 0, 0.0), RefusalKind.RESTRICTED)
    assert r.message == "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'"
    assert isinstance(grpc.admit(G.INFERENCE, {b"triton-grpc-protocol-infer-key": b"1"}, 0, 0.0), Admission)


def test_keys_decide_who_may_call_what_and_health_stays_open() -> None:
    p = policy()
    refused(p.admit(G.METADATA, {}, 0, 0.0), RefusalKind.UNAUTHENTICATED)
    refused(p.admit(G.METADATA, bearer("nope"), 0, 0.0), RefusalKind.UNAUTHENTICATED)
    refused(p.admit(G.METADATA, {b"authorization": b"Basic YXBwOg=="}, 0, 0.0), RefusalKind.UNAUTHENTICATED)
    refused(p.admit(None, {}, 0, 0.0), RefusalKind.UNAUTHENTICATED)  # an unknown path is no way round
    r = refused(p.admit(G.MODEL_REPOSITORY, bearer("app"), 0, 0.0), RefusalKind.FORBIDDEN)
    assert r.message == "this API key may not call the 'model-repository' API"
    assert isinstance(p.admit(G.MODEL_REPOSITORY, bearer("admin"), 0, 0.0), Admission)
    assert isinstance(p.admit(G.METADATA, {b"authorization": b"bearer  app "}, 0, 0.0), Admission)
    assert isinstance(p.admit(G.HEALTH, {}, 0, 0.0), Admission)
    # a health stream the server holds (gRPC Health/Watch) needs a key with the health group
    refused(p.admit(G.HEALTH, {}, 0, 0.0, needs_key=True), RefusalKind.UNAUTHENTICATED)
    assert isinstance(p.admit(G.HEALTH, bearer("app"), 0, 0.0, needs_key=True), Admission)


def test_every_key_of_many_is_found() -> None:
    doc = {"keys": [{"key": f"key-{i}", "groups": ["inference"], "max_concurrent": 1} for i in range(50)]}
    p = policy(doc)
    held = [p.admit(G.INFERENCE, bearer(f"key-{i}"), 0, 0.0) for i in range(50)]
    assert all(isinstance(a, Admission) for a in held)  # each key has its own slot
    refused(p.admit(G.INFERENCE, bearer("key-17"), 0, 0.0), RefusalKind.EXHAUSTED)


def test_rate_limit_has_a_burst_of_one_second_and_says_when_to_retry() -> None:
    p = policy()
    for _ in range(2):
        p.release(p.admit(G.INFERENCE, bearer("app"), 0, 10.0))  # type: ignore[arg-type]
    r = refused(p.admit(G.INFERENCE, bearer("app"), 0, 10.0), RefusalKind.EXHAUSTED)
    assert r.retry_after_secs == 1 and "requests_per_second 2" in r.message
    p.release(p.admit(G.INFERENCE, bearer("app"), 0, 10.5))  # type: ignore[arg-type]  # refilled one
    assert isinstance(p.admit(G.INFERENCE, bearer("admin"), 0, 10.5), Admission)  # no limit on admin


def test_concurrency_limit_counts_requests_until_released() -> None:
    p = policy()
    first, second = (p.admit(G.INFERENCE, bearer("app"), 0, 0.0) for _ in range(2))
    r = refused(p.admit(G.INFERENCE, bearer("app"), 0, 0.0), RefusalKind.EXHAUSTED)
    assert "max_concurrent 2" in r.message and r.retry_after_secs == 1
    p.release(first)  # type: ignore[arg-type]
    assert isinstance(p.admit(G.INFERENCE, bearer("app"), 0, 5.0), Admission)
    del second


def test_a_refused_request_takes_no_token_and_no_bytes() -> None:
    p = policy(budget=1000)
    a = p.admit(G.INFERENCE, bearer("app"), 900, 0.0)
    refused(p.admit(G.INFERENCE, bearer("app"), 200, 0.0), RefusalKind.EXHAUSTED)  # bytes: no token taken
    p.release(a)  # type: ignore[arg-type]
    assert p.budget is not None and p.budget.used == 0
    assert isinstance(p.admit(G.INFERENCE, bearer("app"), 200, 0.0), Admission)  # the second token


def test_a_streams_requests_are_admitted_one_by_one_as_unary_requests() -> None:
    """A ModelStreamInfer call holds no quota itself; each of its requests takes a concurrency slot and a
    rate token of the call's key, and the bytes reserved for its message move to it (given back when it is
    refused)."""
    p = policy(budget=1000)
    call = p.admit(G.INFERENCE, bearer("app"), 0, 0.0, holds_quotas=False)
    assert isinstance(call, Admission) and call.concurrency is None
    refused(p.admit(G.INFERENCE, bearer("nope"), 0, 0.0, holds_quotas=False), RefusalKind.UNAUTHENTICATED)
    assert p.grow(call, 300) is None  # the first message's length prefix
    first = p.admit_part(call, 300, 0.0)
    assert isinstance(first, Admission) and first.bytes == 300 and call.bytes == 0
    second = p.admit_part(call, 0, 0.0)
    assert isinstance(second, Admission)
    assert p.grow(call, 200) is None
    r = refused(p.admit_part(call, 200, 0.0), RefusalKind.EXHAUSTED)  # max_concurrent 2: both slots held
    assert "max_concurrent 2" in r.message
    assert p.budget is not None and p.budget.used == 300 and call.bytes == 0  # the refused message's back
    p.release(first)
    p.release(second)
    r = refused(p.admit_part(call, 0, 0.0), RefusalKind.EXHAUSTED)  # requests_per_second 2: tokens spent
    assert "requests_per_second 2" in r.message
    assert isinstance(p.admit_part(call, 0, 1.0), Admission)
    p.release(call)
    assert p.budget.used == 0


def test_byte_budget_is_server_wide_and_grows_with_undeclared_bodies() -> None:
    p = policy(None, budget=1000)
    a = p.admit(G.INFERENCE, {}, 600, 0.0)
    assert isinstance(a, Admission)
    r = refused(p.admit(G.INFERENCE, {}, 600, 0.0), RefusalKind.EXHAUSTED)
    assert "--max-inflight-bytes" in r.message and r.retry_after_secs == 1
    b = p.admit(G.INFERENCE, {}, 0, 0.0)  # chunked: nothing declared
    assert isinstance(b, Admission)
    assert p.grow(b, 300) is None
    refused(p.grow(b, 200), RefusalKind.EXHAUSTED)  # type: ignore[arg-type]
    p.release(a)
    p.release(b)
    p.release(b)  # a second release gives nothing back twice
    assert p.budget is not None and p.budget.used == 0
    too_big = refused(p.admit(G.INFERENCE, {}, 5000, 0.0), RefusalKind.EXHAUSTED)
    assert "larger than the server's budget of 1000 bytes" in too_big.message


def test_http_and_grpc_share_one_budget_and_one_set_of_quotas() -> None:
    http, grpc = policies(AccessConfig({}, {}, parse_api_keys(KEYS), 1000))
    assert http is not None and grpc is not None
    http.admit(G.INFERENCE, bearer("app"), 800, 0.0)
    grpc.admit(G.INFERENCE, bearer("app"), 0, 0.0)
    refused(grpc.admit(G.INFERENCE, bearer("app"), 0, 0.0), RefusalKind.EXHAUSTED)  # the key's 2 slots
    assert grpc.grow(grpc.admit(G.INFERENCE, bearer("admin"), 0, 0.0), 300) is not None  # type: ignore[arg-type]


def test_limits_split_across_frontend_processes_add_up_to_the_limit() -> None:
    doc = {"keys": [{"key": "k", "groups": ["*"], "max_concurrent": 5, "requests_per_second": 4}]}
    slots = []
    for index in range(2):
        p = policy(doc, budget=1000, share=2, index=index)
        held = [p.admit(G.INFERENCE, bearer("k"), 0, 0.0) for _ in range(4)]
        slots.append(sum(isinstance(a, Admission) for a in held))
        assert p.budget is not None and p.budget.limit == 500
    assert slots == [2, 2]  # the rate's burst, 2 per process, bounds these first: 4 in one second in all
    concurrent = []
    for index in range(2):
        p = policy(doc, share=2, index=index)
        concurrent.append(sum(isinstance(p.admit(G.INFERENCE, bearer("k"), 0, t), Admission)
                              for t in range(10)))
    assert concurrent == [3, 2]  # 5 slots in all


def test_limits_that_cannot_be_split_fail_at_start() -> None:
    doc = {"keys": [{"key": "k", "groups": ["*"], "max_concurrent": 1}]}
    with pytest.raises(PolicyError, match=r"keys\[0\]: max_concurrent 1 cannot be split across 2"):
        policy(doc, share=2)


def test_quota_replicas_give_each_replica_its_share_and_the_shares_never_pass_the_limit() -> None:
    keys = parse_api_keys({"keys": [{"key": "k", "groups": ["*"], "max_concurrent": 5,
                                     "requests_per_second": 3, "tokens_per_minute": 1000},
                                    {"key": "free", "groups": ["*"]}]})
    limited, free = per_replica(keys, 2)
    assert (limited.max_concurrent, limited.requests_per_second, limited.tokens_per_minute) == (2, 1.5, 500)
    assert (free.max_concurrent, free.requests_per_second, free.tokens_per_minute) == (None, None, None)
    assert (limited.owner, limited.groups) == (keys[0].owner, keys[0].groups)  # the same key, less of it
    assert per_replica(keys, 1) is keys


@pytest.mark.parametrize("field", ["max_concurrent", "requests_per_second", "tokens_per_minute"])
def test_a_limit_smaller_than_the_quota_replicas_fails_at_start(field: str) -> None:
    keys = parse_api_keys({"keys": [{"key": "k", "groups": ["*"], field: 2}]})
    with pytest.raises(ApiKeysError, match=rf"keys\[0\]: {field} 2 cannot be split across 3 replicas "
                                           r"\(--quota-replicas 3\)"):
        per_replica(keys, 3)


def test_token_bucket_refills_continuously_up_to_its_burst() -> None:
    bucket = TokenBucket(10.0, 0.0)
    assert all(bucket.take(0.0) == 0.0 for _ in range(10))
    assert bucket.take(0.0) == pytest.approx(0.1)
    assert bucket.take(0.1) == 0.0
    assert sum(bucket.take(100.0) == 0.0 for _ in range(20)) == 10  # never more than one second's worth
    slow = TokenBucket(0.5, 0.0)
    assert slow.take(0.0) == 0.0 and slow.take(0.0) == pytest.approx(2.0)


# ---------------------------------------------------------------------------- endpoints → groups

@pytest.mark.parametrize("url, group", [
    (b"/v2/health/live", G.HEALTH), (b"/v2/health/ready", G.HEALTH), (b"/v2/models/m/ready", G.HEALTH),
    (b"/v2/models/m/versions/1/ready", G.HEALTH), (b"/v2", G.METADATA), (b"/v2/", G.METADATA),
    (b"/v2/models/m", G.METADATA), (b"/v2/models/m/versions/2", G.METADATA),
    (b"/v2/models/m/config", G.MODEL_CONFIG), (b"/v2/models/stats", G.STATISTICS),
    (b"/v2/models/m/stats", G.STATISTICS), (b"/v2/models/m/versions/1/stats", G.STATISTICS),
    (b"/v2/models/m/infer", G.INFERENCE), (b"/v2/models/m/versions/1/infer?x=1", G.INFERENCE),
    (b"/v2/models/m/generate", G.INFERENCE), (b"/v2/models/m/generate_stream", G.INFERENCE),
    (b"/v2/repository/index", G.MODEL_REPOSITORY), (b"/v2/repository/models/m/load", G.MODEL_REPOSITORY),
    (b"/v2/systemsharedmemory/status", G.SHARED_MEMORY),
    (b"/v2/cudasharedmemory/region/r/register", G.SHARED_MEMORY), (b"/v2/trace/setting", G.TRACE),
    (b"/v2/models/m/trace/setting", G.TRACE), (b"/v2/logging", G.LOGGING),
    (b"/v1/chat/completions", G.INFERENCE), (b"/v1/models", G.INFERENCE), (b"/v1/embeddings", G.INFERENCE),
    # vLLM's operational endpoints on the HTTP port, each in its kind's group
    (b"/health", G.HEALTH), (b"/version", G.METADATA), (b"/tokenize", G.INFERENCE),
    (b"/detokenize", G.INFERENCE), (b"/metrics", G.STATISTICS),
    (b"/metrics/x", None), (b"/v2/nothing", None),
])
def test_http_endpoints_are_in_tritons_groups(url: bytes, group: ApiGroup | None) -> None:
    assert parse_target(url).group is group


def test_every_grpc_method_has_a_group() -> None:
    paths = rpc_table(GrpcHandlers(None)).keys()  # type: ignore[arg-type]
    assert {p.rsplit(b"/", 1)[1].decode() for p in paths} == set(GRPC_GROUPS)
    assert grpc_group(b"/inference.GRPCInferenceService/ModelInfer") is G.INFERENCE
    assert grpc_group(b"/grpc.health.v1.Health/Check") is G.HEALTH
    assert grpc_group(b"/inference.GRPCInferenceService/RepositoryModelLoad") is G.MODEL_REPOSITORY


def test_token_quota_reserves_refills_over_a_minute_and_takes_back_the_unused():
    from engine.access.quotas import TokenQuota
    q = TokenQuota(600, now=0.0)  # 10 a second
    assert q.take(500, 0.0) == 0.0 and q.used == 500
    assert q.take(200, 0.0) == 10.0  # 100 short: ten seconds, nothing taken
    assert q.take(200, 10.0) == 0.0  # refilled
    q.give_back(150)  # a request stopped early
    assert q.take(150, 10.0) == 0.0
    assert q.take(601, 100.0) == float("inf")  # more than a minute's worth never fits
