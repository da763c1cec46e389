"""The end of one request's life, whoever served it: its outcome counted in its version's statistics, then its
access line and spans (observe.py) written from the same times.

Why one function: a request reaches a model through one of four doors, and each used to account its end on
its own: the batchers' one done-callback (engine/scheduling/inflight.py, for the dynamic, sequence and Python
request batchers), the ensemble driver (scheduling/ensemble/driver.py), and generation, for Triton's
generate and ModelStreamInfer (engine/generate/triton/model.py) and for the OpenAI API and its Batch API
(engine/openai/generation.py) through engine/generate/serving/accounting.py. Each now ends here, so every
answered inference counts once and writes one access line and, when sampled, its spans. The dynamic
batcher's successful requests end a batch at a time, in `requests_succeeded`.

The times a request carries (engine/types.py `InferenceRequest`, perf_counter ns, 0 = never reached): when
it entered its queue (`queued_ns`), when its batch left the queue (`dispatched_ns`), when its outputs were
ready (`computed_ns`), and the elements of the batch it ran in (`executed_batch`). Whoever serves it stamps
them only while `observe.STATE.active`, so a server with lines and tracing off pays one attribute read.
What each door stamps:
- a batcher: its queue and its batch's execution (a decoupled Python model's compute lasts until its final
  response: backends/python/decoupled.py);
- an ensemble: from its arrival until its first step began, and the whole plan as its compute;
- a generation: from its arrival until it was handed to the engine's driver (tokenizing its prompt), and
  the whole generation as its compute, batch size 1 (as its statistics count
  it: engine/generate/serving/accounting.py).
"""

from __future__ import annotations

from ..types import InferenceRequest
from . import observe
from .stats import ModelStats


def request_ended(stats: ModelStats, model: str, version: str, request: InferenceRequest,
                  error: BaseException | None, cancelled: bool, received_ns: int, end_ns: int) -> None:
    """Count the request's outcome (success, fail with `error`, or cancelled: its client left) with its time
    since `received_ns` (when the frontend received it), then observe it. Called once per request, on the
    loop, before the frontend answers."""
    elapsed = end_ns - received_ns
    if cancelled:
        stats.cancelled.add(elapsed)
    elif error is not None:
        stats.record_request(stats.fail, elapsed)
    else:
        stats.record_request(stats.success, elapsed)
    if observe.STATE.active:
        observe.finished(model, version, request, error, cancelled, received_ns, end_ns)


def requests_succeeded(stats: ModelStats, model: str, version: str, requests: list[InferenceRequest],
                       received_ns: list[int], end_ns: int) -> None:
    """`request_ended` for each of a batch's answered requests (`received_ns[i]` is `requests[i]`'s), in one
    call: the batcher's answer pass (engine/scheduling/batching/batcher.py `_resolve`) accounts a whole
    batch, then answers it."""
    stats.record_successes([end_ns - received for received in received_ns])
    if observe.STATE.active:
        for request, received in zip(requests, received_ns, strict=True):
            observe.finished(model, version, request, None, False, received, end_ns)
