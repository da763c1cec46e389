"""The Python-model instance process's own work per batch, part by part, without a socket or a second process.

    PYTHONPATH=. .venv/bin/python perf/bench_stub_parts.py [--batches 3000] [--repeats 5]

What the stub (engine/backends/python/stub.py) does with one `Exec` of `bench_pipelines.py`'s add_sub
model.py (two INT32 [1,16] inputs per request), batches of 1 and of 8: `requests` (requests_from: the
pb_utils requests and input tensors), `execute` (the model's own execute), `convert` (runner.py
convert_response, per answer), `answers` (the `Ok`s and the output list, as `serve` builds them) and
`frame` (channel.py `Channel.frame` of the `Result`: wire chunks, placement, tensor headers, encoding). Each
part is timed with `time.thread_time` (this thread's CPU, not the wall clock), so a loaded machine's
preemptions do not count; the best of `--repeats` runs per part. `bench_channel.py --python-hop` measures
the whole hop between two processes (system calls and wake-ups included), which this leaves out.
`PYTHONPATH=<other checkout>` (run from that checkout) measures its engine with this script, for a
before/after in one sitting.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench_pipelines import ADD_SUB_PY  # perf/ is on the path: the script's own folder
from engine.backends.python import stub
from engine.backends.python.channel import instance_side
from engine.backends.python.messages import RequestHeader, Result
from engine.backends.python.runner import ModelRunner, convert_response
from engine.types import DataType

PARTS = ("requests", "execute", "convert", "answers", "frame")


def measure(runner: ModelRunner, size: int, batches: int, repeats: int) -> dict[str, float]:
    """µs of this thread's CPU per batch of `size` requests, per part: the best of `repeats` runs."""
    ours, theirs = socket.socketpair()
    channel = instance_side(ours, None, None)
    headers = [RequestHeader("", 0, 0, "{}", ["OUTPUT0", "OUTPUT1"], 2, 0) for _ in range(size)]
    zeros = np.zeros((1, 16), np.int32)
    tensors = [("INPUT0", DataType.INT32, zeros.copy()), ("INPUT1", DataType.INT32, zeros.copy())] * size
    best = dict.fromkeys(PARTS, float("inf"))
    clock = time.thread_time
    for _ in range(repeats):
        spent = dict.fromkeys(PARTS, 0.0)
        for _ in range(batches):
            t0 = clock()
            requests = stub.requests_from(headers, tensors, None)
            t1 = clock()
            responses = runner.model.execute(requests)
            t2 = clock()
            answers = [convert_response(r, i) for i, r in enumerate(responses)]
            t3 = clock()
            metas, outputs = stub.answer_frame(answers)
            t4 = clock()
            channel.frame(Result(1, None, metas), outputs)
            t5 = clock()
            for part, took in zip(PARTS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
                spent[part] += took
        for part in PARTS:
            best[part] = min(best[part], spent[part] / batches * 1e6)
    ours.close()
    theirs.close()
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "1").mkdir()
        (folder / "1" / "model.py").write_text(ADD_SUB_PY)
        runner = ModelRunner(folder / "1" / "model.py", {}, folder, "add_sub/")
        for size in (1, 8):
            best = measure(runner, size, args.batches, args.repeats)
            parts = ", ".join(f"{part} {best[part]:.1f}" for part in PARTS)
            print(f"batch of {size}: {parts}; total {sum(best.values()):.1f} µs CPU per batch (best of "
                  f"{args.repeats}; load {os.getloadavg()[0]:.1f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
