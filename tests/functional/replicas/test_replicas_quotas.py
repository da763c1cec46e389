"""A key's quotas on two replicas behind a round-robin proxy (docs/replicas.md "Quotas"): each replica counts
its own, so without `--quota-replicas` a key gets its `tokens_per_minute` from each replica (twice it behind
two); with `--quota-replicas 2` each replica holds half, and the two together never pass the key's limit.
The real `openai` package through the proxy; the refusal is OpenAI's 429."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from conftest import start_server
from hubserve_harness.proxy import RoundRobinProxy
from test_openai_api import MODEL, build_repository

LIMIT = 240  # the key's tokens a minute: it refills at 4 a second, so the test's few seconds add ~20
# Each request reserves its prompt's tokens (1 here) plus max_tokens, and uses them all (ignore_eos): more
# than half a replica's share of 120, so each replica lets exactly one through within the minute.
MAX_TOKENS = 70


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.mktemp("quotas") / "repo")


def passed_through_two_replicas(repo: Path, folder: Path, *extra: str) -> int:
    """How many of 6 requests of the limited key pass through the proxy in front of two fresh replicas."""
    (folder / "keys.yaml").write_text(f'keys:\n  - key: "tenant"\n    groups: [inference]\n'
                                      f"    tokens_per_minute: {LIMIT}\n")
    (folder / "keys.yaml").chmod(0o600)
    flags = ("--api-keys", str(folder / "keys.yaml"), "--workers", "1", *extra)
    replicas = [start_server(repo, folder / f"{name}.log", *flags) for name in ("a", "b")]
    try:
        with RoundRobinProxy([("127.0.0.1", r.http_port) for r in replicas]) as proxy:
            client = openai.OpenAI(base_url=f"http://{proxy.url}/v1", api_key="tenant", max_retries=0)
            passed = 0
            for _ in range(6):
                try:
                    client.completions.create(model=MODEL, prompt="hi", max_tokens=MAX_TOKENS,
                                              temperature=0.0, extra_body={"ignore_eos": True})
                    passed += 1
                except openai.RateLimitError as e:
                    assert "tokens per min" in str(e)
            assert {index for _, _, index in proxy.routed} == {0, 1}
            return passed
    finally:
        for srv in replicas:
            srv.stop()


def test_each_replica_counts_its_own_so_the_limit_multiplies(repo: Path, tmp_path: Path):
    """The problem: 240 a minute per replica, 6 × 71 tokens = 426 pass where the key has 240."""
    assert passed_through_two_replicas(repo, tmp_path) * (MAX_TOKENS + 1) > LIMIT


def test_quota_replicas_splits_the_limit_so_the_fleet_holds_it(repo: Path, tmp_path: Path):
    passed = passed_through_two_replicas(repo, tmp_path, "--quota-replicas", "2")
    assert passed == 2 and passed * (MAX_TOKENS + 1) <= LIMIT
