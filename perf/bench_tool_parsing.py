"""What reading a streamed answer for tool calls costs per token, in process: an answer that is one call
whose arguments hold a long string (a file's content, say: the case that made Triton's frontend cap its
streamed tool-call parsing, server #8811), fed to the choice's reading in pieces of `--piece` characters (a
token's worth), as the SSE writer feeds it; `required` is tool_choice "required"'s constrained list
(tools/forced.py). The time per piece should not grow with the call's length: each
piece is read once, never the text held before it.

`--compare-tree DIR` (repeatable) runs the same in a subprocess on another checkout's engine (main's, say),
round by round in turn with this one's; the reading's interface (ChoiceCalls.feed) is the same there. The
best of `--reps` per size and round, wall and CPU time; run `PYTHONPATH=.` from a worktree (its `engine` is
not the shared venv's editable install).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SIZES = (1_000, 8_000, 56_000)  # the arguments' characters (MAX_CALL_CHARS is 64 KiB)


def answer(parser: str, size: int) -> str:
    content = "x = 1\\n" * (size // 7)
    if parser == "hermes":
        return ('Let me write it.\n<tool_call>\n{"name": "write_file", "arguments": {"path": "a.py", '
                f'"content": "{content}"}}}}\n</tool_call>')
    if parser == "required":  # tool_choice "required": the grammar's compact list (tools/forced.py)
        return f'[{{"name":"write_file","parameters":{{"path":"a.py","content":"{content}"}}}}]'
    return f'{{"name": "write_file", "parameters": {{"path": "a.py", "content": "{content}"}}}}'


def measure(parser: str, piece: int, reps: int) -> list[dict[str, float]]:
    from engine.openai.tools import PARSERS
    from engine.openai.tools.calls import ChoiceCalls
    from engine.openai.tools.forced import RequiredCallsParser

    make = {**PARSERS, "required": RequiredCallsParser}[parser]

    out = []
    for size in SIZES:
        text = answer(parser, size)
        cuts = [text[i:i + piece] for i in range(0, len(text), piece)]
        wall = cpu = float("inf")
        for _ in range(reps):
            w, c = time.perf_counter(), time.process_time()
            reading = ChoiceCalls(make())
            for cut in cuts:
                reading.feed(cut, False)
            reading.feed("", True)
            wall = min(wall, time.perf_counter() - w)
            cpu = min(cpu, time.process_time() - c)
            assert reading.calls, "the answer was not read as a call"
        out.append({"chars": len(text), "pieces": len(cuts), "wall_us": wall / len(cuts) * 1e6,
                    "cpu_us": cpu / len(cuts) * 1e6})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parser", default="hermes,llama3_json,required")
    ap.add_argument("--piece", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--compare-tree", action="append", default=[])
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a compared tree's run
    args = ap.parse_args()
    parsers = args.parser.split(",")
    if args.json:
        print(json.dumps({p: measure(p, args.piece, args.reps) for p in parsers}))
        return
    trees = [(".", None), *((t, t) for t in args.compare_tree)]
    for r in range(args.rounds):
        for name, tree in trees:
            if tree is None:
                results = {p: measure(p, args.piece, args.reps) for p in parsers}
            else:
                env = {**os.environ, "PYTHONPATH": tree}
                run = subprocess.run([sys.executable, __file__, "--json", "--parser", args.parser, "--piece",
                                      str(args.piece), "--reps", str(args.reps)], env=env, check=True,
                                     capture_output=True, text=True)
                results = json.loads(run.stdout)
            load = os.getloadavg()[0]
            for p, rows in results.items():
                cells = "  ".join(f"{row['chars']:>6} ch: {row['wall_us']:6.2f} / {row['cpu_us']:6.2f} µs"
                                  for row in rows)
                print(f"round {r + 1} load {load:4.1f} {name:>12} {p:<11} {cells}", flush=True)


if __name__ == "__main__":
    main()
