"""Structured output's cost per token in the generation engine, in process: constrained against free rows.

At each concurrency c (`--concurrency`, default 1,16) c requests are added together and run to completion,
seeded, at `--temperature` (default 1; 0: greedy), each up to `--tokens` tokens; the wall time of the
whole run over the tokens it generated is the cost per token, and so is the process's CPU time (every
thread's), which a loaded machine's scheduling moves far less than the wall time (a process whose threads
hand work to each other is woken ahead of busy ones), and the CPU time spent in the engine's `sample` (the
masks, the draws and the grammars' advances: what a constrained row adds, apart from the model's run). Three
workloads, side by side in one run on the same engine:

- free: no constraint (EOS ignored, so every request makes `--tokens` tokens);
- json: every request under a JSON schema (an array of at least 64 objects {"id": integer, "tag": string of
  at most 8 characters}, compact: llguidance's whitespace_flexible off), which a random model fills token
  after token and cannot finish before `--tokens`: both workloads generate the same tokens per request;
- mixed (c > 1): one json request among c - 1 free ones: what the free rows' batch pays for one
  constrained row beside them (only constrained rows compute a mask; the batch's logits are copied once).

Vocabularies (`--vocab`): `bytes` (the example tiny_decoder: 258 tokens, the byte tokenizer) and a
byte-level BPE of `N` tokens trained at bench time with `tokenizers` on this venv's Python sources (a
realistic tokenizer's shape, 32k–150k), with the same decoder built for that vocabulary (hidden 64: the
model is tiny, so the mask's share of a token is much larger here than on a real model). The ratio printed is
json / free per token. At temperature > 0 with no top-k, top-p or min-p (as here) the sampler sorts nothing
and draws from the softmax (it once sorted each row's vocabulary, ~6 ms a row at 32k, which made json look
cheaper than free); greedy (`--temperature 0`) has no softmax either, so it shows the mask's own cost.
Grammar compile time (cached after the first request of a schema) and llguidance's tokenizer set-up (once
per model) are printed apart and not in the per-token times.

`--model l4h256` (bench_generate.py's 4 layers, hidden 256: ~1 ms a step at 258 tokens) shows a step closer
to a real model's, which a real model's would still dwarf. `--compare-tree DIR` (repeatable) runs the same
workloads on another checkout's engine (main's, say) as well, run by run in turn with this one's: each
tree's engine lives in a worker process of its own (this script with PYTHONPATH=DIR), the tokenizer
trained once for all, so the columns share the machine's load.

    .venv/bin/python perf/bench_structured.py --vocab bytes,32000,128000
    PYTHONPATH=. .venv/bin/python perf/bench_structured.py --compare-tree /work/main --model l4h256

Wrap it in `flock /work/probes/bench.lock` on a shared machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

import onnxruntime as ort

from bench_generate import MODELS, options
from engine.generate.core import engine as engine_module
from engine.generate.core import sampler as sampler_module
from engine.generate.core.engine import CacheConfig, GenerationEngine
from engine.generate.core.grammar import constraint_for_json_schema
from engine.generate.core.request import SamplingParams
from engine.generate.core.runner import DecoderRunner
from engine.generate.core.scheduler import SchedulerConfig
from engine.generate.core.tokenizer import ByteTokenizer, JsonTokenizer, Tokenizer
from hubserve_models import examples
from hubserve_models.tiny_decoder import tiny_decoder_model

SCHEMA = {"type": "array", "items": {"type": "object", "properties": {
    "id": {"type": "integer"}, "tag": {"type": "string", "maxLength": 8}},
    "required": ["id", "tag"], "additionalProperties": False}, "minItems": 64,
    "x-guidance": {"whitespace_flexible": False}}
PROMPT = "Items: "


def bpe_tokenizer(vocab: int, folder: Path) -> JsonTokenizer:
    """A byte-level BPE of `vocab` tokens trained on this venv's Python sources (seconds to a minute)."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    files = sorted(glob.glob(str(Path(sys.prefix) / "lib" / "python3*" / "site-packages" / "**" / "*.py"),
                   recursive=True))
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train(files, trainer)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return JsonTokenizer(path, None, "<|endoftext|>")


def make_engine(tokenizer: Tokenizer, seqs: int, model: str) -> GenerationEngine:
    shape = dataclasses.replace(MODELS[model], vocab_size=tokenizer.vocab_size)
    runner = DecoderRunner(examples.model_bytes(tiny_decoder_model(shape)), 512, 16, options(), max_len=512,
                           max_rows=seqs)
    return GenerationEngine(runner, tokenizer, CacheConfig(16, 512, 512),
                            SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=2048))


class SamplerClock:
    """The CPU time spent in the engine's `sample` (the mask, the draw, the grammar's advance): put in the
    engine module's namespace in its place, so that the step calls it."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._sample = engine_module.sample
        engine_module.sample = self  # type: ignore[assignment]

    def __call__(self, *args: Any) -> list[int]:
        start = time.process_time()
        try:
            return self._sample(*args)
        finally:
            self.seconds += time.process_time() - start


def run(engine: GenerationEngine, constrained: list[bool], tokens: int, rep: int,
        temperature: float = 1.0) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of the whole process, tokens generated) of one run of len(constrained)
    requests added together."""
    spec = constraint_for_json_schema(SCHEMA)
    for i, structured in enumerate(constrained):
        params = SamplingParams(max_tokens=tokens, temperature=temperature, seed=1000 * rep + i,
                                ignore_eos=not structured, structured=spec if structured else None)
        engine.add_request(f"{rep}-{i}", PROMPT, params)
    start, cpu = time.perf_counter(), time.process_time()
    done = engine.run_to_completion()
    return (time.perf_counter() - start, time.process_time() - cpu,
            sum(len(out.output_token_ids) for out in done.values()))


def workloads(c: int) -> dict[str, list[bool]]:
    loads = {"free": [False] * c, "json": [True] * c}
    if c > 1:
        loads["mixed"] = [True] + [False] * (c - 1)
    return loads


def worker(args: argparse.Namespace) -> None:
    """One tree's engine (whichever `engine` PYTHONPATH finds), run on the parent's word: it reads
    "c rep name" lines and answers "wall-seconds CPU-seconds tokens sampler-CPU-seconds" for each."""
    tokenizer: Tokenizer = ByteTokenizer() if args.worker == "bytes" else \
        JsonTokenizer(Path(args.worker), None, "<|endoftext|>")
    engine = make_engine(tokenizer, args.seqs, args.model)
    start = time.perf_counter()
    engine.grammars.check(constraint_for_json_schema(SCHEMA))  # llguidance's tokenizer; the compile
    setup_ms = 1e3 * (time.perf_counter() - start)
    print(f"{setup_ms:.0f} {Path(sampler_module.__file__).parents[3]}", flush=True)  # the tree it runs
    run(engine, [False], 8, 99)  # warm the session
    clock = SamplerClock()
    for line in sys.stdin:
        c, rep, name = line.split()
        clock.seconds = 0.0
        seconds, cpu, made = run(engine, workloads(int(c))[name], args.tokens, int(rep), args.temperature)
        print(f"{seconds} {cpu} {made} {clock.seconds}", flush=True)


class Tree:
    """A worker process running this script over one checkout's engine."""

    def __init__(self, root: Path, tokenizer: str, args: argparse.Namespace, seqs: int) -> None:
        env = {**os.environ, "PYTHONPATH": str(root)}
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--worker", tokenizer, "--seqs", str(seqs), "--model", args.model,
             "--tokens", str(args.tokens), "--temperature", str(args.temperature)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        setup_ms, found = self._read().split()
        if Path(found) != root:  # PYTHONPATH lost to the venv's editable install: not the tree asked for
            raise RuntimeError(f"the worker for {root} imported the engine of {found}")
        self.setup_ms = float(setup_ms)

    def per_token(self, c: int, rep: int, name: str) -> tuple[float, float, float]:
        """(wall, CPU, the sampler's CPU) seconds per generated token of one run."""
        assert self.process.stdin is not None
        self.process.stdin.write(f"{c} {rep} {name}\n")
        self.process.stdin.flush()
        seconds, cpu, made, sampler = self._read().split()
        return float(seconds) / int(made), float(cpu) / int(made), float(sampler) / int(made)

    def _read(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker exited ({self.process.wait()})")
        return line

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait()


def ratios(times: dict[tuple[str, str], float], name: str, trees: dict[str, Tree]) -> str:
    """Workload `name` over free per token, each tree's; "–" where it did not run (mixed at c = 1)."""
    if (next(iter(trees)), name) not in times:
        return "–"
    return " → ".join(f"{times[tree, name] / times[tree, 'free']:.2f}" for tree in trees)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--vocab", default="bytes,32000",
                        help="bytes, or BPE vocabulary sizes, comma-separated")
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny",
                        help="the decoder's size (bench_generate.py), built for each vocabulary")
    parser.add_argument("--tokens", type=int, default=128, help="max_tokens of each request")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="0: greedy (no sort of the vocabulary: the mask's own cost shows)")
    parser.add_argument("--reps", type=int, default=5, help="runs of each workload, interleaved; median kept")
    parser.add_argument("--compare-tree", type=Path, action="append", default=[],
                        help="another checkout whose engine runs the same workloads, in turn with this one "
                             "(repeatable: each a column before this one's)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # a tree's worker: its tokenizer.json or bytes
    parser.add_argument("--seqs", type=int, default=16, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    levels = [int(c) for c in args.concurrency.split(",")]
    roots = {f"tree{i}": root.resolve() for i, root in enumerate(args.compare_tree, 1)}
    roots["this"] = Path(__file__).resolve().parents[1]
    print(f"onnxruntime {ort.__version__}; model {args.model}; {args.tokens} tokens per request, temperature "
          f"{args.temperature}; median of {args.reps} runs; trees: "
          + ", ".join(f"{name} {root}" for name, root in roots.items()))
    arrow = " → ".join(roots)
    print(f"| vocab | c | free µs/token {arrow} | json / free {arrow} | json / free CPU {arrow} | "
          f"mixed / free {arrow} | mixed / free CPU {arrow} | sampler CPU µs/token free, json {arrow} |")
    print("|---|---|---|---|---|---|---|---|")
    for vocab in args.vocab.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            if vocab != "bytes":
                bpe_tokenizer(int(vocab), Path(tmp))  # each worker reads it before the folder goes
            tokenizer = "bytes" if vocab == "bytes" else str(Path(tmp) / "tokenizer.json")
            trees = {name: Tree(root, tokenizer, args, max(levels)) for name, root in roots.items()}
        for c in levels:
            per: dict[tuple[str, str], list[tuple[float, float, float]]] = {
                (tree, name): [] for tree in trees for name in workloads(c)}
            for rep in range(args.reps):
                for name in workloads(c):
                    for tree, process in trees.items():
                        per[tree, name].append(process.per_token(c, rep, name))
            wall = {key: 1e6 * median([w for w, _, _ in v]) for key, v in per.items()}
            cpu = {key: 1e6 * median([t for _, t, _ in v]) for key, v in per.items()}
            sampler = {key: 1e6 * median([t for _, _, t in v]) for key, v in per.items()}
            free = " → ".join(f"{wall[tree, 'free']:.0f}" for tree in trees)
            shares = " | ".join(ratios(times, name, trees)
                                for name in ("json", "mixed") for times in (wall, cpu))
            sampled = " → ".join(f"{sampler[tree, 'free']:.1f}, {sampler[tree, 'json']:.1f}"
                                 for tree in trees)
            print(f"| {vocab} | {c} | {free} | {shares} | {sampled} |", flush=True)
        for tree, process in trees.items():
            print(f"(vocab {vocab}, {tree}: llguidance's tokenizer set-up and the first compile "
                  f"{process.setup_ms:.0f} ms)")
            process.close()


if __name__ == "__main__":
    main()
