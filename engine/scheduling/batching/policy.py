"""The dynamic-batching policy, pure: which queued requests form the next batch now, or how long to wait.

`BatchPolicy` is synchronous and owns the queues: it answers "which requests form the next batch, now" or
"wait N ns", given the clock. It has no event loop, so its tests are plain functions (test_batching.py);
`Batcher` (batcher.py) drives it on the loop.

Semantics follow Triton's `dynamic_batching`: the window (`max_queue_delay_microseconds`) runs from the oldest
queued request; a batch reaching `max_batch_size` or a preferred size goes at once; requests whose non-batch
dims differ never share a batch; priority levels are served lowest number first; queue policies bound each
level's queue and time requests out (REJECT fails them, DELAY moves them behind every undelayed request).

One addition of ours, `early_dispatch` (on unless the model's parameters say otherwise): a batch stops waiting
for its window once `JoinForecast` (join_forecast.py) says no other request can join before the window ends.
For that the policy counts the requests it has handed out and not yet seen finish (`take` → `finished`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...config.model_config import DynamicBatchingConfig, QueuePolicy, TimeoutAction
from ...errors import EngineError, ErrorCode, invalid
from ...types import Completion, InferenceRequest, InferenceResponse
from .join_forecast import JoinForecast


@dataclass(slots=True, eq=False)
class Pending:
    """A queued request. `inputs` are in the model's input order, validated."""

    request: InferenceRequest
    inputs: dict[str, np.ndarray]
    batch_size: int
    shape_key: tuple[Any, ...]
    enqueue_ns: int
    level: int = 0
    deadline_ns: int = 0  # 0 = never times out
    timeout_action: TimeoutAction = TimeoutAction.REJECT
    future: asyncio.Future[InferenceResponse] | None = field(default=None, repr=False)
    received_ns: int = 0  # when the frontend received it: the SLO window counts latency from here
    # The frontend's answer and the future's done-callback (scheduling/inflight.py): a batch that succeeds
    # takes the callback off and answers its requests in one pass (Batcher._resolve)
    on_done: Completion | None = field(default=None, repr=False)
    callback: Completion | None = field(default=None, repr=False)


@dataclass(slots=True)
class Decision:
    batch: list[Pending]  # empty = send nothing now
    wait_ns: int | None  # when to ask again (None = only when something changes)
    reason: str = ""  # why the batch goes now: full | preferred | window | immediate | early


class BatchPolicy:
    """The queues and the rule that forms batches. Not thread-safe; used from one thread only."""

    def __init__(self, max_batch_size: int, config: DynamicBatchingConfig | None) -> None:
        self.max_batch_size = max(max_batch_size, 1)
        self.config = config or DynamicBatchingConfig()
        self.batching = config is not None
        self.delay_ns = self.config.max_queue_delay_us * 1000
        self.preferred = frozenset(self.config.preferred_batch_sizes)
        levels = self.config.priority_levels or 1
        self._queues: dict[int, deque[Pending]] = {lvl: deque() for lvl in range(1, levels + 1)}
        # Each level's queue policy, looked up once here: `enqueue` reads it for every request
        self._queue_policies = {lvl: self.config.queue_policy(lvl) for lvl in self._queues}
        self._delayed: deque[Pending] = deque()
        self._single = levels == 1
        self._only_queue = self._queues[1]
        self.queued = 0
        """Requests in the queues (`len(policy)`); read as an attribute on the batcher's per-arrival path."""
        self.with_deadline = 0  # queued requests that can time out: timeouts cost nothing without them
        # For `peek`'s wait in O(1): batch elements queued, how many queued requests have each shape key,
        # and whether the queue is in arrival order (its head is then the oldest)
        self._elements = 0
        self._keys: dict[tuple[Any, ...], int] = {}
        self._ordered = True
        self._simple = self._single and self.batching and not self.preferred
        self._executing = 0  # taken by `take` and not yet `finished`
        self.forecast = JoinForecast() if self.batching and self.config.early_dispatch else None

    def __len__(self) -> int:
        return self.queued

    # ------------------------------------------------------------------ admission

    def level_of(self, priority: int) -> int:
        """The queue level for a request's `priority` parameter (0 = the model's default)."""
        levels = self.config.priority_levels
        if levels == 0:
            return 1
        if priority == 0:
            return self.config.default_priority_level or 1
        if not 1 <= priority <= levels:
            raise invalid(f"priority {priority} is outside this model's levels 1..{levels}")
        return priority

    def queue_policy(self, level: int) -> QueuePolicy:
        return self.config.queue_policy(level)

    def enqueue(self, pending: Pending) -> None:
        policy = self._queue_policies[pending.level]
        queue = self._queues[pending.level]
        if policy.max_queue_size and len(queue) >= policy.max_queue_size:
            raise EngineError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"model '{pending.request.model_name}' queue is full ({policy.max_queue_size} requests "
                f"at priority {pending.level}); retry later",
            )
        if queue and pending.enqueue_ns < queue[-1].enqueue_ns:
            self._ordered = False
        queue.append(pending)
        self.queued += 1
        self._elements += pending.batch_size  # `_count(pending, 1)`, spelled out: it runs for every request
        key = pending.shape_key
        self._keys[key] = self._keys.get(key, 0) + 1
        if pending.deadline_ns:
            self.with_deadline += 1
        if self.forecast is not None:  # in_flight, spelled out: this runs for every request
            self.forecast.on_arrival(pending.enqueue_ns, self.queued + self._executing, self.delay_ns)

    @property
    def in_flight(self) -> int:
        """Requests queued or executing: those whose clients are waiting on a batch not yet finished."""
        return self.queued + self._executing

    def remove(self, pending: Pending) -> bool:
        """Take a request out (its client went away). False when it was already dispatched."""
        for queue in (self._queues[pending.level], self._delayed):
            try:
                queue.remove(pending)
            except ValueError:
                continue
            self.queued -= 1
            self._count(pending, -1)
            if pending.deadline_ns:
                self.with_deadline -= 1
            return True
        return False

    def _count(self, pending: Pending, sign: int) -> None:
        self._elements += sign * pending.batch_size
        key = pending.shape_key
        left = self._keys.get(key, 0) + sign
        if left:
            self._keys[key] = left
        else:
            del self._keys[key]
        if not self._keys:
            self._ordered = True  # empty: the next arrival starts an ordered queue

    # ------------------------------------------------------------------ timeouts

    def expire(self, now_ns: int) -> list[Pending]:
        """Apply queue timeouts: returns the requests to reject; DELAY requests move to the back."""
        rejected: list[Pending] = []
        if not self.with_deadline:
            return rejected
        for queue in self._queues.values():
            if not queue:
                continue
            keep: deque[Pending] = deque()
            for p in queue:
                if p.deadline_ns and now_ns >= p.deadline_ns:
                    self.with_deadline -= 1
                    if p.timeout_action is TimeoutAction.DELAY:
                        p.deadline_ns = 0
                        self._delayed.append(p)
                    else:
                        rejected.append(p)
                        self.queued -= 1
                        self._count(p, -1)
                else:
                    keep.append(p)
            if len(keep) != len(queue):
                queue.clear()
                queue.extend(keep)
        return rejected

    def next_deadline_ns(self) -> int | None:
        if not self.with_deadline:
            return None
        deadlines = [p.deadline_ns for q in self._queues.values() for p in q if p.deadline_ns]
        return min(deadlines) if deadlines else None

    # ------------------------------------------------------------------ batch formation

    def _walk(self) -> Iterator[Pending]:
        if self._single and not self._delayed:
            return iter(self._only_queue)
        return self._walk_levels()

    def _walk_levels(self) -> Iterator[Pending]:
        for level in sorted(self._queues):
            yield from self._queues[level]
        yield from self._delayed

    def peek(self, now_ns: int) -> Decision:
        """The batch to send now, without removing it; or how long to wait before asking again."""
        if not self.queued:
            return Decision([], None)
        if (self._simple and self.delay_ns and self._ordered and not self._delayed
                and self._elements < self.max_batch_size and len(self._keys) == 1):
            return self._peek_whole_queue(now_ns)
        batch: list[Pending] = []
        total = 0
        preferred_prefix = 0
        full = False
        first_key = None
        for p in self._walk():
            if first_key is None:
                first_key = p.shape_key
            elif p.shape_key != first_key or total + p.batch_size > self.max_batch_size:
                full = True  # the next request cannot join: this batch is as big as it gets
                break
            batch.append(p)
            total += p.batch_size
            if total in self.preferred:
                preferred_prefix = len(batch)
            if total >= self.max_batch_size or not self.batching:
                full = True
                break
        if full:
            return Decision(batch, None, "full")
        if self.delay_ns == 0:
            return Decision(batch, None, "immediate")
        if preferred_prefix:
            return Decision(batch[:preferred_prefix], None, "preferred")
        remaining = min(p.enqueue_ns for p in batch) + self.delay_ns - now_ns
        if remaining <= 0:
            return Decision(batch, None, "window")
        if self.forecast is not None and self.forecast.none_can_join(self.delay_ns, self.in_flight):
            return Decision(batch, None, "early")
        return Decision([], remaining)

    def _peek_whole_queue(self, now_ns: int) -> Decision:
        """`peek` when the whole queue is the batch and it is not full (one level, nothing delayed, one
        shape, fewer elements than max_batch_size, no preferred sizes, in arrival order): only the window or
        early dispatch can send it. Deciding to wait is then O(1) instead of a walk of the queue, which ran
        on every arrival: at 32 clients and a 1 ms window ~13 requests queue up behind each batch."""
        queue = self._only_queue
        remaining = queue[0].enqueue_ns + self.delay_ns - now_ns
        if remaining <= 0:
            return Decision(list(queue), None, "window")
        if self.forecast is not None and self.forecast.none_can_join(self.delay_ns, self.in_flight):
            return Decision(list(queue), None, "early")
        return Decision([], remaining)

    def take(self, batch: list[Pending]) -> None:
        """Remove a batch returned by `peek` (always a prefix of the walk order). The shape-key and element
        counts are settled once per batch, not per request (`peek` puts one shape key in a batch, but any
        mix is counted right)."""
        elements = 0
        key = None
        same_key = 0
        for p in batch:
            queue = self._queues[p.level]
            if queue and queue[0] is p:
                queue.popleft()
            else:
                self._delayed.remove(p)
            if p.deadline_ns:
                self.with_deadline -= 1
            elements += p.batch_size
            if p.shape_key == key:
                same_key += 1
            else:
                if same_key:
                    self._uncount_key(key, same_key)
                key, same_key = p.shape_key, 1
        if same_key:
            self._uncount_key(key, same_key)
        self._elements -= elements
        if not self._keys:
            self._ordered = True  # empty: the next arrival starts an ordered queue
        self.queued -= len(batch)
        self._executing += len(batch)

    def _uncount_key(self, key: Any, requests: int) -> None:
        left = self._keys[key] - requests
        if left:
            self._keys[key] = left
        else:
            del self._keys[key]

    def finished(self, count: int) -> None:
        """`count` requests taken earlier have their results (answered or failed): their clients may come
        back. Called by the batcher when a batch's execution ends, before its instance is released."""
        self._executing -= count
