"""Who owns the Batch API's files and jobs, and what one key may hold (engine/openai/batch/: owners.py,
limits.py, files.py, jobs.py, runner.py, input.py), against a real server with a keys file: the `openai`
package as the client, raw HTTP where the point is the bytes of a form. Each key sees only its own files and
jobs (404 for another's, on every endpoint, and after a restart); the caps answer OpenAI's errors and the
server keeps serving; a job's tokens are charged to its key's tokens_per_minute, at the rate it refills; the
listings page with `after`; a multi-MB input with several jobs on it stays within a memory bound. After each
hostile case a correct inference still works over both protocols. Downloads stream: several slow clients of
a multi-MB file cost the server a few chunks each, not a copy each. Run under HUBSERVE_TEST_WORKERS=2 as
well: all of it lives in the engine process, where /v1 requests are forwarded with their key."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import io
import json
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import RunningServer, start_server, wait_until
from test_openai_api import MODEL, build_repository

TPM = 2100  # tokens_per_minute of the "tpm" key: 35 a second
KEYS = ["alice", "bob", "caps", "caps2", "quota", "history", "lister", "mem", "dl"]
KEYS_FILE = "keys:\n" + "".join(f'  - key: "{k}-secret"\n    groups: [inference]\n' for k in KEYS) + f"""\
  - key: "tpm-secret"
    groups: [inference]
    tokens_per_minute: {TPM}
"""
FLAGS = ("--batch-max-file-mb", "10", "--batch-max-storage-mb-per-key", "12",
         "--batch-max-files-per-key", "4", "--batch-max-jobs-per-key", "3",
         "--batch-max-live-jobs-per-key", "3", "--batch-max-live-jobs", "4")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("batch_access")
    build_repository(folder / "repo")
    (folder / "keys.yaml").write_text(KEYS_FILE)
    (folder / "keys.yaml").chmod(0o600)  # private, or the server refuses it (api_keys.file_mode_problem)
    return folder


def serve(folder: Path, jobs: str, log: str, *flags: str) -> RunningServer:
    return start_server(folder / "repo", folder / log, "--api-keys", str(folder / "keys.yaml"),
                        "--batch-dir", str(folder / jobs), *flags)


@pytest.fixture(scope="module")
def server(folder: Path):
    running = serve(folder, "jobs", "server.log", *FLAGS)
    yield running
    running.stop()


def client(server: RunningServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key=f"{key}-secret", max_retries=0,
                         timeout=60.0)


def line(custom_id: str, max_tokens: int = 1, prompt: str = "abcd", **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
            "body": {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, **body}}


def jsonl(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


def upload(c: openai.OpenAI, data: bytes, name: str = "in.jsonl"):
    return c.files.create(file=(name, io.BytesIO(data)), purpose="batch")


def create(c: openai.OpenAI, file_id: str):
    return c.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h")


def long_job_file(c: openai.OpenAI):
    """A file whose job stays in progress until cancelled (20 requests of 400 tokens each)."""
    return upload(c, jsonl([line(f"l{i}", 400, ignore_eos=True) for i in range(20)]), "long.jsonl")


def wait_status(c: openai.OpenAI, batch_id: str, *statuses: str, timeout_s: float = 60.0):
    return wait_until(lambda: (b := c.batches.retrieve(batch_id)).status in statuses and b,
                      f"batch {batch_id} {'/'.join(statuses)}", timeout_s)


def assert_both_protocols(server: RunningServer, key: str) -> None:
    """A correct inference of `simple` over HTTP and over gRPC, with `key`."""
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    for module, url in ((httpclient, server.http_url), (grpcclient, server.grpc_url)):
        inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(x)
        headers = {"authorization": f"Bearer {key}-secret"}  # a dict each: the HTTP client adds to it
        with module.InferenceServerClient(url) as c:
            assert c.infer("simple", inputs, headers=headers).as_numpy("OUTPUT0").tolist() == (x + x).tolist()


def test_each_key_sees_only_its_own_files_and_jobs_even_after_a_restart(folder: Path):
    srv = serve(folder, "owned", "owned.log")
    try:
        alice, bob = client(srv, "alice"), client(srv, "bob")
        mine = upload(alice, jsonl([line(f"r{i}", 4, prompt=f"alice's secret {i}") for i in range(3)]))
        done = wait_status(alice, create(alice, mine.id).id, "completed")
        live = create(alice, long_job_file(alice).id)
        theirs = upload(bob, jsonl([line("b", 2)]))
        assert [f.id for f in bob.files.list()] == [theirs.id] and list(bob.batches.list()) == []

        def refused(call) -> openai.NotFoundError:
            with pytest.raises(openai.NotFoundError) as err:
                call()
            return err.value

        for file_id in (mine.id, done.output_file_id):
            assert "No such File object" in refused(lambda f=file_id: bob.files.retrieve(f)).message
            refused(lambda f=file_id: bob.files.content(f))
            refused(lambda f=file_id: bob.files.delete(f))
        assert refused(lambda: create(bob, mine.id)).param == "input_file_id"
        for batch_id in (done.id, live.id):
            assert "No such Batch object" in refused(lambda b=batch_id: bob.batches.retrieve(b)).message
            refused(lambda b=batch_id: bob.batches.cancel(b))
        assert alice.batches.retrieve(live.id).status in ("validating", "in_progress")  # not cancelled by bob
        assert alice.files.content(mine.id).content.startswith(b'{"custom_id": "r0"')
        alice.batches.cancel(live.id)
        wait_status(alice, live.id, "cancelled")
        assert_both_protocols(srv, "bob")
    finally:
        srv.stop()
    srv = serve(folder, "owned", "owned_again.log")  # the owners are kept with the files and jobs
    try:
        alice, bob = client(srv, "alice"), client(srv, "bob")
        assert {b.id for b in alice.batches.list()} == {done.id, live.id} and list(bob.batches.list()) == []
        assert [f.id for f in bob.files.list()] == [theirs.id]
        with pytest.raises(openai.NotFoundError):
            bob.files.content(done.output_file_id)
        assert alice.files.retrieve(done.output_file_id).purpose == "batch_output"
        assert_both_protocols(srv, "alice")
    finally:
        srv.stop()


def test_jobs_in_progress_are_capped_per_key_and_server_wide(server: RunningServer):
    caps, caps2 = client(server, "caps"), client(server, "caps2")
    file_id = long_job_file(caps).id
    jobs = [create(caps, file_id) for _ in range(3)]  # --batch-max-live-jobs-per-key 3
    with pytest.raises(openai.RateLimitError) as err:
        create(caps, file_id)
    assert err.value.code == "rate_limit_exceeded" and "--batch-max-live-jobs-per-key 3" in err.value.message
    assert int(err.value.response.headers["retry-after"]) >= 1
    other = long_job_file(caps2).id
    jobs2 = [create(caps2, other)]  # the server's 4th (--batch-max-live-jobs 4)
    with pytest.raises(openai.RateLimitError) as err:
        create(caps2, other)
    assert "--batch-max-live-jobs 4" in err.value.message
    assert_both_protocols(server, "caps")
    for c, job in [(caps, j) for j in jobs] + [(caps2, j) for j in jobs2]:
        c.batches.cancel(job.id)
    for c, job in [(caps, j) for j in jobs] + [(caps2, j) for j in jobs2]:
        wait_status(c, job.id, "cancelled")
    again = create(caps, file_id)  # an ended job frees its place
    caps.batches.cancel(again.id)
    wait_status(caps, again.id, "cancelled")


def test_files_are_bounded_per_key_in_bytes_and_count_until_deleted(server: RunningServer):
    quota = client(server, "quota")
    row = json.dumps(line("a", prompt="x" * 1000)).encode() + b"\n"
    six = upload(quota, row * ((6 << 20) // len(row)))  # ~6 MiB of the key's 12
    with pytest.raises(openai.BadRequestError) as err:
        upload(quota, row * ((7 << 20) // len(row)))
    assert err.value.code == "quota_exceeded" and "--batch-max-storage-mb-per-key" in err.value.message
    small = [upload(quota, jsonl([line("a")])) for _ in range(3)]  # 4 files: --batch-max-files-per-key 4
    with pytest.raises(openai.BadRequestError) as err:
        upload(quota, jsonl([line("a")]))
    assert err.value.code == "quota_exceeded" and "--batch-max-files-per-key 4" in err.value.message
    deleted = quota.files.delete(six.id)
    assert deleted.deleted and deleted.id == six.id
    with pytest.raises(openai.NotFoundError):
        quota.files.retrieve(six.id)
    assert upload(quota, row * ((7 << 20) // len(row))).bytes > 6 << 20
    for f in small:
        quota.files.delete(f.id)
    assert_both_protocols(server, "quota")


def raw_upload(server: RunningServer, body: bytes, boundary: str = "b") -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    conn.request("POST", "/v1/files", body, {"Authorization": "Bearer quota-secret",
                                             "Content-Type": f"multipart/form-data; boundary={boundary}"})
    answer = conn.getresponse()
    return answer.status, json.loads(answer.read())


def test_a_form_of_many_parts_is_refused_and_the_server_keeps_serving(server: RunningServer):
    status, doc = raw_upload(server, b"--b\r\nContent-Disposition: form-data; name=x\r\n\r\n\r\n" * 200_000
                             + b"--b--\r\n")
    assert status == 400 and "more than 16 parts" in doc["error"]["message"]
    status, doc = raw_upload(server, b"--b\r\n" + b"X-Pad: y\r\n" * 5000 + b"\r\n\r\n--b--\r\n")
    assert status == 400 and "headers" in doc["error"]["message"]
    assert_both_protocols(server, "quota")


def test_a_keys_job_history_keeps_its_newest_jobs(server: RunningServer):
    history = client(server, "history")
    file_id = upload(history, jsonl([line("a")])).id
    jobs = [wait_status(history, create(history, file_id).id, "completed") for _ in range(4)]
    with pytest.raises(openai.NotFoundError):  # --batch-max-jobs-per-key 3: the oldest was forgotten
        history.batches.retrieve(jobs[0].id)
    assert [b.id for b in history.batches.list()] == [j.id for j in reversed(jobs[1:])]
    assert history.files.retrieve(jobs[0].output_file_id).purpose == "batch_output"  # its output stays


def test_listings_are_paginated_newest_first(server: RunningServer):
    lister = client(server, "lister")
    file_id = upload(lister, jsonl([line("a")])).id
    jobs = [wait_status(lister, create(lister, file_id).id, "completed") for _ in range(3)]
    first = lister.batches.list(limit=2)
    assert [b.id for b in first.data] == [jobs[2].id, jobs[1].id] and first.has_more
    assert [b.id for b in lister.batches.list(limit=2, after=jobs[1].id).data] == [jobs[0].id]
    assert [b.id for b in lister.batches.list(limit=2)] == [j.id for j in reversed(jobs)]  # every page
    outputs = [j.output_file_id for j in jobs]
    assert [f.id for f in lister.files.list(limit=1)] == list(reversed(outputs)) + [file_id]
    assert [f.id for f in lister.files.list(limit=3, order="asc")] == [file_id] + outputs
    assert [f.id for f in lister.files.list(purpose="batch")] == [file_id]
    page = lister.files.list(limit=2, order="asc", after=outputs[0])
    assert [f.id for f in page.data] == outputs[1:] and not page.has_more


def test_a_jobs_tokens_are_charged_to_its_key_at_the_rate_the_minute_refills(server: RunningServer):
    """24 requests of 105 tokens (5 of prompt, 100 generated: 2,520) on a key of 2,100 a minute: the job
    leaves a quarter of the minute to the key's own requests, so 15 run at once and each next one when 105
    tokens more have come back (~3 s). Sampled while it runs, what it used never passes what the key had."""
    tpm = client(server, "tpm")
    rate = TPM / 60
    file_id = upload(tpm, jsonl([line(f"t{i}", 100, ignore_eos=True) for i in range(24)])).id
    start = time.monotonic()
    job = create(tpm, file_id)
    deadline = start + 30
    while True:
        now = time.monotonic()
        counts = tpm.batches.retrieve(job.id).request_counts
        assert counts.completed * 105 <= TPM + rate * (time.monotonic() - start) + 105, counts
        assert counts.failed == 0  # a request over the budget waits, it does not fail
        if counts.completed >= 16:  # one past what the minute held at once: it waited for the refill
            break
        assert now < deadline, f"the job stalled at {counts.completed} requests"
        time.sleep(0.1)
    tpm.batches.cancel(job.id)
    wait_status(tpm, job.id, "cancelled")
    small = tpm.completions.create(model=MODEL, prompt="abcd", max_tokens=100,  # the quarter left to the key
                                   extra_body={"ignore_eos": True})
    assert small.usage.completion_tokens == 100
    assert_both_protocols(server, "alice")


def memory(server: RunningServer) -> tuple[int, int]:
    """(VmRSS, VmHWM) of the server's processes together, in bytes."""
    pids = [server.process.pid]
    try:
        with open(f"/proc/{pids[0]}/task/{pids[0]}/children") as f:
            pids += [int(p) for p in f.read().split()]
    except FileNotFoundError:
        pass
    rss = hwm = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            for text in f:
                if text.startswith(("VmRSS:", "VmHWM:")):
                    value = int(text.split()[1]) * 1024
                    rss, hwm = (rss + value, hwm) if text.startswith("VmRSS") else (rss, hwm + value)
    return rss, hwm


def test_a_multi_mb_input_with_several_jobs_stays_within_a_memory_bound(server: RunningServer):
    """An 8 MiB input (~25,000 chat requests) and three jobs on it. Parsed and kept per job it cost ~24× its
    size each (~190 MB for three); read a line at a time it costs the upload's body (once in one process;
    with --workers 2 the forwarded body is copied through the engine's channel, ~3× for a moment) and each
    job's open file and read-ahead. Bound: 4× the file + 48 MiB of peak growth; after the jobs end, RSS
    back within 2× the file + 32 MiB of where it started."""
    mem = client(server, "mem")
    mem.completions.create(model=MODEL, prompt="warm", max_tokens=2)
    requests = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                 "body": {"model": MODEL, "prompt": f"a fairly ordinary prompt number {i}", "max_tokens": 1,
                          "temperature": 0, "stop": ["x", "y"], "top_p": 0.9, "presence_penalty": 0.0}}
                for i in range(40_000)]
    data = jsonl(requests)
    data = data[:data.rfind(b"\n", 0, 8 << 20) + 1]
    size = len(data)
    rss_before, hwm_before = memory(server)
    file_id = upload(mem, data, "big.jsonl").id
    jobs = [create(mem, file_id) for _ in range(3)]
    for job in jobs:
        wait_until(lambda j=job: mem.batches.retrieve(j.id).request_counts.completed > 0,
                   "every job validated and running")
    rss_running, hwm_running = memory(server)
    assert hwm_running - hwm_before <= 4 * size + (48 << 20), (hwm_before, hwm_running, size)
    for job in jobs:
        with contextlib.suppress(openai.ConflictError):  # one that has finished already
            mem.batches.cancel(job.id)
    for job in jobs:
        wait_status(mem, job.id, "cancelled", "completed")
    rss_after, _ = memory(server)
    assert rss_after - rss_before <= 2 * size + (32 << 20), (rss_before, rss_running, rss_after)
    assert_both_protocols(server, "mem")


def test_slow_downloads_of_a_multi_mb_file_are_exact_and_stay_within_a_memory_bound(server: RunningServer):
    """Four clients download a 9 MiB file at once, each reading 64 KiB every 10 ms, and a fifth leaves after
    its first chunk. Read whole per answer, each download held the file in the server (and once more per
    copy across the channel with --workers 2): 4 × 9 MiB and more. Streamed, each holds a chunk and its
    window: peak RSS growth stays under one and a half copies of the file (one copy was exceeded by 2 MiB
    once, --workers 2 on a machine at load 10: the allocator's slack), RSS is back within 8 MiB afterwards,
    the bytes are exact, and /v2/health/live answers within a second meanwhile."""
    dl = client(server, "dl")
    row = json.dumps(line("a", prompt="y" * 1500)).encode() + b"\n"
    data = row * ((9 << 20) // len(row))
    file_id = upload(dl, data).id
    want = hashlib.sha256(data).hexdigest()
    assert dl.files.content(file_id).content == data  # a warm-up, and the openai package's own reading
    rss_before = memory(server)[0]
    peak, worst, digests = [rss_before], [0.0], []
    done = threading.Event()

    def download(leave_early: bool) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
        conn.request("GET", f"/v1/files/{file_id}/content", headers={"Authorization": "Bearer dl-secret"})
        answer = conn.getresponse()
        assert answer.status == 200 and answer.getheader("content-type") == "application/octet-stream"
        digest = hashlib.sha256()
        while chunk := answer.read(65536):
            if leave_early:
                break
            digest.update(chunk)
            time.sleep(0.01)  # a slow reader
        conn.close()
        if not leave_early:
            digests.append(digest.hexdigest())

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], memory(server)[0])
            start = time.monotonic()
            with urllib.request.urlopen(f"http://{server.http_url}/v2/health/live", timeout=30) as r:
                assert r.status == 200
            worst[0] = max(worst[0], time.monotonic() - start)
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    clients = [threading.Thread(target=download, args=(i == 4,)) for i in range(5)]
    for t in clients:
        t.start()
    for t in clients:
        t.join()
    done.set()
    watcher.join()
    assert digests == [want] * 4
    assert peak[0] - rss_before <= len(data) * 3 // 2, (rss_before, peak[0], len(data))
    assert worst[0] < 1.0, worst[0]
    wait_until(lambda: memory(server)[0] - rss_before <= 8 << 20, "RSS back within 8 MiB", 10)
    with pytest.raises(openai.NotFoundError):
        client(server, "bob").files.content(file_id)
    dl.files.delete(file_id)
    assert_both_protocols(server, "dl")
