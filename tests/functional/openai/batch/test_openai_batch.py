"""The Batch API (/v1/files, /v1/batches; engine/openai/batch/) against a real server serving tiny_decoder,
with the official `openai` package as the client, unmodified, and raw HTTP for the errors: upload, a job
through the engine whose answers equal the interactive endpoint's, the output and error files in OpenAI's
form, cancel, listing, the size bounds, and a job that survives a server restart."""

from __future__ import annotations

import http.client
import io
import json
import time
from pathlib import Path

import openai
import pytest

from conftest import RunningServer, openai_client, start_server
from engine.openai.batch.jobs import JobStore, expired_result
from test_openai_api import MODEL, build_repository


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.mktemp("batch") / "repo")


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("batch_run")
    running = start_server(repo, folder / "server.log", "--batch-dir", str(folder / "jobs"),
                           "--batch-max-file-mb", "1", "--batch-max-requests", "20")
    yield running
    running.stop()


def client_of(server: RunningServer) -> openai.OpenAI:
    return openai_client(server)


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return client_of(server)


def line(custom_id: str, prompt: str, max_tokens: int = 8, url: str = "/v1/completions", **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url,
            "body": {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, **body}}


def jsonl(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


def wait_for(client: openai.OpenAI, batch_id: str, statuses: tuple[str, ...], timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        time.sleep(0.05)


def results(client: openai.OpenAI, file_id: str | None) -> dict[str, dict]:
    if file_id is None:
        return {}
    text = client.files.content(file_id).text
    return {r["custom_id"]: r for r in map(json.loads, text.splitlines())}


def test_a_batch_runs_through_the_engine_and_answers_as_the_endpoint_does(client: openai.OpenAI):
    requests = [line(f"req-{i}", f"prompt number {i}") for i in range(6)]
    requests.append(line("bad", "x", max_tokens=100_000))  # over the context: a failed request, not a job
    uploaded = client.files.create(file=("input.jsonl", io.BytesIO(jsonl(requests))), purpose="batch")
    assert uploaded.object == "file" and uploaded.purpose == "batch" and uploaded.filename == "input.jsonl"
    assert client.files.retrieve(uploaded.id).bytes == len(jsonl(requests))
    assert client.files.content(uploaded.id).content == jsonl(requests)
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions",
                                  completion_window="24h", metadata={"job": "nightly"})
    assert batch.status in ("validating", "in_progress") and batch.metadata == {"job": "nightly"}
    done = wait_for(client, batch.id, ("completed", "failed"))
    assert done.status == "completed", done.errors
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (7, 6, 1)
    assert done.completed_at is not None and done.in_progress_at is not None
    out = results(client, done.output_file_id)
    assert sorted(out) == [f"req-{i}" for i in range(6)]
    for i in range(6):
        answer = out[f"req-{i}"]
        assert answer["id"].startswith("batch_req_") and answer["error"] is None
        assert answer["response"]["status_code"] == 200
        body = answer["response"]["body"]
        interactive = client.completions.create(model=MODEL, prompt=f"prompt number {i}", max_tokens=8,
                                                temperature=0.0)
        assert body["choices"][0]["text"] == interactive.choices[0].text  # greedy: the same tokens
        assert body["usage"]["completion_tokens"] == interactive.usage.completion_tokens
    failed = results(client, done.error_file_id)["bad"]
    assert failed["response"]["status_code"] == 400
    assert failed["response"]["body"]["error"]["code"] == "context_length_exceeded"
    listed = client.batches.list(limit=100)
    assert batch.id in [b.id for b in listed.data]


def test_a_chat_batch(client: openai.OpenAI):
    requests = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"model": MODEL, "messages": [{"role": "user", "content": f"hello {i}"}],
                          "max_tokens": 5, "temperature": 0.0}} for i in range(3)]
    uploaded = client.files.create(file=("chat.jsonl", jsonl(requests)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    done = wait_for(client, batch.id, ("completed", "failed"))
    assert done.status == "completed" and done.request_counts.completed == 3
    out = results(client, done.output_file_id)
    assert out["c1"]["response"]["body"]["object"] == "chat.completion"
    assert done.error_file_id is None  # nothing failed: no error file, as OpenAI


def test_an_input_file_that_does_not_validate_fails_the_batch_with_its_lines(client: openai.OpenAI):
    bad = jsonl([line("a", "x"), line("a", "y"), line("b", "z", url="/v1/chat/completions")]) + b"{nope\n"
    uploaded = client.files.create(file=("bad.jsonl", bad), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions",
                                  completion_window="24h")
    failed = wait_for(client, batch.id, ("failed", "completed"))
    assert failed.status == "failed" and failed.failed_at is not None
    assert [(e.code, e.line) for e in failed.errors.data] == [
        ("duplicate_custom_id", 2), ("mismatched_endpoint", 3), ("invalid_json_line", 4)]


def test_cancel_stops_a_job_and_keeps_what_finished(client: openai.OpenAI):
    requests = [line(f"long-{i}", f"p{i}", max_tokens=400, extra=None) for i in range(20)]
    for r in requests:
        r["body"].pop("extra")
        r["body"]["ignore_eos"] = True
    uploaded = client.files.create(file=("long.jsonl", jsonl(requests)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions",
                                  completion_window="24h")
    wait_for(client, batch.id, ("in_progress",))
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    cancelled = wait_for(client, batch.id, ("cancelled",), timeout=30)
    counts = cancelled.request_counts
    assert counts.total == 20 and counts.completed < 20 and cancelled.cancelled_at is not None
    assert len(results(client, cancelled.output_file_id)) == counts.completed
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def raw(server: RunningServer, method: str, path: str, body: bytes = b"",
        headers: dict[str, str] | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    conn.request(method, path, body, headers or {})
    answer = conn.getresponse()
    return answer.status, json.loads(answer.read())


def test_bounds_and_bad_requests_answer_openai_errors(server: RunningServer, client: openai.OpenAI):
    with pytest.raises(openai.BadRequestError) as err:  # over --batch-max-requests 20
        client.files.create(file=("many.jsonl", jsonl([line(f"r{i}", "x") for i in range(21)])),
                            purpose="batch")
    assert err.value.code == "too_many_requests" and "at most 20" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:  # over --batch-max-file-mb 1
        client.files.create(file=("big.jsonl", b"x" * ((1 << 20) + 1)), purpose="batch")
    assert err.value.code == "file_too_large"
    with pytest.raises(openai.BadRequestError) as err:
        client.files.create(file=("f.jsonl", jsonl([line("a", "x")])), purpose="fine-tune")
    assert err.value.param == "purpose"
    with pytest.raises(openai.NotFoundError) as err:
        client.batches.retrieve("batch_" + "0" * 32)
    assert "No such Batch object" in err.value.message
    with pytest.raises(openai.BadRequestError):  # a '..' segment: refused as a path before it names a file
        client.files.content("file-../../etc/passwd")
    uploaded = client.files.create(file=("ok.jsonl", jsonl([line("a", "x")])), purpose="batch")
    with pytest.raises(openai.BadRequestError) as err:
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    assert err.value.param == "endpoint"
    with pytest.raises(openai.BadRequestError) as err:
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="1h")
    assert err.value.param == "completion_window"
    status, doc = raw(server, "POST", "/v1/files", b"{}", {"Content-Type": "application/json"})
    assert status == 400 and "multipart/form-data" in doc["error"]["message"]
    status, doc = raw(server, "DELETE", "/v1/batches")
    assert status == 405 and doc["error"]["type"] == "invalid_request_error"


def test_the_batch_api_is_off_without_a_folder(repo: Path, tmp_path: Path):
    srv = start_server(repo, tmp_path / "server.log")
    try:
        status, doc = raw(srv, "GET", "/v1/batches")
        assert status == 501 and "--batch-dir" in doc["error"]["message"]
    finally:
        srv.stop()


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_job_survives_a_restart_and_runs_only_what_was_left(repo: Path, tmp_path: Path, how: str):
    """`stop`: SIGTERM, the server aborts the job's requests and exits; `kill`: SIGKILL mid-job (one
    process, so nothing is left behind), which may leave a torn result line."""
    jobs = tmp_path / "jobs"
    flags = ("--batch-dir", str(jobs), "--batch-requests-in-flight", "4") + (
        ("--workers", "1") if how == "kill" else ())
    requests = [line(f"r{i}", f"restart {i}", max_tokens=200, ignore_eos=True) for i in range(16)]
    srv = start_server(repo, tmp_path / "first.log", *flags)
    try:
        client = client_of(srv)
        uploaded = client.files.create(file=("in.jsonl", jsonl(requests)), purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions",
                                      completion_window="24h")
        deadline = time.monotonic() + 120
        while client.batches.retrieve(batch.id).request_counts.completed < 2:  # some done, most not
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        if how == "kill":
            srv.process.kill()
            srv.process.wait(timeout=30)
        else:
            srv.stop()
    on_disk = json.loads((jobs / "batches" / f"{batch.id}.json").read_text())  # the owner, and the job
    partial = (jobs / "batches" / f"{batch.id}.output.jsonl").read_bytes().splitlines()
    assert on_disk["owner"] == "" and on_disk["batch"]["status"] == "in_progress" and 2 <= len(partial) < 16
    srv = start_server(repo, tmp_path / "second.log", *flags)
    try:
        client = client_of(srv)
        done = wait_for(client, batch.id, ("completed", "failed"))
        assert done.status == "completed" and done.request_counts.completed == 16
        out = results(client, done.output_file_id)
        assert sorted(out) == sorted(f"r{i}" for i in range(16))  # each once: nothing lost, nothing twice
        assert sum(1 for raw_line in client.files.content(done.output_file_id).text.splitlines()) == 16
        assert "resuming" in srv.log()
    finally:
        srv.stop()


def expiring_job(client: openai.OpenAI) -> tuple[str, list[str]]:
    """A job of 3 short requests, then 60 of 400 tokens: with one request in flight the short ones finish
    at once and the long ones take far longer than a few seconds' window."""
    requests = [line(f"s{i}", f"short {i}", max_tokens=2) for i in range(3)] + [
        line(f"l{i}", f"long {i}", max_tokens=400, ignore_eos=True) for i in range(60)]
    uploaded = client.files.create(file=("in.jsonl", jsonl(requests)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions",
                                  completion_window="24h")
    return batch.id, [r["custom_id"] for r in requests]


def assert_expired(client: openai.OpenAI, batch, custom_ids: list[str]) -> None:
    """Expired as OpenAI's are: the results so far in the output file, every other request once in the error
    file as batch_expired (no response), counted as failed; no cancel any more."""
    counts = batch.request_counts
    assert batch.status == "expired" and batch.expired_at >= batch.expires_at
    assert counts.total == len(custom_ids) and 3 <= counts.completed < counts.total
    assert counts.completed + counts.failed == counts.total
    out, err = results(client, batch.output_file_id), results(client, batch.error_file_id)
    assert len(out) == counts.completed and all(r["response"]["status_code"] == 200 for r in out.values())
    assert {"s0", "s1", "s2"} <= set(out)
    assert sorted([*out, *err]) == sorted(custom_ids)  # each request once
    assert len(client.files.content(batch.error_file_id).text.splitlines()) == counts.failed
    assert all(r["response"] is None and r["error"] == {
        "code": "batch_expired", "message": "This request could not be executed before the completion window "
                                            "expired."} for r in err.values())
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_a_job_not_finished_within_its_window_expires_keeping_its_results(repo: Path, tmp_path: Path):
    srv = start_server(repo, tmp_path / "server.log", "--batch-dir", str(tmp_path / "jobs"),
                       "--batch-completion-window-secs", "3", "--batch-requests-in-flight", "1")
    try:
        client = client_of(srv)
        batch_id, custom_ids = expiring_job(client)
        batch = wait_for(client, batch_id, ("expired", "completed"), timeout=30)
        assert batch.expires_at - batch.created_at == 3
        assert_expired(client, batch, custom_ids)
        assert client.completions.create(model=MODEL, prompt="abc", max_tokens=3).usage.completion_tokens == 3
    finally:
        srv.stop()


def test_a_job_resumed_after_its_window_ended_expires_at_once(repo: Path, tmp_path: Path):
    flags = ("--batch-dir", str(tmp_path / "jobs"), "--batch-completion-window-secs", "4",
             "--batch-requests-in-flight", "1")
    srv = start_server(repo, tmp_path / "first.log", *flags)
    try:
        client = client_of(srv)
        batch_id, custom_ids = expiring_job(client)
        batch = wait_for(client, batch_id, ("in_progress",))
        deadline = time.monotonic() + 30
        while client.batches.retrieve(batch_id).request_counts.completed < 3:  # the short ones
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        srv.stop()  # within the window: the job stays in_progress on disk
    on_disk = json.loads((tmp_path / "jobs" / "batches" / f"{batch_id}.json").read_text())["batch"]
    finished = (tmp_path / "jobs" / "batches" / f"{batch_id}.output.jsonl").read_bytes().count(b"\n")
    assert on_disk["status"] == "in_progress" and finished >= 3
    time.sleep(max(0.0, batch.expires_at + 1 - time.time()))  # the window ends while the server is down
    srv = start_server(repo, tmp_path / "second.log", *flags)
    try:
        client = client_of(srv)
        expired = wait_for(client, batch_id, ("expired", "completed"), timeout=10)
        assert_expired(client, expired, custom_ids)
        assert expired.request_counts.completed == finished  # nothing more ran
    finally:
        srv.stop()


def test_a_resume_cuts_off_an_interrupted_expiry_and_a_torn_line(tmp_path: Path):
    """JobStore.read_done (jobs.py) on result files left by a crash while a job expired: the expired lines
    (written last, all at once) are cut off so the expiry runs again, as is a torn last line."""
    store = JobStore(tmp_path)
    batch_id = "batch_" + "1" * 32

    def result(number: int, status: int) -> bytes:
        return json.dumps({"id": "batch_req_x", "custom_id": f"c{number}", "error": None, "response": {
            "status_code": status, "request_id": f"{batch_id}-{number}", "body": {}}}).encode() + b"\n"

    store.result_path(batch_id, False).write_bytes(result(1, 200) + result(3, 200) + b'{"id": "batch_req_')
    failed = result(2, 400)
    store.result_path(batch_id, True).write_bytes(failed + expired_result("c4") + expired_result("c5")[:30])
    done, ok, bad = store.read_done(batch_id)
    assert (list(done), ok, bad) == ([1, 2, 3], 2, 1)
    assert store.result_path(batch_id, True).read_bytes() == failed
    assert store.result_path(batch_id, False).read_bytes() == result(1, 200) + result(3, 200)
