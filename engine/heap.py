"""The cyclic garbage collector's settings for a serving process.

Called once by `Server.run_until_signalled` when the models are loaded, and by each `--workers` frontend
process when it serves (engine/workers/frontend.py). Two costs it removes, both seen in
the server's profile at saturation (perf: `gc_collect_main`, `visit_reachable`, `visit_decref`):
- every object that exists once the models are loaded (modules, protobuf descriptors, ONNX Runtime's
  sessions, configs) was walked again by each full collection, though none of it ever becomes garbage:
  `gc.freeze()` moves it out of the collector's generations;
- the default first-generation threshold (700 allocations) ran a young collection every ~20 requests;
  a request's objects die by reference counting as it is answered, so a larger threshold runs the same
  walks less often. Reference cycles are still collected, only later.
A frozen object is never collected, so a version loaded before the freeze and unloaded after it would leave
whatever it holds in a reference cycle (a batcher and its instance pool refer to each other) for good: the
repository calls `collect_retired` after every unload.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000
"""Container allocations (net of deallocations) between young collections; the default is 700."""


def settle_after_load() -> None:
    """Collect once, then keep what is left out of every later collection and collect the young less
    often."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)


def collect_retired() -> None:
    """Called by the repository once unloaded versions are drained and closed (never on the request path; a
    full collection takes tens of milliseconds): thaw what was frozen, collect the cycles the versions left,
    and freeze again what is still alive."""
    frozen = gc.get_freeze_count() > 0
    gc.unfreeze()
    gc.collect()
    if frozen:
        gc.freeze()
