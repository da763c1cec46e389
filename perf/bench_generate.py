"""The generation engine in process: continuous vs static batching, against the model's own ceiling.

Closed loop at each concurrency c: c clients, each sending its next request when its last one finished, over
the same workload (prompts of 8–96 bytes, outputs of 16–128 tokens, greedy, EOS ignored) for every mode:

- continuous: the engine as built; a request joins the running batch at the next step;
- static: static batching of whole requests, as the issue means it: a batch of c is admitted together and
  runs until every member is done, and only then is the next batch admitted; like a dense batch, every row
  keeps computing until the batch's longest request ends (its extra tokens are computed and not counted).
  Same engine, model and KV cache; only admission and the rows' length differ;
- static-leave: the same batches, but a finished member stops computing at once (what this benchmark
  called static before: no joins, but no compute on finished rows either; kept to show the difference);
- ceiling: the ONNX model alone, stepped in a loop with dense past tensors already in place, at the decode
  batch size and context length the continuous run formed on average (no gather, no scatter, no
  scheduling, no sampling).

TTFT is from a client sending a request to its first token. The runner's breakdown (blocks → dense past,
ONNX Runtime, present → blocks) is per engine step of the continuous run. No sockets: the HTTP API is not
part of this. Wrap it in `flock /work/probes/bench.lock` on a shared machine.

    PYTHONPATH=. .venv/bin/python perf/bench_generate.py [--concurrency 1,4,16,32] [--requests-per-client 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from engine import examples
from engine.generate.engine import CacheConfig, GenerationEngine
from engine.generate.request import SamplingParams
from engine.generate.runner import DecoderRunner
from engine.generate.scheduler import SchedulerConfig
from engine.generate.tiny_decoder import tiny_decoder_model
from engine.generate.tokenizer import ByteTokenizer

MODEL = examples.model_bytes(tiny_decoder_model())


def options() -> ort.SessionOptions:
    opts = ort.SessionOptions()  # as engine/backends/onnxruntime.py: one intra-op thread, no spinning
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    opts.log_severity_level = 3
    return opts


def workload(count: int, seed: int) -> list[tuple[list[int], int]]:
    rng = np.random.default_rng(seed)
    jobs = []
    for _ in range(count):
        prompt = [256, *rng.integers(32, 127, size=int(rng.integers(8, 97))).tolist()]
        jobs.append((prompt, int(rng.integers(16, 129))))
    return jobs


def make_engine() -> GenerationEngine:
    """The example's settings (model_repository/tiny_decoder/config.pbtxt), warmed up: ONNX Runtime's first
    runs at new shapes are slow, and would land in the first TTFTs."""
    cache = CacheConfig(block_size=16, num_blocks=1024, max_model_len=512)
    runner = DecoderRunner(MODEL, cache.num_blocks, cache.block_size, options())
    engine = GenerationEngine(runner, ByteTokenizer(), cache, SchedulerConfig(max_num_seqs=32,
                                                                              max_num_batched_tokens=256))
    for i, (prompt, max_tokens) in enumerate(workload(8, seed=12345)):
        engine.add_request(f"warm{i}", prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    engine.run_to_completion()
    runner.stats.reset()
    return engine


@dataclass
class Run:
    tokens: int = 0
    seconds: float = 0.0
    ttft: list[float] = field(default_factory=list)
    step_cpu_ns: int = 0    # the engine thread's CPU time in step() (ONNX Runtime runs on it: one intra-op
    step_wall_ns: int = 0   # thread), robust to other processes' load where wall time is not
    steps: int = 0
    decode_batch: list[int] = field(default_factory=list)  # decode rows per step
    context: list[int] = field(default_factory=list)       # the longest context of each step's decode group

    def tps(self) -> float:
        return self.tokens / self.seconds

    def ttft_ms(self, q: float) -> float:
        return float(np.percentile(self.ttft, q)) * 1e3


def run(engine: GenerationEngine, jobs: list[tuple[list[int], int]], clients: int, mode: str) -> Run:
    """Closed loop with `clients` requests in flight. mode "continuous": a client's next request joins as
    soon as its last one finished. "static": whole-request batches: the next batch is admitted only when
    every member of the last one finished, and every member runs to the batch's longest max_tokens (the
    rows a dense static batch keeps computing after their end; those tokens are computed, not counted).
    "static-leave": the same batches, but a finished member leaves (stops computing) at once."""
    out = Run()
    queue = list(enumerate(jobs))
    sent: dict[str, float] = {}
    wanted: dict[str, int] = {}
    client_free_at = [time.perf_counter()] * clients  # when each client sent (could send) its next request
    started = time.perf_counter()

    def submit(client: int, run_to: int = 0) -> None:
        index, (prompt, max_tokens) = queue.pop(0)
        rid = f"{client}:{index}"
        sent[rid], wanted[rid] = client_free_at[client], max_tokens
        engine.add_request(rid, prompt, SamplingParams(max_tokens=max(max_tokens, run_to), ignore_eos=True))

    def admit_batch() -> None:
        batch = queue[:clients]
        longest = max(m for _, (_, m) in batch) if mode == "static" else 0
        for client in range(len(batch)):
            submit(client, longest)

    admit_batch()
    while engine.has_unfinished():
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        stepped = engine.step()
        out.step_cpu_ns += time.thread_time_ns() - cpu
        out.step_wall_ns += time.perf_counter_ns() - wall
        out.steps += 1
        now = time.perf_counter()
        decodes = [o for o in stepped if o.new_token_ids and len(o.output_token_ids) > 1]
        if decodes:
            out.decode_batch.append(len(decodes))
        for o in stepped:
            if o.new_token_ids and len(o.output_token_ids) <= wanted[o.request_id]:
                out.tokens += len(o.new_token_ids)
            if o.new_token_ids and len(o.output_token_ids) == 1:
                out.ttft.append(now - sent[o.request_id])
            if o.new_token_ids and len(o.output_token_ids) == wanted[o.request_id]:
                client_free_at[int(o.request_id.split(":")[0])] = now  # its answer is complete
            if o.finished:
                client = int(o.request_id.split(":")[0])
                if queue and mode == "continuous":
                    submit(client)
        if mode != "continuous" and queue and not engine.has_unfinished():
            admit_batch()
    out.seconds = time.perf_counter() - started
    return out


def ceiling(batch: int, context: int, steps: int = 200) -> float:
    """Tokens/s of the bare model decoding `batch` rows over `context` past tokens, inputs prebuilt."""
    sess = ort.InferenceSession(MODEL, options(), providers=["CPUExecutionProvider"])
    past = {f"past_key_values.{i}.{p}": np.zeros((batch, 4, context, 16), np.float32)
            for i in range(2) for p in ("key", "value")}
    feed = {"input_ids": np.zeros((batch, 1), np.int64),
            "attention_mask": np.ones((batch, context + 1), np.int64),
            "position_ids": np.full((batch, 1), context, np.int64), **past}
    for _ in range(10):
        sess.run(None, feed)
    t0 = time.perf_counter()
    for _ in range(steps):
        sess.run(None, feed)
    return batch * steps / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4,16,32")
    parser.add_argument("--requests-per-client", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print("| c | continuous tok/s | static tok/s | cont./static | static-leave tok/s | TTFT p50/p95 ms cont. "
          "| TTFT p50/p95 ms static | mean decode batch | mean context | ceiling tok/s | cont./ceiling |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    breakdown = []
    cpu_rows = []
    for c in (int(x) for x in args.concurrency.split(",")):
        jobs = workload(c * args.requests_per_client, args.seed + c)
        engine = make_engine()
        cont = run(engine, jobs, c, "continuous")
        stats = engine.runner.stats
        breakdown.append(dataclasses.replace(stats))
        cpu_rows.append((c, cont))
        stat = run(make_engine(), jobs, c, "static")
        leave = run(make_engine(), jobs, c, "static-leave")
        batch = max(1, round(float(np.mean(cont.decode_batch))))
        context = int(np.mean([len(p) + m / 2 for p, m in jobs]))
        top = ceiling(batch, context)
        print(f"| {c} | {cont.tps():.0f} | {stat.tps():.0f} | {cont.tps() / stat.tps():.2f} | "
              f"{leave.tps():.0f} | "
              f"{cont.ttft_ms(50):.1f} / {cont.ttft_ms(95):.1f} | "
              f"{stat.ttft_ms(50):.1f} / {stat.ttft_ms(95):.1f} | {np.mean(cont.decode_batch):.1f} | "
              f"{context} | {top:.0f} | {cont.tps() / top:.0%} |", flush=True)
    print()
    print("| c | steps | runs/step | blocks → dense past µs/step | ONNX Runtime µs/step (decode) | "
          "present → blocks µs/step | padding in past | decode rows gathered | free rows run | rebuilds |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c, s in zip((int(x) for x in args.concurrency.split(",")), breakdown, strict=True):
        steps = s.steps
        print(f"| {c} | {steps} | {s.runs / steps:.2f} | {s.gather_ns / steps / 1e3:.0f} | "
              f"{s.run_ns / steps / 1e3:.0f} ({s.decode_run_ns / steps / 1e3:.0f}) | "
              f"{s.scatter_ns / steps / 1e3:.0f} | {s.padded_slots / max(s.past_slots, 1):.0%} | "
              f"{s.gathered_rows / max(s.decode_rows, 1):.0%} | {s.free_rows / max(s.decode_rows, 1):.0%} | "
              f"{s.rebuilds} |")

    print()
    print("| c | step CPU µs (continuous) | step wall µs | of which ONNX Runtime wall µs | "
          "CPU µs per token |")
    print("|---|---|---|---|---|")
    for (c, cont), s in zip(cpu_rows, breakdown, strict=True):
        print(f"| {c} | {cont.step_cpu_ns / cont.steps / 1e3:.0f} | "
              f"{cont.step_wall_ns / cont.steps / 1e3:.0f} | {s.run_ns / s.steps / 1e3:.0f} | "
              f"{cont.step_cpu_ns / cont.tokens / 1e3:.1f} |")


if __name__ == "__main__":
    main()
