"""What a strict tool under tool_choice auto costs per token: the grammar in the model's call format
(engine/openai/tools/strict.py, Hermes) against free decoding and against a JSON schema, in process.

c requests (`--concurrency`, default 1,16) run together to completion, greedy, 64 tokens each, EOS ignored,
on bench_structured.py's tiny decoder built for the vocabulary (`--vocab`: `bytes`, or a byte-level BPE of
N tokens trained at bench time): **free** (no constraint), **strict** (every request under the Hermes
strict-tools grammar; a random model writes text, so this is the free text's mask: any text, with the lazy
`<tool_call>` trigger), **json** (bench_structured.py's schema). Interleaved run by run, median of `--reps`;
the process's CPU time per generated token (a shared machine's load moves it less than the wall time).

    PYTHONPATH=. .venv/bin/python perf/bench_strict_tools.py --vocab bytes,32000

Wrap it in `flock /work/probes/bench.lock` on a shared machine.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from statistics import median

from bench_structured import PROMPT, SCHEMA, bpe_tokenizer, make_engine
from engine.generate.core.grammar import GrammarSpec, constraint_for_json_schema
from engine.generate.core.request import SamplingParams
from engine.generate.core.tokenizer import ByteTokenizer, Tokenizer
from engine.openai.tools.request import parse_tools
from engine.openai.tools.strict import strict_calls

TOOLS = [{"type": "function", "function": {"name": "forecast", "strict": True, "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Lyon"]}, "days": {"type": "integer"}},
    "required": ["city", "days"], "additionalProperties": False}}}]


def per_token_us(tokenizer: Tokenizer, c: int, reps: int, tokens: int) -> dict[str, float]:
    """CPU µs per generated token of each workload, median of `reps` interleaved runs."""
    strict = strict_calls(parse_tools({"tools": TOOLS}), "hermes", tokenizer)
    assert strict is not None
    specs: dict[str, GrammarSpec | None] = {"free": None, "strict": strict.grammar,
                                            "json": constraint_for_json_schema(SCHEMA)}
    engine = make_engine(tokenizer, c, "tiny")
    for spec in specs.values():
        if spec is not None:
            engine.grammars.check(spec)  # compiled before the clock starts
    times: dict[str, list[float]] = {name: [] for name in specs}
    for rep in range(reps):
        for name, spec in specs.items():
            for i in range(c):
                engine.add_request(f"{name}{rep}-{i}", PROMPT, SamplingParams(
                    max_tokens=tokens, temperature=0.0, ignore_eos=True, structured=spec))
            cpu = time.process_time()
            done = engine.run_to_completion()
            cpu = time.process_time() - cpu
            times[name].append(1e6 * cpu / sum(len(out.output_token_ids) for out in done.values()))
    return {name: median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", default="bytes,32000")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    print("| vocab | c | free µs/token (CPU) | strict / free | json / free |\n|---|---|---|---|---|")
    for vocab in args.vocab.split(","):
        tokenizer: Tokenizer = ByteTokenizer() if vocab == "bytes" else \
            bpe_tokenizer(int(vocab), Path(tempfile.mkdtemp()))
        for c in (int(x) for x in args.concurrency.split(",")):
            got = per_token_us(tokenizer, c, args.reps, args.tokens)
            print(f"| {tokenizer.vocab_size} | {c} | {got['free']:.0f} | {got['strict'] / got['free']:.2f} | "
                  f"{got['json'] / got['free']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
