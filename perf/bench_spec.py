"""Speculative decoding in the engine, single stream: each proposer against plain decoding, in one run.

One request at a time (a single stream, where speculative decoding is meant to help: each step is one
model run whose cost barely grows with a few more tokens), greedy, EOS ignored, over the same prompts in
every mode, the modes interleaved prompt by prompt so the machine's drift falls on all of them:

- plain: the engine as built, one token per step;
- ngram: `speculative_method` "ngram" (engine/generate/core/proposer.py), k = `--k`, suffixes of 1 … 3;
- draft (agreeing): `speculative_method` "draft_model" (engine/generate/core/draft_proposer.py) with a
  draft that agrees with the target by construction (perf/hubserve_models/draft_pair.py): the target's
  embedding, first `--draft-layers` layer(s) with `--draft-ffn` of their MLP units, and head; the target's
  other layers and units write `--residual-scale` × what they would, so they seldom flip its argmax. Random
  weights give no such pair otherwise; the acceptance printed is what this construction gives;
- draft (disagreeing): the example-size `tiny` decoder (2 layers, hidden 64, other random weights) as the
  draft: it agrees with nothing;
- oracle: the same verification, proposals from the greedy tokens computed beforehand (every proposal
  right): what the mechanism gives at 100 % acceptance, the ceiling for any proposer at this k.

The target is the pair's, of the `--model` shape (`l4h256`: a step costs milliseconds), for every mode.
With `--backoff both` (the default) each proposer runs twice, bare and wrapped in the back-off the model
folder's loader applies (engine/generate/core/backoff.py: a request stops proposing while its proposals
do not pay for their measured cost); `on` / `off` run one of them.

Prompts (`--workload`): `repetitive` (the default) repeats a phrase of 3–8 bytes 4–12 times, as an edit or
a quote repeats its prompt; `random` is random bytes, where lookup rarely finds anything. The output tokens
are the model's: with random weights (perf/hubserve_models/tiny_decoder.py) they do not follow the prompt
the way a trained model's do, so the ngram acceptance here is what a random model's own loops give, not a
real workload's; the oracle column is the mechanism's ceiling whatever the proposer.

Every mode's engine runs the prompts once untimed first, as plain's does to compute the greedy tokens, so
that no mode's timing includes its sessions' cold start (and each back-off then starts afresh).

Per mode: tokens/s, tokens per CPU second of this process (one thread: ONNX Runtime runs on it, so on a
shared machine this is what the others' load does not inflate; read it beside the wall-clock ratio), tokens
per engine step, and for the speculative modes the acceptance (proposed tokens kept / proposed). Each
mode's tokens are checked equal to plain's (greedy: speculation must not change them).

    PYTHONPATH=. .venv/bin/python perf/bench_spec.py [--model tiny|l4h256] [--kv dense|shared] [--k 4]
        [--prompts 24] [--max-tokens 128] [--workload repetitive|random] [--seed 0] [--backoff both|on|off]
        [--draft-layers 1] [--draft-ffn 128] [--residual-scale 0.05]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bench_generate import MODELS, build_model, options
from engine.generate.core.backoff import BackoffProposer, step_clock
from engine.generate.core.draft_proposer import DraftModelProposer
from engine.generate.core.engine import CacheConfig, GenerationEngine
from engine.generate.core.proposer import NgramProposer, Proposer, SpeculativeConfig
from engine.generate.core.request import SamplingParams
from engine.generate.core.runner import DecoderRunner
from engine.generate.core.scheduler import SchedulerConfig
from engine.generate.core.tokenizer import ByteTokenizer
from hubserve_models import examples
from hubserve_models.draft_pair import agreeing_pair


class OracleProposer:
    """Proposes the greedy tokens computed beforehand (by prompt): every proposal is kept."""

    def __init__(self, want: dict[tuple[int, ...], list[int]], k: int) -> None:
        self.want, self.k = want, k

    def release(self, request_id: str) -> None:
        pass

    def propose(self, request_id: str, token_ids: Sequence[int], limit: int) -> list[int]:
        for prompt, out in self.want.items():
            if tuple(token_ids[:len(prompt)]) == prompt:
                done = len(token_ids) - len(prompt)
                return out[done:done + min(limit, self.k)]
        return []


@dataclass
class Tally:
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # this process's CPU time: what other processes' load does not add to
    tokens: int = 0
    steps: int = 0
    proposed: int = 0
    kept: int = 0


def make_engine(onnx: bytes, shared: bool, proposer: Proposer | None) -> GenerationEngine:
    runner = DecoderRunner(onnx, 256, 16, options(), shared_kv=shared, max_len=512, max_rows=4)
    return GenerationEngine(runner, ByteTokenizer(), CacheConfig(16, 256, 512), SchedulerConfig(4, 256),
                            proposer=proposer)


def prompts(kind: str, count: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        if kind == "repetitive":
            phrase = rng.integers(32, 127, size=int(rng.integers(3, 9))).tolist()
            out.append([256, *phrase * int(rng.integers(4, 13))])
        else:
            out.append([256, *rng.integers(32, 127, size=int(rng.integers(24, 96))).tolist()])
    return out


def one(engine: GenerationEngine, prompt: list[int], max_tokens: int, tally: Tally) -> list[int]:
    before = engine.stats()
    engine.add_request("r", prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    t0, c0 = time.perf_counter(), time.process_time()
    steps, done = 0, None
    while engine.has_unfinished():
        for output in engine.step():
            if output.finished:
                done = output
        steps += 1
    tally.seconds += time.perf_counter() - t0
    tally.cpu_seconds += time.process_time() - c0
    assert done is not None
    after = engine.stats()
    tally.tokens += len(done.output_token_ids)
    tally.steps += steps
    tally.proposed += after.spec_draft_tokens - before.spec_draft_tokens
    tally.kept += after.spec_accepted_tokens - before.spec_accepted_tokens
    return list(done.output_token_ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny")
    parser.add_argument("--kv", choices=("dense", "shared"), default="dense")
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--workload", choices=("repetitive", "random"), default="repetitive")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backoff", choices=("on", "off", "both"), default="both",
                        help="wrap the proposers in the back-off (engine/generate/core/backoff.py)")
    parser.add_argument("--draft-layers", type=int, default=1, help="the agreeing draft's layers")
    parser.add_argument("--draft-ffn", type=int, default=128, help="the agreeing draft's MLP units")
    parser.add_argument("--residual-scale", type=float, default=0.05,
                        help="the target's later layers' output scale (hubserve_models/draft_pair.py)")
    args = parser.parse_args()

    shape = dataclasses.replace(MODELS[args.model], shared_kv=args.kv == "shared")
    target, agreeing = (examples.model_bytes(m) for m in agreeing_pair(
        shape, args.draft_layers, args.draft_ffn, args.residual_scale))
    shared = args.kv == "shared"
    batch = prompts(args.workload, args.prompts, args.seed)
    plain = make_engine(target, shared, None)
    want = {tuple(p): one(plain, p, args.max_tokens, Tally()) for p in batch}  # also warms the session up
    vocab = shape.vocab_size

    def sources() -> dict[str, Proposer]:  # fresh ones for each engine: a draft keeps state per request
        return {"ngram": NgramProposer(SpeculativeConfig(num_speculative_tokens=args.k)),
                "draft (agreeing)": DraftModelProposer(agreeing, options(), args.k, vocab),
                "draft (disagreeing)": DraftModelProposer(disagreeing, options(), args.k, vocab),
                "oracle": OracleProposer(want, args.k)}

    disagreeing = build_model("tiny").onnx
    engines = {"plain": plain}
    clock = step_clock(["CPUExecutionProvider"], options().intra_op_num_threads)  # as served
    backoffs: dict[str, Proposer] = {}  # label: the bare proposer a fresh back-off wraps after the warm-up
    for backoff in (False, True) if args.backoff == "both" else (args.backoff == "on",):
        for name, proposer in sources().items():
            label = f"{name}, back-off" if backoff else name
            engines[label] = make_engine(target, shared,
                                         BackoffProposer(proposer, clock) if backoff else proposer)
            if backoff:
                backoffs[label] = proposer
    # Every engine's sessions (its own target's, its draft's) see every prompt once untimed, as plain's did
    # computing `want`: a first pass costs more than the next (an engine with the agreeing draft 12 % more
    # CPU, plain 2 %: the sessions' first runs at each new shape of input), and timing it in the other modes
    # only charged them a cold start that plain never paid. The back-offs then start afresh, so their
    # learning stays in the timed pass.
    for name, engine in engines.items():
        if name != "plain":
            for prompt in batch:
                one(engine, prompt, args.max_tokens, Tally())
    for label, proposer in backoffs.items():
        engines[label].scheduler.proposer = BackoffProposer(proposer, clock)
    tallies = {name: Tally() for name in engines}
    for prompt in batch:  # interleaved, prompt by prompt: drift falls on every mode alike
        for name, engine in engines.items():
            tokens = one(engine, prompt, args.max_tokens, tallies[name])
            assert tokens == want[tuple(prompt)], f"{name} changed the greedy tokens"

    print(f"model {args.model} ({args.kv}), {args.workload} prompts × {args.prompts}, {args.max_tokens} "
          f"tokens each, greedy, single stream, k = {args.k}")
    print("| mode | tok/s | × plain | tok/CPU-s | × plain (CPU) | tokens/step | acceptance |")
    print("|---|---|---|---|---|---|---|")
    plain_tally = tallies["plain"]
    base, cpu_base = plain_tally.tokens / plain_tally.seconds, plain_tally.tokens / plain_tally.cpu_seconds
    for name, t in tallies.items():
        rate, cpu_rate = t.tokens / t.seconds, t.tokens / t.cpu_seconds
        accepted = f"{t.kept / t.proposed:.0%} of {t.proposed:,}" if t.proposed else "–"
        print(f"| {name} | {rate:,.0f} | {rate / base:.2f} | {cpu_rate:,.0f} | {cpu_rate / cpu_base:.2f} | "
              f"{t.tokens / t.steps:.2f} | {accepted} |")


if __name__ == "__main__":
    main()
