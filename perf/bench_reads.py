"""`Reads.arrays` (engine/ipc/tensors.py) per tensor: this checkout's against another commit's, interleaved.

    PYTHONPATH=. .venv/bin/python perf/bench_reads.py [--baseline df775bf] [--rounds 5]

Two INT32/FP32 tensors of shape [1,16] and [2,8] (the add_sub shapes, and one of two dimensions), read over
a memoryview (a frame's inline bytes) and over a uint8 array (a block, as `PeerBlocks` reads it). Timed
with `time.thread_time` (this thread's CPU), the best of 9 runs, so a loaded machine's preemptions do not
count. The baseline's tensors.py is taken from git and run against this checkout's other modules.
"""

from __future__ import annotations

import argparse
import subprocess
import time
import timeit
import types

import numpy as np

from engine.ipc import tensors
from engine.types import DataType

SPECS = [("A", DataType.FP32, (1, 16)), ("B", DataType.INT32, (2, 8))]
LOCATIONS = ((0, 64), (64, 64))


def baseline(rev: str) -> types.ModuleType:
    source = subprocess.run(["git", "show", f"{rev}:engine/ipc/tensors.py"], capture_output=True, text=True,
                            check=True).stdout
    module = types.ModuleType("engine.ipc.tensors_baseline")
    module.__package__ = "engine.ipc"
    exec(compile(source, f"{rev}:engine/ipc/tensors.py", "exec"), module.__dict__)
    return module


def per_tensor_us(module: types.ModuleType, base: object) -> float:
    reads = module.Reads(SPECS)
    runs = timeit.repeat(lambda: reads.arrays(LOCATIONS, base), timer=time.thread_time, number=20000,
                         repeat=9)
    return min(runs) / 20000 / len(SPECS) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="HEAD~1")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    before = baseline(args.baseline)
    bases = {"memoryview": memoryview(bytes(128)), "block": np.zeros(128, np.uint8)}
    for n in range(args.rounds):
        for name, base in bases.items():
            print(f"round {n} {name:10s} µs per tensor: {args.baseline} {per_tensor_us(before, base):.2f}, "
                  f"this checkout {per_tensor_us(tensors, base):.2f}", flush=True)


if __name__ == "__main__":
    main()
