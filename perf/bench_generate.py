"""The generation engine in process: continuous vs static batching, against the model's own ceiling.

Closed loop at each concurrency c: c clients, each sending its next request when its last one finished, over
the same workload (prompts of 8–96 bytes, greedy, EOS ignored; output lengths per `--lengths`) for every mode:

- continuous: the engine as built; a request joins the running batch at the next step;
- static: static batching of whole requests, as the issue means it: a batch of c is admitted together and
  runs until every member is done, and only then is the next batch admitted; like a dense batch, every row
  keeps computing until the batch's longest request ends (its extra tokens are computed and not counted).
  Same engine, model and KV cache; only admission and the rows' length differ;
- static-leave: the same batches, but a finished member stops computing at once (what this benchmark
  called static before: no joins, but no compute on finished rows either; kept to show the difference);
- ceiling: the ONNX model alone, stepped in a loop with dense past tensors already in place, at the decode
  batch size and context length the continuous run formed on average (no gather, no scatter, no
  scheduling, no sampling);
- runs replayed: the ONNX model alone over exactly the runs the continuous run made (the runner records
  each: its batch, width and each row's length), back to back, every input built before its run and only
  the runs timed. This is the ceiling "at the batch sizes formed": prefills included, each decode at the
  batch and context it had, so cont./replayed is the share of the model's own time in the engine's; for the
  dense form the replayed runs keep the padding the engine's grouping made, the first ceiling has none.
  The runs are replayed just before the continuous run and just after it, and the two times averaged: this
  machine's speed drifts by several percent from one second to the next (two replays of the same runs,
  back to back, differed by up to 8 %), and a ceiling measured only after the run carried that drift
  into cont./replayed. Every continuous run of the same jobs makes the same runs (`traced_run`), so the
  replay before a run is of the runs it is about to make.

**bound** = the static run's computed output tokens / its useful ones (Σ over the batches it formed of
batch size × longest member, over Σ lengths). A static batch runs as many steps as its longest member and
every step computes all its rows; continuous batching at best keeps c useful rows in every step. So when a
step's cost depends on its rows (not on which requests they are), continuous / static is at most about this
bound, whatever the model: a ratio near the bound means continuous batching wasted little else. It depends
only on the workload: E[max of c lengths] / E[length] in expectation.

Output lengths (`--lengths`, seeded by `--seed` + c, the same for every mode):
- `uniform` (the default, what every earlier table used): 16–128 tokens, uniform;
- `lognormal`: long-tailed, the shape of answer lengths in real chat traffic (ShareGPT-style traces: most
  answers short, a few many times longer); a lognormal rather than an exponential (whose likeliest length
  is zero) because such traces peak at a short, non-zero length and then tail off to the right. Median 64
  tokens, σ = 1, rounded, at least 4 and capped at 384 (prompt + output stays within the example's 512
  positions; ~4 % of draws hit the cap), mean ≈ 97. Its bound is ≈ 2.1 at c = 4, 3.3 at c = 16 and 3.7 at
  c = 32 (uniform: 1.5, 1.7, 1.7).

Model (`--model`), built at bench time in memory with perf/hubserve_models/tiny_decoder.py (random fixed
weights, nothing written to disk or downloaded):
- `tiny` (the default): the example `tiny_decoder`, 2 layers, hidden 64 (4 × 16 heads), 1 KiB of cache per
  token; one decode step is ~0.1–0.4 ms in ONNX Runtime, the same order as the engine's Python per step;
- `l4h256`: the same builder at 4 layers, hidden 256 (8 × 32 heads), FFN 1024, 8 KiB of cache per token:
  still tiny next to a real model, but a step costs milliseconds, as a real model's does.

KV layout (`--kv`): `dense` (the default; Optimum's form, `present` = past + new, the runner's decode group in
engine/generate/core/decode_group.py) or `shared` (the same weights with ONNX Runtime's GroupQueryAttention
over one buffer per KV tensor that the model writes in place, each row attending over its own length:
engine/generate/core/shared_group.py).

TTFT is from a client sending a request to its first token. The runner's breakdown (blocks → dense past,
ONNX Runtime, present → blocks) is per engine step of the continuous run; the last table splits a
continuous token's wall time into ONNX Runtime's decode and prefill runs, that mapping, the rest of `step()`
and this loop, beside the ceiling's time per token. No sockets: the HTTP API is not
part of this. Wrap it in `flock /work/probes/bench.lock` on a shared machine.

    PYTHONPATH=. .venv/bin/python perf/bench_generate.py [--concurrency 1,4,16,32] [--requests-per-client 3]
        [--lengths uniform|lognormal] [--model tiny|l4h256] [--kv dense|shared] [--steps 1] [--rounds 1]
        [--seed 0]

`--steps`: the engine's num_scheduler_steps (docs/generative.md "How the engine works", "Multi-step decode"),
in every mode.
`--rounds R`: R rounds per point (`Round`: replay, continuous, replay, static, continuous again), and the
round with the median cont./static is the one printed (every round's figures follow the tables): on a shared
machine the speed drifts by tens of percent within minutes, and a ratio of two runs minutes apart carries
that drift; alternating puts it on both sides, and the continuous runs either side of the static one (their
mean is the continuous tok/s of a round) cancel a steady drift over the round.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from engine.generate.core.engine import CacheConfig, GenerationEngine
from engine.generate.core.request import SamplingParams
from engine.generate.core.runner import DecoderRunner, RunnerStats, RunShape
from engine.generate.core.scheduler import SchedulerConfig
from engine.generate.core.tokenizer import ByteTokenizer
from hubserve_models import examples
from hubserve_models.tiny_decoder import TinyDecoderShape, tiny_decoder_model

MODELS = {"tiny": TinyDecoderShape(),
          "l4h256": TinyDecoderShape(layers=4, heads=8, head_dim=32, ffn=1024)}
LENGTHS = ("uniform", "lognormal")
LOGNORMAL_MEDIAN, LOGNORMAL_SIGMA, LOGNORMAL_MIN, LOGNORMAL_CAP = 64, 1.0, 4, 384


@dataclass(frozen=True)
class Model:
    name: str
    shape: TinyDecoderShape
    onnx: bytes  # the serialized model, built here, never written out


def build_model(name: str, kv: str = "dense") -> Model:
    shape = dataclasses.replace(MODELS[name], shared_kv=kv == "shared")
    return Model(name, shape, examples.model_bytes(tiny_decoder_model(shape)))


def options() -> ort.SessionOptions:
    opts = ort.SessionOptions()  # as engine/backends/onnxruntime.py: one intra-op thread, no spinning
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    opts.log_severity_level = 3
    return opts


def workload(count: int, seed: int, lengths: str = "uniform") -> list[tuple[list[int], int]]:
    """(prompt, output length) per request; `uniform` draws exactly what earlier versions of this
    benchmark drew for the same seed."""
    rng = np.random.default_rng(seed)
    jobs = []
    for _ in range(count):
        prompt = [256, *rng.integers(32, 127, size=int(rng.integers(8, 97))).tolist()]
        if lengths == "uniform":
            length = int(rng.integers(16, 129))
        else:
            draw = rng.lognormal(np.log(LOGNORMAL_MEDIAN), LOGNORMAL_SIGMA)
            length = int(np.clip(round(draw), LOGNORMAL_MIN, LOGNORMAL_CAP))
        jobs.append((prompt, length))
    return jobs


def make_engine(model: Model, steps: int = 1) -> GenerationEngine:
    """The example's settings (model_repository/tiny_decoder/config.pbtxt), warmed up: ONNX Runtime's first
    runs at new shapes are slow, and would land in the first TTFTs."""
    cache = CacheConfig(block_size=16, num_blocks=1024, max_model_len=512)
    runner = DecoderRunner(model.onnx, cache.num_blocks, cache.block_size, options(),
                           shared_kv=model.shape.shared_kv, max_len=cache.max_model_len, max_rows=32)
    engine = GenerationEngine(runner, ByteTokenizer(), cache, SchedulerConfig(
        max_num_seqs=32, max_num_batched_tokens=256, num_scheduler_steps=steps))
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
    computed: int = 0  # output tokens the static batches compute: Σ batch size × longest member ("static")
    useful: int = 0    # output tokens asked for: Σ lengths

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
    made: dict[str, int] = {}  # tokens each request has generated (an output lists them all only at its end)
    client_free_at = [time.perf_counter()] * clients  # when each client sent (could send) its next request
    started = time.perf_counter()

    def submit(client: int, run_to: int = 0) -> None:
        index, (prompt, max_tokens) = queue.pop(0)
        rid = f"{client}:{index}"
        sent[rid], wanted[rid] = client_free_at[client], max_tokens
        engine.add_request(rid, prompt, SamplingParams(max_tokens=max(max_tokens, run_to), ignore_eos=True))

    def admit_batch() -> None:
        batch = queue[:clients]
        longest = max(m for _, (_, m) in batch)
        out.computed += len(batch) * longest
        out.useful += sum(m for _, (_, m) in batch)
        if mode != "static":
            longest = 0
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
        decodes = [o for o in stepped if o.new_token_ids and made.get(o.request_id, 0)]
        if decodes:
            out.decode_batch.append(len(decodes))
        for o in stepped:
            new = len(o.new_token_ids)  # a multi-step decode gives several
            before = made.get(o.request_id, 0)
            have = made[o.request_id] = before + new
            if new:
                out.tokens += max(0, min(have, wanted[o.request_id]) - before)
                if before == 0:
                    out.ttft.append(now - sent[o.request_id])
                if before < wanted[o.request_id] <= have:
                    client_free_at[int(o.request_id.split(":")[0])] = now  # its answer is complete
            if o.finished:
                client = int(o.request_id.split(":")[0])
                if queue and mode == "continuous":
                    submit(client)
        if mode != "continuous" and queue and not engine.has_unfinished():
            admit_batch()
    out.seconds = time.perf_counter() - started
    return out


def ceiling(model: Model, batch: int, context: int, steps: int = 200) -> float:
    """Tokens/s of the bare model decoding `batch` rows over `context` past tokens, inputs prebuilt."""
    sess = ort.InferenceSession(model.onnx, options(), providers=["CPUExecutionProvider"])
    shape = model.shape
    width = 512 if shape.shared_kv else context  # a shared-KV model reads its buffer up to each row's length
    past = {f"past_key_values.{i}.{p}": np.zeros((batch, shape.heads, width, shape.head_dim), np.float32)
            for i in range(shape.layers) for p in ("key", "value")}
    feed = {"input_ids": np.zeros((batch, 1), np.int64),
            "attention_mask": np.ones((batch, context + 1), np.int64),
            "position_ids": np.full((batch, 1), context, np.int64)}
    binding = sess.io_binding()
    for name, value in feed.items():
        binding.bind_cpu_input(name, value)
    binding.bind_output("logits")
    for name, buffer in past.items():  # the shared form writes its past in place; the dense one returns it
        kept = ort.OrtValue.ortvalue_from_numpy(buffer)
        binding.bind_ortvalue_input(name, kept)
        present = name.replace("past_key_values", "present")
        if shape.shared_kv:
            binding.bind_ortvalue_output(present, kept)
        else:
            binding.bind_output(present)
    for _ in range(10):
        sess.run_with_iobinding(binding)
    t0 = time.perf_counter()
    for _ in range(steps):
        sess.run_with_iobinding(binding)
    return batch * steps / (time.perf_counter() - t0)


@dataclass
class Round:
    """One round of a point: replay, continuous, replay, static, continuous again. cont./replayed is the
    first continuous run against the mean of the replays either side of it; cont./static is the mean of both
    continuous runs against the static run between them, so drift over the round falls on both sides."""

    cont: Run
    again: float            # tok/s of the continuous run after the static one
    static: Run
    replayed: float         # tok/s of the first continuous run's tokens over its runs replayed
    stats: RunnerStats      # the first continuous engine's runner

    def cont_tps(self) -> float:
        return (self.cont.tps() + self.again) / 2

    def cont_static(self) -> float:
        return self.cont_tps() / self.static.tps()


def traced_run(model: Model, jobs: list[tuple[list[int], int]], clients: int, steps: int,
               ) -> tuple[Run, list[RunShape], RunnerStats]:
    """A continuous run on a fresh engine, with the runs it made (its trace) and its runner's stats. The run
    is driven by steps, not by the clock (a client sends when a step finished its last request), so every
    such run of the same jobs makes the same runs: `main` replays a trace before the run and after it."""
    engine = make_engine(model, steps)
    engine.runner.trace = []
    out = run(engine, jobs, clients, "continuous")
    return out, engine.runner.trace, dataclasses.replace(engine.runner.stats)


def replay(model: Model, trace: list[RunShape], max_len: int = 512, max_rows: int = 32) -> float:
    """Seconds the bare model takes for exactly the runs a continuous run made (`trace`: every decode and
    prefill run, at its batch, width and, for the shared form, each row's length), stepped back to back
    with every input built before its run and only the runs timed: the ceiling at the batches formed."""
    sess = ort.InferenceSession(model.onnx, options(), providers=["CPUExecutionProvider"])
    shape = model.shape
    names = [(f"past_key_values.{i}.{p}", f"present.{i}.{p}") for i in range(shape.layers)
             for p in ("key", "value")]
    outputs = ["logits", *(present for _, present in names)]
    arena = [np.ones((max_rows, shape.heads, max_len, shape.head_dim), np.float32) for _ in names]  # touched

    def past_of(buffer: np.ndarray, batch: int, width: int) -> np.ndarray:
        """A contiguous [batch, heads, width, head_dim] at the start of an arena buffer (its pages warm)."""
        size = batch * shape.heads * width * shape.head_dim
        return buffer.reshape(-1)[:size].reshape(batch, shape.heads, width, shape.head_dim)

    total = 0
    for run in trace:
        batch, seq = run.ids
        ids, positions = np.zeros((batch, seq), np.int64), np.zeros((batch, seq), np.int64)
        if shape.shared_kv:  # as the runner: past and present one buffer, each row's length in the mask
            mask = (np.arange(run.width) < np.array(run.lengths)[:, None]).astype(np.int64)
            binding = sess.io_binding()
            binding.bind_cpu_input("input_ids", ids)
            binding.bind_cpu_input("position_ids", positions)
            binding.bind_cpu_input("attention_mask", mask)
            binding.bind_output("logits")
            for (past, present), buffer in zip(names, arena, strict=True):
                # a decode reads the decode group's rows (max_len wide), a prefill a buffer of its width
                value = ort.OrtValue.ortvalue_from_numpy(buffer[:batch] if seq == 1 else
                                                         past_of(buffer, batch, run.width))
                binding.bind_ortvalue_input(past, value)
                binding.bind_ortvalue_output(present, value)
            t0 = time.perf_counter_ns()
            sess.run_with_iobinding(binding)
        else:  # as the runner: dense past [batch, heads, width - seq, head_dim], present returned
            context = run.width - seq
            feed = {"input_ids": ids, "position_ids": positions,
                    "attention_mask": np.ones((batch, run.width), np.int64)}
            for (name, _), buffer in zip(names, arena, strict=True):
                feed[name] = past_of(buffer, batch, context)
            t0 = time.perf_counter_ns()
            sess.run(outputs, feed)
        total += time.perf_counter_ns() - t0
    return total / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4,16,32")
    parser.add_argument("--requests-per-client", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lengths", choices=LENGTHS, default="uniform", help="output lengths (module doc)")
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny", help="decoder size (module doc)")
    parser.add_argument("--kv", choices=("dense", "shared"), default="dense", help="KV layout (module doc)")
    parser.add_argument("--steps", type=int, default=1,
                        help="num_scheduler_steps: decode steps per schedule (module doc)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds per point (replay, continuous, replay, static, continuous); the round "
                             "with the median cont./static is printed, every round after the tables")
    args = parser.parse_args()
    model = build_model(args.model, args.kv)
    shape = model.shape
    print(f"model {model.name}: {shape.layers} layers, hidden {shape.hidden} "
          f"({shape.heads} × {shape.head_dim} heads), FFN {shape.ffn}, {args.kv} KV; output lengths "
          f"{args.lengths}; {args.steps} decode steps per schedule; "
          f"{args.requests_per_client} requests per client; seed {args.seed}\n")
    print("| c | continuous tok/s | static tok/s | cont./static | bound | static-leave tok/s "
          "| TTFT p50/p95 ms cont. | TTFT p50/p95 ms static | mean decode batch | mean context "
          "| ceiling tok/s | cont./ceiling | runs replayed tok/s | cont./replayed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    concurrencies = [int(x) for x in args.concurrency.split(",")]
    breakdown = []
    rows = []
    rounds: list[tuple[int, list[Round]]] = []
    for c in concurrencies:
        jobs = workload(c * args.requests_per_client, args.seed + c, args.lengths)
        trace = traced_run(model, jobs, c, args.steps)[1]
        results = []
        for _ in range(args.rounds):  # alternated, so the machine's drift lands on both modes alike
            before = replay(model, trace)
            cont_run, trace, stats = traced_run(model, jobs, c, args.steps)
            replay_tps = cont_run.tokens / ((before + replay(model, trace)) / 2)
            static_run = run(make_engine(model, args.steps), jobs, c, "static")
            again = run(make_engine(model, args.steps), jobs, c, "continuous").tps()
            results.append(Round(cont_run, again, static_run, replay_tps, stats))
        rounds.append((c, results))
        # the round whose cont./static is the median stands for the point (its TTFTs and breakdown too)
        middle = sorted(results, key=Round.cont_static)[len(results) // 2]
        cont, stat, replayed = middle.cont, middle.static, middle.replayed
        breakdown.append(middle.stats)
        leave = run(make_engine(model, args.steps), jobs, c, "static-leave")
        batch = max(1, round(float(np.mean(cont.decode_batch))))
        context = int(np.mean([len(p) + m / 2 for p, m in jobs]))
        top = ceiling(model, batch, context)
        rows.append((c, cont, top))
        print(f"| {c} | {middle.cont_tps():.0f} | {stat.tps():.0f} | {middle.cont_static():.2f} | "
              f"{stat.computed / stat.useful:.2f} | {leave.tps():.0f} | "
              f"{cont.ttft_ms(50):.1f} / {cont.ttft_ms(95):.1f} | "
              f"{stat.ttft_ms(50):.1f} / {stat.ttft_ms(95):.1f} | {np.mean(cont.decode_batch):.1f} | "
              f"{context} | {top:.0f} | {middle.cont_tps() / top:.0%} | {replayed:.0f} | "
              f"{cont.tps() / replayed:.0%} |", flush=True)
    print()
    print("| c | steps | runs/step | blocks → dense past µs/step | ONNX Runtime µs/step (decode) | "
          "present → blocks µs/step | padding in past | decode rows gathered | free rows run | rebuilds |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c, s in zip(concurrencies, breakdown, strict=True):
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
    for (c, cont, _), s in zip(rows, breakdown, strict=True):
        print(f"| {c} | {cont.step_cpu_ns / cont.steps / 1e3:.0f} | "
              f"{cont.step_wall_ns / cont.steps / 1e3:.0f} | {s.run_ns / s.steps / 1e3:.0f} | "
              f"{cont.step_cpu_ns / cont.tokens / 1e3:.1f} |")

    print()
    print("Where a continuous token's time goes against the ceiling's (wall µs per counted token; the five "
          "parts after the ceiling add up to 1 / the first continuous run's tok/s):\n")
    print("| c | ceiling | ONNX Runtime, decode runs | ONNX Runtime, prefill runs | blocks ↔ dense past | "
          "rest of step() (schedule, sample, update, stop) | outside step() (this loop) |")
    print("|---|---|---|---|---|---|---|")
    for (c, cont, top), s in zip(rows, breakdown, strict=True):
        per = 1e3 * cont.tokens  # ns → µs per token
        mapping = s.gather_ns + s.scatter_ns
        rest = cont.step_wall_ns - s.run_ns - mapping
        outside = cont.seconds * 1e9 - cont.step_wall_ns
        prefill_ns = s.run_ns - s.decode_run_ns
        print(f"| {c} | {1e6 / top:.1f} | {s.decode_run_ns / per:.1f} | {prefill_ns / per:.1f} "
              f"| {mapping / per:.1f} | {rest / per:.1f} | {outside / per:.1f} |")
    if args.rounds > 1:
        print("\nEvery round (the continuous runs before and after the static one, cont./static with their "
              "mean, cont./replayed with the first):\n")
        print("| c | round | continuous tok/s, before · after | static tok/s | cont./static "
              "| cont./replayed |")
        print("|---|---|---|---|---|---|")
        for c, results in rounds:
            for i, r in enumerate(results, 1):
                print(f"| {c} | {i} | {r.cont.tps():.0f} · {r.again:.0f} | {r.static.tps():.0f} | "
                      f"{r.cont_static():.2f} | {r.cont.tps() / r.replayed:.0%} |")


if __name__ == "__main__":
    main()
