"""The Batch API on two replicas sharing one `--batch-dir` (`--batch-shared`; engine/openai/batch/claims.py,
docs/replicas.md), behind a round-robin proxy (perf/hubserve_harness/proxy.py), with the official `openai`
package as the client: every batch call answered by whichever replica the proxy picks, a job created through
one replica read, downloaded and cancelled through the other, a job whose replica is killed finished by the
other, each request once, and a key's bounds counted over both; and, without `--batch-shared`, the other
replica's 404."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from conftest import RunningServer, start_server, wait_until
from hubserve_harness.proxy import RoundRobinProxy
from test_openai_api import build_repository
from test_openai_batch import jsonl, line, results

SHARED = ("--batch-shared", "--batch-claim-interval-secs", "0.2", "--batch-requests-in-flight", "2",
          "--workers", "1")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.mktemp("replicas") / "repo")


def start_replicas(repo: Path, folder: Path, *extra: str) -> list[RunningServer]:
    jobs = folder / "jobs"  # the shared volume: one folder both replicas were started with
    replicas = []
    for name in ("a", "b"):
        replicas.append(start_server(repo, folder / f"{name}.log", "--batch-dir", str(jobs), *SHARED, *extra))
    return replicas


@pytest.fixture(scope="module")
def replicas(repo: Path, tmp_path_factory: pytest.TempPathFactory):
    running = start_replicas(repo, tmp_path_factory.mktemp("shared"))
    yield running
    for srv in running:
        srv.stop()


def client_at(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{url}/v1", api_key="unused", max_retries=0, timeout=60)


def wait_status(client: openai.OpenAI, batch_id: str, statuses: tuple[str, ...], timeout_s: float = 120.0):
    return wait_until(lambda: (b := client.batches.retrieve(batch_id)).status in statuses and b,
                      f"batch {batch_id} in {statuses}", timeout_s)


def long_requests(prefix: str, n: int, tokens: int) -> bytes:
    return jsonl([line(f"{prefix}{i}", f"{prefix} {i}", max_tokens=tokens, ignore_eos=True)
                   for i in range(n)])


def test_any_replica_answers_any_batch_call_through_the_proxy(replicas: list[RunningServer]):
    with RoundRobinProxy([("127.0.0.1", r.http_port) for r in replicas]) as proxy:
        client = client_at(proxy.url)
        data = jsonl([line(f"q{i}", f"shared {i}") for i in range(4)])
        uploaded = client.files.create(file=("in.jsonl", data), purpose="batch")
        assert client.files.retrieve(uploaded.id).bytes == len(data)  # the other replica
        assert client.files.content(uploaded.id).content == data
        assert uploaded.id in [f.id for f in client.files.list()]
        batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions",
                                      completion_window="24h")
        done = wait_status(client, batch.id, ("completed", "failed"))
        assert done.status == "completed" and done.request_counts.completed == 4, done
        assert sorted(results(client, done.output_file_id)) == [f"q{i}" for i in range(4)]
        output = client.files.content(done.output_file_id).text
        assert batch.id in [b.id for b in client.batches.list()]
        calls = [(method, index) for method, path, index in proxy.routed if path.startswith("/v1/")]
        assert {index for _, index in calls} == {0, 1}  # both replicas answered batch calls
    for srv in replicas:  # and each answers every one of them on its own
        direct = client_at(srv.http_url)
        assert direct.batches.retrieve(batch.id).status == "completed"
        assert direct.files.content(done.output_file_id).text == output


def test_a_job_created_through_one_replica_is_read_downloaded_and_cancelled_through_the_other(
        replicas: list[RunningServer]):
    a, b = (client_at(r.http_url) for r in replicas)
    uploaded = a.files.create(file=("long.jsonl", long_requests("c", 20, 300)), purpose="batch")
    batch = a.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
    assert b.files.content(uploaded.id).content == long_requests("c", 20, 300)
    wait_until(lambda: b.batches.retrieve(batch.id).request_counts.completed >= 1, "a result seen through b")
    cancelling = b.batches.cancel(batch.id)  # b does not run it: a sees b's cancel at its next sweep
    assert cancelling.status == "cancelling"
    cancelled = wait_status(b, batch.id, ("cancelled",), timeout_s=30)
    counts = cancelled.request_counts
    assert 1 <= counts.completed < 20 and cancelled.cancelled_at is not None
    out = results(b, cancelled.output_file_id)  # written by a, downloaded through b
    assert len(out) == counts.completed and all(r["response"]["status_code"] == 200 for r in out.values())
    assert a.batches.retrieve(batch.id).status == "cancelled"
    with pytest.raises(openai.ConflictError):
        b.batches.cancel(batch.id)
    assert f"batch {batch.id}: claimed by this replica" not in replicas[1].log()  # a ran it to the end


def test_the_other_replica_finishes_a_job_whose_replica_was_killed(repo: Path, tmp_path: Path):
    a_srv, b_srv = start_replicas(repo, tmp_path)
    try:
        a, b = client_at(a_srv.http_url), client_at(b_srv.http_url)
        uploaded = a.files.create(file=("in.jsonl", long_requests("k", 40, 400)), purpose="batch")
        batch = a.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions",
                                 completion_window="24h")
        wait_until(lambda: b.batches.retrieve(batch.id).request_counts.completed >= 2, "a's first results")
        a_srv.process.kill()  # SIGKILL: no goodbye; the kernel drops its lock
        a_srv.process.wait(timeout=30)
        left = b.batches.retrieve(batch.id)
        assert left.status == "in_progress" and left.request_counts.completed < 40  # a died mid-job
        done = wait_status(b, batch.id, ("completed", "failed"))
        assert done.status == "completed" and done.request_counts.completed == 40, done
        output = b.files.content(done.output_file_id).text.splitlines()
        custom_ids = [json.loads(raw)["custom_id"] for raw in output]
        assert sorted(custom_ids) == sorted(f"k{i}" for i in range(40))  # each request once
        assert f"batch {batch.id}: claimed by this replica" in b_srv.log()
    finally:
        a_srv.stop()
        b_srv.stop()


def test_a_keys_bounds_count_the_files_every_replica_wrote(repo: Path, tmp_path: Path):
    a_srv, b_srv = start_replicas(repo, tmp_path, "--batch-max-files-per-key", "2")
    try:
        a, b = client_at(a_srv.http_url), client_at(b_srv.http_url)
        data = jsonl([line("x", "y")])
        a.files.create(file=("1.jsonl", data), purpose="batch")
        second = b.files.create(file=("2.jsonl", data), purpose="batch")
        for client in (a, b):  # each replica counts both: the third is refused wherever it goes
            with pytest.raises(openai.BadRequestError, match="holds 2 files"):
                client.files.create(file=("3.jsonl", data), purpose="batch")
        a.files.delete(second.id)  # deleted through the other replica: room again
        b.files.create(file=("3.jsonl", data), purpose="batch")
    finally:
        a_srv.stop()
        b_srv.stop()


def test_one_folder_without_batch_shared_is_one_replica_s_alone(repo: Path, tmp_path: Path):
    """What `--batch-shared` changes: two replicas on one folder without it each answer from what the folder
    held when they started, so a file uploaded through one is 404 through the other."""
    flags = ("--batch-dir", str(tmp_path / "jobs"), "--workers", "1")
    a_srv = start_server(repo, tmp_path / "a.log", *flags)
    b_srv = start_server(repo, tmp_path / "b.log", *flags)
    try:
        uploaded = client_at(a_srv.http_url).files.create(file=("in.jsonl", jsonl([line("x", "y")])),
                                                          purpose="batch")
        with pytest.raises(openai.NotFoundError):
            client_at(b_srv.http_url).files.retrieve(uploaded.id)
    finally:
        a_srv.stop()
        b_srv.stop()
