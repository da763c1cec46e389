"""`hubserve perf generate`: load an OpenAI-compatible server's streamed completions (as genai-perf does).

Per point of a sweep (a concurrency, or a request rate), `--request-count` streamed requests with synthetic
prompts (seeded: the same prompts for every point and every run) and `max_tokens`; per request the client
stamps the request leaving, the first token and the last (sse_client.py). Reported per point:

    TTFT              request sent → first event with text
    inter-token       (end-to-end − TTFT) / (output tokens − 1), per request (genai-perf's definition)
    end-to-end        request sent → `data: [DONE]`
    output tokens/s   output tokens of all requests / (last request done − first request sent)
    requests/s        requests / the same span

Closed loop: N coroutines, each on its own keep-alive connection, each sending its next request when its last
one ended. Open loop: requests leave at `rate` per second, constant or Poisson spacing, each on an idle
connection (a new one when none is idle), whatever the server does. Everything is bounded: a point ends
after its requests or `--max-duration-s`, whichever is first.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from .sse_client import StreamConnection, StreamRecord
from .types import ExitCode, PerfError

PERCENTILES = (50, 90, 95, 99)
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
WORDS = ("the", "model", "serves", "tokens", "while", "every", "request", "streams", "its", "answer", "back",
         "through", "a", "batch", "that", "grows", "and", "shrinks", "at", "each", "step")


@dataclass(frozen=True, slots=True)
class GenOptions:
    host: str
    port: int
    model: str
    endpoint: str                # "chat" or "completions"
    prompt_tokens: int           # characters of synthetic text (one token each with a byte-level tokenizer)
    prompt_tokens_stddev: float
    max_tokens: int
    temperature: float | None    # None: the server's default (OpenAI's is 1)
    ignore_eos: bool
    request_count: int           # per point
    warmup_request_count: int    # per point, sent first, not measured
    max_duration_s: float        # per point
    seed: int


@dataclass(frozen=True, slots=True)
class GenPoint:
    concurrency: int = 0         # closed loop when > 0
    request_rate: float = 0.0    # open loop (requests/s) when > 0
    poisson: bool = False

    def describe(self) -> str:
        if self.concurrency:
            return f"concurrency {self.concurrency}"
        return f"request rate {self.request_rate:g}/s ({'poisson' if self.poisson else 'constant'})"


def prompts(options: GenOptions, count: int) -> list[str]:
    """`count` synthetic prompts of words, lengths drawn from normal(prompt_tokens, stddev) (at least 1),
    from a generator seeded with `seed`."""
    rng = np.random.default_rng(options.seed)
    out = []
    for _ in range(count):
        length = max(1, round(rng.normal(options.prompt_tokens, options.prompt_tokens_stddev)))
        words: list[str] = []
        size = 0
        while size <= length:
            word = WORDS[int(rng.integers(len(WORDS)))]
            words.append(word)
            size += len(word) + 1
        out.append(" ".join(words)[:length])
    return out


def request_body(options: GenOptions, prompt: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": options.model, "max_tokens": options.max_tokens, "stream": True,
                            "stream_options": {"include_usage": True}}
    if options.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if options.ignore_eos:
        body["ignore_eos"] = True
    if options.temperature is not None:
        body["temperature"] = options.temperature
    return body


class PointRun:
    """One point's load on the caller's event loop: its connections, its records, its bound."""

    def __init__(self, options: GenOptions, point: GenPoint) -> None:
        self.options, self.point = options, point
        total = options.warmup_request_count + options.request_count
        self._bodies = [request_body(options, p) for p in prompts(options, total)]
        self._next = 0
        self.records: list[StreamRecord] = []
        self._idle: list[StreamConnection] = []
        self._all: list[StreamConnection] = []
        self._deadline = 0.0

    def _take(self) -> tuple[int, dict[str, Any]] | None:
        if self._next >= len(self._bodies) or time.monotonic() > self._deadline:
            return None
        index = self._next
        self._next += 1
        return index, self._bodies[index]

    async def _connection(self) -> StreamConnection:
        if self._idle:
            return self._idle.pop()
        conn = await StreamConnection.open(self.options.host, self.options.port)
        self._all.append(conn)
        return conn

    async def _one(self, index: int, body: dict[str, Any]) -> None:
        conn = await self._connection()
        record = await conn.generate(PATHS[self.options.endpoint], body)
        self._idle.append(conn)
        if index >= self.options.warmup_request_count:
            self.records.append(record)

    async def run(self) -> list[StreamRecord]:
        self._deadline = time.monotonic() + self.options.max_duration_s
        try:
            if self.point.concurrency:
                await asyncio.gather(*(self._closed_loop() for _ in range(self.point.concurrency)))
            else:
                await self._open_loop()
        finally:
            await asyncio.gather(*(c.close() for c in self._all))
        return self.records

    async def _closed_loop(self) -> None:
        while (job := self._take()) is not None:
            await self._one(*job)

    async def _open_loop(self) -> None:
        rng = np.random.default_rng(self.options.seed + 1)
        tasks: set[asyncio.Task[None]] = set()
        start = time.perf_counter()
        due = 0.0
        try:
            while (job := self._take()) is not None:
                gap = 1.0 / self.point.request_rate
                due += float(rng.exponential(gap)) if self.point.poisson else gap
                delay = start + due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(self._one(*job))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                if any(t.done() and t.exception() for t in tasks):
                    break
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()


def _percentiles(values_ns: list[float]) -> dict[str, float]:
    if not values_ns:
        return {"avg": 0.0, **{f"p{p}": 0.0 for p in PERCENTILES}}
    arr = np.asarray(values_ns, np.float64) / 1e6
    return {"avg": float(arr.mean()), **{f"p{p}": float(np.percentile(arr, p)) for p in PERCENTILES}}


def summarize(point: GenPoint, records: list[StreamRecord]) -> dict[str, Any]:
    """One point's numbers: latencies in milliseconds, throughput over the point's span."""
    if not records:
        raise PerfError(f"no request completed at {point.describe()}; raise --max-duration-s")
    span_ns = max(r.done_ns for r in records) - min(r.sent_ns for r in records)
    itl = [(r.done_ns - r.first_ns) / (r.output_tokens - 1) for r in records
           if r.output_tokens > 1 and r.first_ns]
    output_tokens = sum(r.output_tokens for r in records)
    return {
        "concurrency": point.concurrency or None,
        "request_rate": point.request_rate or None,
        "distribution": None if point.concurrency else ("poisson" if point.poisson else "constant"),
        "requests": len(records),
        "seconds": span_ns / 1e9,
        "output_tokens_per_s": output_tokens / (span_ns / 1e9),
        "requests_per_s": len(records) / (span_ns / 1e9),
        "mean_prompt_tokens": float(np.mean([r.prompt_tokens for r in records])),
        "mean_output_tokens": output_tokens / len(records),
        "ttft_ms": _percentiles([r.first_ns - r.sent_ns for r in records if r.first_ns]),
        "inter_token_latency_ms": _percentiles(itl),
        "request_latency_ms": _percentiles([r.done_ns - r.sent_ns for r in records]),
    }


CSV_METRICS = (("TTFT", "ttft_ms"), ("Inter-Token Latency", "inter_token_latency_ms"),
               ("Request Latency", "request_latency_ms"))
CSV_STATS = ("avg", *(f"p{p}" for p in PERCENTILES))


def write_csv(path: Path, points: list[dict[str, Any]]) -> None:
    """`-f`: one row per point, in sweep order: its level, output tokens/s, requests/s, then each latency's
    average and percentiles in milliseconds."""
    level = "Concurrency" if points[0]["concurrency"] else "Request Rate"
    header = [level, "Output Tokens/s", "Requests/s",
              *(f"{name} {stat} ms" for name, _ in CSV_METRICS for stat in CSV_STATS)]
    rows = [[str(pt["concurrency"] or f"{pt['request_rate']:g}"), f"{pt['output_tokens_per_s']:.3f}",
             f"{pt['requests_per_s']:.3f}", *(f"{pt[key][stat]:.3f}" for _, key in CSV_METRICS
                                               for stat in CSV_STATS)] for pt in points]
    path.write_text("\n".join(",".join(row) for row in [header, *rows]) + "\n")


def print_table(points: list[dict[str, Any]], out: TextIO = sys.stdout) -> None:
    level = "Concurrency" if points[0]["concurrency"] else "Request rate"
    cols = [f"{m} p{p}" for m in ("TTFT", "ITL", "E2E") for p in PERCENTILES]
    print(f"{level:>12} | {'out tok/s':>10} | {'req/s':>8} | " + " | ".join(f"{c:>9}" for c in cols)
          + "   (latencies in ms)", file=out)
    for pt in points:
        value = pt["concurrency"] or f"{pt['request_rate']:g}"
        cells = [pt[k][f"p{p}"] for k in ("ttft_ms", "inter_token_latency_ms", "request_latency_ms")
                 for p in PERCENTILES]
        print(f"{value:>12} | {pt['output_tokens_per_s']:>10.1f} | {pt['requests_per_s']:>8.2f} | "
              + " | ".join(f"{c:>9.2f}" for c in cells), file=out)


async def run_generate(options: GenOptions, points: list[GenPoint], json_path: Path | None,
                       csv_path: Path | None = None, progress: TextIO = sys.stderr) -> int:
    results = []
    for point in points:
        print(f"*** {point.describe()}: {options.request_count} requests, prompt ~{options.prompt_tokens} "
              f"tokens, max_tokens {options.max_tokens}", file=progress, flush=True)
        records = await PointRun(options, point).run()
        results.append(summarize(point, records))
    print_table(results)
    if csv_path:
        write_csv(csv_path, results)
    if json_path:
        doc = {"tool": "hubserve perf generate", "options": asdict(options), "points": results}
        json_path.write_text(json.dumps(doc, indent=2) + "\n")
    return int(ExitCode.OK)
