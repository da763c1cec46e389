"""The sequence batcher's bookkeeping (pure): slots, the backlog, idle release and which rows form a batch.

No event loop, no clocks: every call takes `now_ns`, so the tests are plain functions. The asyncio driver
(engine/scheduling/sequence/batcher.py) calls it on the loop thread:

1. `submit()` for every request: checks the sequence flags (raises INVALID_ARG in Triton's words) and queues
   the request on its sequence, which holds a slot or waits in the backlog;
2. `next_batch()` while an instance is free: at most one request per sequence per batch, and none for a
   sequence whose previous request is still running (its state is not back yet);
3. `finished()` when a batch is answered; `cancel()` when a client gave up on a request;
4. `expire_idle()` on every dispatch: a sequence with nothing queued or running that saw no request for
   `max_sequence_idle_us` is released, and its slot goes to the oldest sequence in the backlog.

Strategies (Triton's): `direct` gives each sequence one slot, a (instance, row) pair: its requests always
run on that instance, in that batch row; rows without a ready request are fillers (READY false). `oldest`
holds up to `max_candidate_sequences` sequences and batches the oldest ready requests among them on any
free instance, up to max_batch_size, waiting up to `max_queue_delay_us` for a preferred size.

A sequence ends when its END request leaves the queue (the slot is free for the next batch) unless a new
START for the same id is queued behind it (Triton: the new sequence continues in the slot, with a warning).

The backlog (sequences waiting for a slot) is bounded by `BacklogLimits`, and so are the requests one sequence
may have queued; the backlog in all, and per API key when the server has keys (the key that started the
sequence; `owner` "" on a server without keys, where only the total applies). A START that would pass a bound
is refused RESOURCE_EXHAUSTED (HTTP 429, gRPC UNAVAILABLE, as a full queue) before anything is queued. The
backlog is insertion-ordered with O(1) removal, so a client that abandons thousands of waiting sequences at
once (a closed stream) costs the loop time linear in them.
"""

from __future__ import annotations

import heapq
import logging
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...config.sequence import SequenceBatchingConfig, Strategy
from ...errors import EngineError, ErrorCode, invalid

log = logging.getLogger("hubserve.sequence")
CorrId = int | str


@dataclass(frozen=True, slots=True)
class BacklogLimits:
    """How many sequences may wait for a slot in one model version, and how many requests one sequence may
    have queued (0: no limit). ServerOptions carries them (--max-sequence-backlog,
    --max-sequence-backlog-per-key, --max-sequence-queue). The per-sequence bound is what bounds a
    sequence's requests on a ModelStreamInfer stream, whose own cap leaves them out: a stream that
    interleaves many sequences must never stop reading the very requests that would free a slot."""

    max_sequences: int = 4096
    max_per_key: int = 1024  # of one API key; a server without keys has one owner and only max_sequences
    max_queued_per_sequence: int = 1024  # requests of one sequence waiting behind its running one


DEFAULT_BACKLOG = BacklogLimits()


@dataclass(eq=False, slots=True)
class Sequence:
    """One live sequence. `state` belongs to the driver (its implicit-state tensors)."""

    corrid: CorrId
    owner: str = ""  # the API key that started it ("" without keys): what its place in the backlog counts to
    slot: tuple[int, int] | None = None  # (instance or -1, row); None while in the backlog
    queue: deque[Entry] = field(default_factory=deque)
    running: bool = False
    ending: bool = False  # an END request is queued and no START after it
    last_active_ns: int = 0  # the last arrival, or the end of its last run if later
    released: bool = False  # left the policy (ended, idle, cancelled): later requests need a START
    state: Any = None


@dataclass(eq=False, slots=True)
class Entry:
    """One queued request of a sequence; `item` is the driver's."""

    sequence: Sequence
    item: Any
    start: bool
    end: bool
    arrival_ns: int


@dataclass(slots=True)
class Batch:
    """Rows of one execution. `instance` is the instance it must run on (-1: any); a None row is a filler
    (direct strategy: a slot with no ready request below the highest used row)."""

    instance: int
    rows: list[Entry | None]


class SequencePolicy:
    def __init__(self, model_name: str, config: SequenceBatchingConfig, instances: int,
                 max_batch_size: int, limits: BacklogLimits = DEFAULT_BACKLOG) -> None:
        self.model = model_name
        self.config = config
        self.limits = limits
        self.rows = max(1, max_batch_size)  # batch rows per execution
        self.idle_ns = config.max_sequence_idle_us * 1000
        self.delay_ns = config.max_queue_delay_us * 1000
        self.instances = instances
        self.direct = config.strategy is Strategy.DIRECT
        if self.direct:
            slots = [(row, inst) for inst in range(instances) for row in range(self.rows)]
        else:
            count = config.max_candidate_sequences or self.rows * instances
            slots = [(row, -1) for row in range(count)]
        # Free slots as (row, instance): the lowest rows first, spread over instances, so batches stay dense
        # and sequences run in parallel on every instance.
        self._free: list[tuple[int, int]] = slots
        heapq.heapify(self._free)
        self.active: dict[CorrId, Sequence] = {}  # every live sequence, slotted or backlogged
        self.slotted: dict[tuple[int, int], Sequence] = {}  # by (instance, row)
        self.backlog: OrderedDict[Sequence, None] = OrderedDict()  # oldest first; O(1) removal anywhere
        self._backlog_by_owner: dict[str, int] = {}  # backlogged sequences per API key (owner "" not counted)
        self.queued = 0  # requests waiting, in slots and backlog
        self.started = self.ended = self.idle_released = 0

    # ------------------------------------------------------------------ requests in

    def submit(self, corrid: CorrId, start: bool, end: bool, item: Any, now_ns: int,
               owner: str = "") -> Entry:
        """Queue one request; raises INVALID_ARG for one that cannot belong to a live sequence, and
        RESOURCE_EXHAUSTED for a START that would wait in a full backlog (nothing is queued then). `owner` is
        the API key that sent it ("" on a server without keys)."""
        if corrid == 0 or corrid == "":
            raise invalid(f"inference request to model '{self.model}' must specify a non-zero or non-empty "
                          "correlation ID")
        seq = self.active.get(corrid)
        if seq is None or (seq.ending and not start):
            if not start:
                raise invalid(f"inference request for sequence {corrid} to model '{self.model}' must specify "
                              "the START flag on the first request of the sequence")
            if seq is None:
                seq = self._new(corrid, now_ns, owner)
        elif (bound := self.limits.max_queued_per_sequence) and len(seq.queue) >= bound:
            raise EngineError(ErrorCode.RESOURCE_EXHAUSTED,
                              f"sequence {corrid} of model '{self.model}' already has {len(seq.queue)} "
                              "requests waiting (--max-sequence-queue); send the next once one is answered")
        elif start and not seq.ending:
            log.warning("sequence %s for model '%s' has a conflict: the previous sequence did not end before "
                        "this sequence start", corrid, self.model)
        if start:
            self.started += 1
        seq.ending = end
        seq.last_active_ns = max(seq.last_active_ns, now_ns)
        entry = Entry(seq, item, start, end, now_ns)
        seq.queue.append(entry)
        self.queued += 1
        return entry

    def _new(self, corrid: CorrId, now_ns: int, owner: str) -> Sequence:
        if not self._free:
            self._check_backlog(corrid, owner)
        seq = Sequence(corrid, owner, last_active_ns=now_ns)
        self.active[corrid] = seq
        if self._free:
            self._assign(seq)
        else:
            self.backlog[seq] = None
            if owner:
                self._backlog_by_owner[owner] = self._backlog_by_owner.get(owner, 0) + 1
        return seq

    def _check_backlog(self, corrid: CorrId, owner: str) -> None:
        """Raise RESOURCE_EXHAUSTED if a new sequence of `owner` may not wait for a slot now."""
        limits = self.limits
        full = f"sequence {corrid} cannot start: every slot of model '{self.model}' is taken and"
        waiting = len(self.backlog)
        if limits.max_sequences and waiting >= limits.max_sequences:
            raise EngineError(ErrorCode.RESOURCE_EXHAUSTED,
                              f"{full} {waiting} sequences already wait for one (--max-sequence-backlog); "
                              "retry later")
        held = self._backlog_by_owner.get(owner, 0) if owner else 0
        if owner and limits.max_per_key and held >= limits.max_per_key:
            raise EngineError(ErrorCode.RESOURCE_EXHAUSTED,
                              f"{full} this API key already has {held} sequences waiting for one "
                              "(--max-sequence-backlog-per-key); end some, or retry later")

    def _leave_backlog(self, seq: Sequence) -> None:
        owner = seq.owner
        if owner:
            held = self._backlog_by_owner[owner] - 1
            if held:
                self._backlog_by_owner[owner] = held
            else:
                del self._backlog_by_owner[owner]

    def _assign(self, seq: Sequence) -> None:
        row, inst = heapq.heappop(self._free)
        seq.slot = (inst, row)
        self.slotted[seq.slot] = seq

    def _release(self, seq: Sequence) -> None:
        """The sequence leaves: its slot goes to the oldest backlogged sequence, or back to the free list."""
        seq.released = True
        if self.active.get(seq.corrid) is seq:
            del self.active[seq.corrid]
        slot = seq.slot
        if slot is None:
            if self.backlog.pop(seq, 0) is None:  # it was waiting (not released twice)
                self._leave_backlog(seq)
            return
        seq.slot = None
        del self.slotted[slot]
        if self.backlog:
            nxt, _ = self.backlog.popitem(last=False)
            self._leave_backlog(nxt)
            nxt.slot = slot
            self.slotted[slot] = nxt
        else:
            heapq.heappush(self._free, (slot[1], slot[0]))

    # ------------------------------------------------------------------ batches out

    def next_batch(self, now_ns: int, acquire: Callable[[int], bool]) -> tuple[Batch | None, int | None]:
        """The batch to run now (taken out of the queues), or None and how many ns to wait before one could
        be due (None: only an arrival or a finished run can help). `acquire(instance)` is called once a batch
        is due, with the instance it must run on (-1: any); it takes an instance and says whether it could."""
        if self.direct:
            return self._next_direct(now_ns, acquire)
        return self._next_oldest(now_ns, acquire)

    def _ready(self, seq: Sequence) -> bool:
        return not seq.running and bool(seq.queue)

    def _next_direct(self, now_ns: int, acquire: Callable[[int], bool]) -> tuple[Batch | None, int | None]:
        wait: int | None = None
        by_instance: dict[int, list[tuple[int, Sequence]]] = {}
        for (inst, row), seq in self.slotted.items():
            if self._ready(seq):
                by_instance.setdefault(inst, []).append((row, seq))
        util = self.config.minimum_slot_utilization
        for inst, ready in sorted(by_instance.items()):
            if util > 0 and self.delay_ns and len(ready) < util * self.rows:
                oldest = min(s.queue[0].arrival_ns for _, s in ready)
                left = oldest + self.delay_ns - now_ns
                if left > 0:
                    wait = left if wait is None else min(wait, left)
                    continue
            if not acquire(inst):
                continue
            rows: list[Entry | None] = [None] * (max(row for row, _ in ready) + 1)
            for row, seq in ready:
                rows[row] = self._take(seq)
            return Batch(inst, rows), None
        return None, wait

    def _next_oldest(self, now_ns: int, acquire: Callable[[int], bool]) -> tuple[Batch | None, int | None]:
        ready = [s for s in self.slotted.values() if self._ready(s)]
        if not ready:
            return None, None
        ready.sort(key=lambda s: s.queue[0].arrival_ns)
        chosen = ready[:self.rows]
        preferred = self.config.preferred_batch_sizes
        full = len(chosen) == self.rows or len(chosen) in preferred or \
            bool(preferred and len(chosen) >= max(preferred))
        if not full and self.delay_ns:
            left = chosen[0].queue[0].arrival_ns + self.delay_ns - now_ns
            if left > 0:
                return None, left
        if not acquire(-1):
            return None, None
        return Batch(-1, [self._take(s) for s in chosen]), None

    def _take(self, seq: Sequence) -> Entry:
        entry = seq.queue.popleft()
        self.queued -= 1
        seq.running = True
        if entry.end and not seq.queue:
            self.ended += 1
            self._release(seq)  # the slot serves the next batch; this run still has its state
        return entry

    def finished(self, batch: Batch, now_ns: int) -> None:
        """A batch was answered: its sequences may run their next request."""
        for entry in batch.rows:
            if entry is not None:
                seq = entry.sequence
                seq.running = False
                seq.last_active_ns = max(seq.last_active_ns, now_ns)

    def cancel(self, entry: Entry) -> list[Entry]:
        """A client gave up on `entry`: the sequence cannot go on without it, so it is released now, and its
        other queued requests are returned for the driver to fail. A running entry's sequence is released
        the same way (its state is dropped when the run comes back)."""
        seq = entry.sequence
        if seq.released:
            return []
        if entry in seq.queue:
            seq.queue.remove(entry)
            self.queued -= 1
        rest = list(seq.queue)
        seq.queue.clear()
        self.queued -= len(rest)
        self._release(seq)
        return rest

    # ------------------------------------------------------------------ idleness

    def expire_idle(self, now_ns: int) -> list[Sequence]:
        """Release every slotted sequence idle for max_sequence_idle_us (nothing queued or running)."""
        idle = [s for s in self.slotted.values()
                if not s.running and not s.queue and now_ns - s.last_active_ns >= self.idle_ns]
        for seq in idle:
            self.idle_released += 1
            self._release(seq)
        return idle

    def next_idle_ns(self) -> int | None:
        """When the next slotted sequence would become idle, in ns on the callers' clock; None if none can."""
        times = [s.last_active_ns + self.idle_ns for s in self.slotted.values()
                 if not s.running and not s.queue]
        return min(times) if times else None

    def __len__(self) -> int:
        return self.queued
