"""Interactive TTFT while an offline batch job runs (issue 17 item 4), against a real server on loopback.

One server (`--batch-dir` in a temporary folder) serving the tiny_decoder example. Three phases, each the
same interactive load: `--streams` chat streams sent one after another by each of `--clients` clients
(max_tokens 16, greedy, raw HTTP/1.1 SSE), TTFT = from sending the request to the first content chunk:

- idle: nothing else runs;
- batch job: a Batch API job of `--job-requests` long completions (max_tokens 200, EOS ignored) is
  in_progress the whole phase, at the scheduler's BATCH priority with `--in-flight` requests in the engine
  at once (`--batch-requests-in-flight`; the default 40 is more than the model's 32 seats);
- same load, interactive: the job's requests sent instead as `--in-flight` concurrent interactive
  completions (what the job would cost interactive users without the priority).

Each phase checks the background was still busy at its end. Wrap it in `flock /work/probes/bench.lock`.

    flock /work/probes/bench.lock .venv/bin/python perf/bench_batch_ttft.py [--clients 2] [--streams 20]
        [--job-requests 400]
"""

from __future__ import annotations

import argparse
import http.client
import json
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from hubserve_harness import ROOT, start_server
from hubserve_models import examples

MODEL = "tiny_decoder"


def build(root: Path) -> Path:
    import shutil
    for name in (MODEL,):
        (root / name).mkdir(parents=True)
        shutil.copy(ROOT / "model_repository" / name / "config.pbtxt", root / name / "config.pbtxt")
    examples.build_repository(root, [MODEL])
    return root


def ttft_stream(port: int, i: int) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": f"question {i}"}],
                       "max_tokens": 16, "temperature": 0.0, "stream": True})
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    answer = conn.getresponse()
    first = None
    for raw in answer:
        if raw.startswith(b"data: {") and b'"content"' in raw and first is None:
            first = time.perf_counter() - start
        if raw.startswith(b"data: [DONE]"):
            break
    conn.close()
    assert first is not None, "no content chunk"
    return first


def interactive_load(port: int, clients: int, streams: int) -> list[float]:
    out: list[float] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        for s in range(streams):
            t = ttft_stream(port, c * 1000 + s)
            with lock:
                out.append(t)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def post_json(port: int, path: str, doc: dict | None = None, method: str = "POST") -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request(method, path, None if doc is None else json.dumps(doc), {"Content-Type": "application/json"})
    return json.loads(conn.getresponse().read())


def start_job(port: int, requests: int) -> str:
    lines = b"".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions", "body": {
        "model": MODEL, "prompt": f"document {i}: summarise", "max_tokens": 200, "temperature": 0.0,
        "ignore_eos": True}}).encode() + b"\n" for i in range(requests))
    boundary = "benchboundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n"
            "Content-Type: application/jsonl\r\n\r\n").encode() + lines + f"\r\n--{boundary}--\r\n".encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/files", body, {"Content-Type": f"multipart/form-data; boundary={boundary}"})
    file_id = json.loads(conn.getresponse().read())["id"]
    batch = post_json(port, "/v1/batches", {"input_file_id": file_id, "endpoint": "/v1/completions",
                                            "completion_window": "24h"})
    deadline = time.monotonic() + 60
    while post_json(port, f"/v1/batches/{batch['id']}", method="GET")["status"] != "in_progress":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return str(batch["id"])


def background_interactive(port: int, stop: threading.Event, in_flight: int) -> list[threading.Thread]:
    def worker(w: int) -> None:
        n = 0
        while not stop.is_set() and n < 10_000:
            post_json(port, "/v1/completions", {"model": MODEL, "prompt": f"document {w}-{n}: summarise",
                                                "max_tokens": 200, "temperature": 0.0, "ignore_eos": True})
            n += 1

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(in_flight)]
    for t in threads:
        t.start()
    return threads


def row(name: str, ttfts: list[float]) -> str:
    a = np.array(ttfts) * 1000
    return f"| {name} | {len(a)} | {np.percentile(a, 50):.1f} | {np.percentile(a, 95):.1f} | {a.max():.1f} |"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--job-requests", type=int, default=400)
    parser.add_argument("--in-flight", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = build(Path(tmp) / "repo")
        server = start_server(repo, Path(tmp) / "server.log", "--batch-dir", str(Path(tmp) / "jobs"),
                              "--workers", "1", "--batch-requests-in-flight", str(args.in_flight))
        try:
            port = server.http_port
            interactive_load(port, 1, 3)  # warm-up: the engine is built on first use
            rows = [row("idle", interactive_load(port, args.clients, args.streams))]
            batch_id = start_job(port, args.job_requests)
            during = interactive_load(port, args.clients, args.streams)
            job = post_json(port, f"/v1/batches/{batch_id}", method="GET")
            assert job["status"] == "in_progress", f"the job ended during the phase: {job['status']}"
            rows.append(row(f"batch job running, {args.in_flight} in flight ("
                            f"{job['request_counts']['completed']} of {args.job_requests} done by its end)",
                            during))
            post_json(port, f"/v1/batches/{batch_id}/cancel")
            stop = threading.Event()
            threads = background_interactive(port, stop, args.in_flight)
            time.sleep(1.0)  # let the background requests start
            same = interactive_load(port, args.clients, args.streams)
            stop.set()
            rows.append(row(f"the same {args.in_flight} sent as interactive requests", same))
            for t in threads:
                t.join(timeout=120)
        finally:
            server.stop()
    print("| phase | streams | TTFT p50 ms | TTFT p95 ms | max ms |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
