"""SequencePolicy (engine/scheduling/sequence/policy.py): slots, backlog, idle release, batch rows. Pure: time
is passed in, instances are acquired through a plain function."""

from __future__ import annotations

import time

import pytest

from engine.config.sequence import SequenceBatchingConfig, Strategy
from engine.errors import EngineError, ErrorCode
from engine.scheduling.sequence.policy import BacklogLimits, SequencePolicy

MS = 1_000_000


def policy(strategy: Strategy = Strategy.DIRECT, instances: int = 1, max_batch: int = 2, idle_ms: int = 100,
           **kw: object) -> SequencePolicy:
    config = SequenceBatchingConfig(strategy, max_sequence_idle_us=idle_ms * 1000, **kw)  # type: ignore[arg-type]
    return SequencePolicy("m", config, instances, max_batch)


def always(_: int) -> bool:
    return True


def items(batch):  # the items of a batch's rows, None for fillers
    return [None if e is None else e.item for e in batch.rows]


def test_requests_need_a_correlation_id_and_a_start():
    p = policy()
    with pytest.raises(EngineError, match="must specify a non-zero or non-empty correlation ID") as e:
        p.submit(0, True, False, "a", 0)
    assert e.value.code is ErrorCode.INVALID_ARG
    with pytest.raises(EngineError, match="must specify a non-zero or non-empty correlation ID"):
        p.submit("", True, False, "a", 0)
    with pytest.raises(EngineError, match="inference request for sequence 7 to model 'm' must specify the "
                                          "START flag on the first request of the sequence"):
        p.submit(7, False, False, "a", 0)


def test_direct_pins_each_sequence_to_a_row_and_fills_gaps():
    p = policy(max_batch=3)
    for corrid in (1, 2, 3):
        p.submit(corrid, True, False, f"s{corrid}", 0)
    batch, _ = p.next_batch(0, always)
    assert batch.instance == 0 and items(batch) == ["s1", "s2", "s3"]
    p.finished(batch, 0)
    p.submit(3, False, False, "s3b", 1)  # only row 2 has work: rows 0 and 1 are fillers
    batch, _ = p.next_batch(1, always)
    assert items(batch) == [None, None, "s3b"]


def test_one_request_per_sequence_per_batch_and_none_while_running():
    p = policy(Strategy.OLDEST, instances=2, max_batch=4)
    p.submit(1, True, False, "a1", 0)
    p.submit(1, False, False, "a2", 1)
    batch, _ = p.next_batch(2, always)
    assert items(batch) == ["a1"]
    assert p.next_batch(2, always) == (None, None)  # a2 waits for a1's state, though an instance is free
    p.finished(batch, 3)
    batch, _ = p.next_batch(3, always)
    assert items(batch) == ["a2"]


def test_direct_spreads_sequences_over_instances():
    p = policy(instances=2, max_batch=2)
    p.submit(1, True, False, "a", 0)
    p.submit(2, True, False, "b", 0)
    first, _ = p.next_batch(0, always)
    second, _ = p.next_batch(0, always)
    assert {first.instance, second.instance} == {0, 1}
    assert items(first) == ["a"] and items(second) == ["b"]


def test_backlog_waits_for_a_slot_and_gets_it_when_a_sequence_ends():
    p = policy(max_batch=1)
    p.submit(1, True, False, "a1", 0)
    p.submit(2, True, False, "b1", 0)
    p.submit(2, False, True, "b2", 0)  # a backlogged sequence may go on queueing
    assert len(p.backlog) == 1
    batch, _ = p.next_batch(0, always)
    assert items(batch) == ["a1"]
    p.finished(batch, 1)
    assert p.next_batch(1, always) == (None, None)  # b has no slot yet
    p.submit(1, False, True, "a2", 2)
    batch, _ = p.next_batch(2, always)
    assert items(batch) == ["a2"] and not p.backlog  # a ended as a2 left the queue: b took the slot
    p.finished(batch, 3)
    batch, _ = p.next_batch(3, always)
    assert items(batch) == ["b1"]


def test_ended_sequence_needs_a_new_start():
    p = policy()
    p.submit(5, True, True, "only", 0)
    batch, _ = p.next_batch(0, always)
    p.finished(batch, 1)
    with pytest.raises(EngineError, match="sequence 5 .* must specify the START flag"):
        p.submit(5, False, False, "late", 2)
    p.submit(5, True, False, "again", 3)  # a new sequence of the same id is fine
    assert p.started == 2 and p.ended == 1


def test_request_after_a_queued_end_is_refused_but_a_new_start_queues_behind_it():
    p = policy()
    p.submit(5, True, False, "a", 0)
    p.submit(5, False, True, "end", 0)
    with pytest.raises(EngineError, match="START flag"):
        p.submit(5, False, False, "after", 0)
    p.submit(5, True, False, "restart", 0)
    for expected in ("a", "end", "restart"):
        batch, _ = p.next_batch(0, always)
        assert items(batch) == [expected]
        p.finished(batch, 0)
    assert len(p.slotted) == 1  # the restarted sequence kept the slot


def test_start_for_an_active_sequence_restarts_it_in_its_slot():
    p = policy(max_batch=2)
    p.submit(1, True, False, "x", 0)
    p.submit(2, True, False, "y", 0)
    batch, _ = p.next_batch(0, always)
    p.finished(batch, 0)
    p.submit(2, True, False, "y-again", 1)
    batch, _ = p.next_batch(1, always)
    assert items(batch) == [None, "y-again"] and batch.rows[1].start


def test_idle_sequence_is_released_and_its_slot_reused():
    p = policy(max_batch=1, idle_ms=10)
    p.submit(1, True, False, "a", 0)
    p.submit(2, True, False, "b", 0)  # backlogged: not subject to idle release
    batch, _ = p.next_batch(0, always)
    p.finished(batch, 1 * MS)
    assert p.expire_idle(10 * MS) == []  # counted from the later of arrival and end of run
    assert p.next_idle_ns() == 11 * MS
    released = p.expire_idle(11 * MS)
    assert [s.corrid for s in released] == [1] and p.idle_released == 1
    assert [s.corrid for s in p.slotted.values()] == [2]
    with pytest.raises(EngineError, match="sequence 1 .* START flag"):
        p.submit(1, False, False, "late", 12 * MS)


def test_a_sequence_with_work_is_never_idle():
    p = policy(max_batch=1, idle_ms=10)
    p.submit(1, True, False, "a", 0)
    batch, _ = p.next_batch(0, always)
    assert p.expire_idle(100 * MS) == [] and p.next_idle_ns() is None  # running


def test_cancel_releases_the_sequence_and_returns_its_other_requests():
    p = policy(max_batch=1)
    first = p.submit(1, True, False, "a1", 0)
    p.submit(1, False, False, "a2", 0)
    p.submit(2, True, False, "b1", 0)  # backlogged behind sequence 1
    rest = p.cancel(first)
    assert [e.item for e in rest] == ["a2"] and len(p) == 1
    batch, _ = p.next_batch(0, always)
    assert items(batch) == ["b1"]
    assert p.cancel(first) == []  # cancelling twice is harmless


def test_cancel_of_a_running_request_releases_the_slot_for_the_next_batch():
    p = policy(max_batch=1)
    running = p.submit(1, True, False, "a1", 0)
    batch, _ = p.next_batch(0, always)
    p.cancel(running)
    p.finished(batch, 1)
    assert not p.slotted and not p.active
    p.submit(9, True, False, "z", 2)
    assert list(p.slotted.values())[0].corrid == 9


def test_oldest_batches_the_oldest_heads_up_to_max_batch_size():
    p = policy(Strategy.OLDEST, max_batch=2, max_candidate_sequences=3)
    for corrid, t in ((1, 30), (2, 10), (3, 20)):
        p.submit(corrid, True, False, corrid, t)
    batch, _ = p.next_batch(40, always)
    assert batch.instance == -1 and items(batch) == [2, 3]
    p.submit(4, True, False, 4, 41)  # three candidates hold slots: the fourth waits
    assert [s.corrid for s in p.backlog] == [4]


def test_oldest_waits_for_a_preferred_size_up_to_the_delay():
    p = policy(Strategy.OLDEST, max_batch=4, max_candidate_sequences=4, max_queue_delay_us=1000,
               preferred_batch_sizes=(2,))
    p.submit(1, True, False, "a", 0)
    batch, wait = p.next_batch(100_000, always)
    assert batch is None and wait == 900_000
    p.submit(2, True, False, "b", 200_000)
    batch, _ = p.next_batch(200_000, always)
    assert items(batch) == ["a", "b"]  # preferred size reached before the delay
    p.finished(batch, 0)
    p.submit(1, False, False, "a2", 300_000)
    batch, _ = p.next_batch(1_300_000, always)
    assert items(batch) == ["a2"]  # the delay passed


def test_no_instance_means_no_batch_and_nothing_taken():
    p = policy()
    p.submit(1, True, False, "a", 0)
    assert p.next_batch(0, lambda _: False) == (None, None)
    assert len(p) == 1
    batch, _ = p.next_batch(0, always)
    assert items(batch) == ["a"]


def bounded(max_sequences: int, max_per_key: int, slots: int = 1) -> SequencePolicy:
    config = SequenceBatchingConfig(Strategy.DIRECT, max_sequence_idle_us=100_000)
    return SequencePolicy("m", config, 1, slots, BacklogLimits(max_sequences, max_per_key))


def test_a_start_past_the_backlog_bound_is_refused_and_queues_nothing():
    p = bounded(max_sequences=2, max_per_key=0)
    for corrid in (1, 2, 3):  # 1 takes the slot, 2 and 3 wait
        p.submit(corrid, True, False, corrid, 0)
    with pytest.raises(EngineError, match=r"sequence 4 cannot start: every slot of model 'm' is taken and 2 "
                                          r"sequences already wait for one \(--max-sequence-backlog\)") as e:
        p.submit(4, True, False, 4, 0)
    assert e.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert len(p) == 3 and 4 not in p.active and p.started == 3
    p.submit(2, False, False, "2b", 0)  # a waiting sequence may go on queueing
    p.submit(1, True, False, "1-again", 0)  # and a START of a live sequence needs no room in the backlog
    p.cancel(p.submit(3, False, False, "3b", 0))  # 3 leaves the backlog: room for 4
    p.submit(4, True, False, 4, 0)
    assert [s.corrid for s in p.backlog] == [2, 4]


def test_a_sequence_may_queue_only_so_many_requests_and_goes_on_after_a_refusal():
    config = SequenceBatchingConfig(Strategy.DIRECT, max_sequence_idle_us=100_000)
    p = SequencePolicy("m", config, 1, 1, BacklogLimits(0, 0, max_queued_per_sequence=3))
    first = p.submit(7, True, False, "s0", 0)
    p.submit(7, False, False, "s1", 0)
    p.submit(7, False, False, "s2", 0)
    with pytest.raises(EngineError, match=r"sequence 7 of model 'm' already has 3 requests waiting "
                                          r"\(--max-sequence-queue\)") as e:
        p.submit(7, False, False, "s3", 0)
    assert e.value.code is ErrorCode.RESOURCE_EXHAUSTED and p.queued == 3
    p.submit(8, True, False, "other", 0)  # another sequence is not held back
    batch, _ = p.next_batch(0, always)
    assert batch is not None and [r.item for r in batch.rows if r is not None] == ["s0"]
    p.finished(batch, 0)
    assert first.sequence.queue[0].item == "s1"
    p.submit(7, False, True, "s3", 0)  # room again: the sequence goes on


def test_each_api_key_has_its_share_of_the_backlog_and_no_key_has_none():
    p = bounded(max_sequences=10, max_per_key=2)
    p.submit(1, True, False, "slot", 0, owner="keys[0]")
    p.submit(2, True, False, "a", 0, owner="keys[0]")
    p.submit(3, True, False, "a", 0, owner="keys[0]")
    with pytest.raises(EngineError, match=r"this API key already has 2 sequences waiting for one "
                                          r"\(--max-sequence-backlog-per-key\)"):
        p.submit(4, True, False, "a", 0, owner="keys[0]")
    p.submit(5, True, False, "b", 0, owner="keys[1]")  # another key is not held back
    for corrid in (6, 7, 8):
        p.submit(corrid, True, False, "keyless", 0)  # a server without keys: only the total counts
    assert len(p.backlog) == 6
    first = next(iter(p.backlog))
    assert first.corrid == 2
    p.cancel(first.queue[0])  # a key's sequence leaving the backlog gives its share back
    p.submit(4, True, False, "a", 0, owner="keys[0]")


def test_the_slot_goes_to_the_oldest_waiting_sequence_after_removals_in_between():
    p = bounded(max_sequences=0, max_per_key=0)
    entries = {corrid: p.submit(corrid, True, False, corrid, 0) for corrid in range(1, 7)}
    p.cancel(entries[3])
    p.cancel(entries[2])
    p.cancel(entries[1])  # the slot's sequence: the oldest waiting one, 4, gets the slot
    assert [s.corrid for s in p.slotted.values()] == [4]
    assert [s.corrid for s in p.backlog] == [5, 6]


def test_dropping_a_large_backlog_costs_time_linear_in_it():
    """A stream that closes with 20,000 sequences waiting cancels each of them: with removal from the middle
    of a list (as before) that took ~8 s here; with the ordered dict, milliseconds."""
    p = bounded(max_sequences=0, max_per_key=0)
    entries = [p.submit(corrid, True, False, corrid, 0) for corrid in range(1, 20_001)]
    start = time.perf_counter()
    for entry in reversed(entries):  # the newest first: each is at the far end of the backlog
        p.cancel(entry)
    assert time.perf_counter() - start < 1.0
    assert not p.backlog and not p.active and len(p) == 0
