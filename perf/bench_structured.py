"""Structured output's cost per token in the generation engine, in process: constrained against free rows.

At each concurrency c (`--concurrency`, default 1,16) c requests are added together and run to completion,
seeded, at `--temperature` (default 1; 0: greedy), each up to `--tokens` tokens; the wall time of the
whole run over the tokens it generated is the cost per token. Three workloads, side by side in one run on
the same engine:

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

    .venv/bin/python perf/bench_structured.py --vocab bytes,32000,128000

Wrap it in `flock /work/probes/bench.lock` on a shared machine.
"""

from __future__ import annotations

import argparse
import glob
import sys
import tempfile
import time
from pathlib import Path

import onnxruntime as ort

from engine.generate.core.engine import CacheConfig, GenerationEngine
from engine.generate.core.grammar import constraint_for_json_schema
from engine.generate.core.request import SamplingParams
from engine.generate.core.runner import DecoderRunner
from engine.generate.core.scheduler import SchedulerConfig
from engine.generate.core.tokenizer import ByteTokenizer, JsonTokenizer, Tokenizer
from hubserve_models import examples
from hubserve_models.tiny_decoder import TinyDecoderShape, tiny_decoder_model

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


def make_engine(tokenizer: Tokenizer, seqs: int) -> GenerationEngine:
    model = examples.model_bytes(tiny_decoder_model(TinyDecoderShape(vocab_size=tokenizer.vocab_size)))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    runner = DecoderRunner(model, 512, 16, opts, max_len=512, max_rows=seqs)
    return GenerationEngine(runner, tokenizer, CacheConfig(16, 512, 512),
                            SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=2048))


def run(engine: GenerationEngine, constrained: list[bool], tokens: int, rep: int,
        temperature: float = 1.0) -> tuple[float, int]:
    """(seconds, tokens generated) of one run of len(constrained) requests added together."""
    spec = constraint_for_json_schema(SCHEMA)
    for i, structured in enumerate(constrained):
        params = SamplingParams(max_tokens=tokens, temperature=temperature, seed=1000 * rep + i,
                                ignore_eos=not structured, structured=spec if structured else None)
        engine.add_request(f"{rep}-{i}", PROMPT, params)
    start = time.perf_counter()
    done = engine.run_to_completion()
    return time.perf_counter() - start, sum(len(out.output_token_ids) for out in done.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--vocab", default="bytes,32000",
                        help="bytes, or BPE vocabulary sizes, comma-separated")
    parser.add_argument("--tokens", type=int, default=128, help="max_tokens of each request")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="0: greedy (no sort of the vocabulary: the mask's own cost shows)")
    parser.add_argument("--reps", type=int, default=5, help="runs of each workload, interleaved; median kept")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"onnxruntime {ort.__version__}; {args.tokens} tokens per request, temperature {args.temperature}; "
          f"median of {args.reps} runs")
    print("| vocab | c | free µs/token | json µs/token | json / free | mixed µs/token | mixed / free |")
    print("|---|---|---|---|---|---|---|")
    for vocab in args.vocab.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer: Tokenizer = ByteTokenizer() if vocab == "bytes" else \
                bpe_tokenizer(int(vocab), Path(tmp))
        engine = make_engine(tokenizer, max(levels))
        start = time.perf_counter()
        engine.grammars.check(constraint_for_json_schema(SCHEMA))  # llguidance's tokenizer; the compile
        setup_ms = 1e3 * (time.perf_counter() - start)
        run(engine, [False], 8, 99)  # warm the session
        for c in levels:
            loads = {"free": [False] * c, "json": [True] * c}
            if c > 1:
                loads["mixed"] = [True] + [False] * (c - 1)
            per: dict[str, list[float]] = {name: [] for name in loads}
            for rep in range(args.reps):
                for name, constrained in loads.items():
                    seconds, made = run(engine, constrained, args.tokens, rep, args.temperature)
                    per[name].append(seconds / made)
            us = {name: 1e6 * sorted(v)[len(v) // 2] for name, v in per.items()}
            mixed = f"{us['mixed']:.0f} | {us['mixed'] / us['free']:.2f}" if "mixed" in us else "– | –"
            print(f"| {tokenizer.vocab_size} | {c} | {us['free']:.0f} | {us['json']:.0f} | "
                  f"{us['json'] / us['free']:.2f} | {mixed} |")
        print(f"(vocab {tokenizer.vocab_size}: llguidance's tokenizer set-up and the first compile "
              f"{setup_ms:.0f} ms)")


if __name__ == "__main__":
    main()
