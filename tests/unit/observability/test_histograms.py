"""The latency histogram's batch entry point: a batch's queue waits observed in one call must leave the same
state as observing each wait on its own (the batcher uses the one, the sequence batcher and ensembles the
other, and both feed one exported family)."""

from __future__ import annotations

from engine.observability.histograms import Histogram
from engine.observability.stats import ModelStats

BUCKETS_US = (50.0, 100.0, 500.0)
WAITS_NS = [0, 49_999, 50_000, 50_001, 100_000, 499_999, 500_000, 10_000_000]  # on, beside and past bounds


def test_observe_each_counts_as_observe_does() -> None:
    one_by_one, batched = Histogram(BUCKETS_US, 1000), Histogram(BUCKETS_US, 1000)
    for wait in WAITS_NS:
        one_by_one.observe(wait)
    batched.observe_each(WAITS_NS)
    assert batched.counts == one_by_one.counts == [3, 2, 2, 1]  # a bound counts in its own bucket (le)
    assert (batched.count, batched.sum) == (one_by_one.count, one_by_one.sum) == (8, sum(WAITS_NS))


def test_a_batch_of_queue_waits_is_accounted_as_each_wait() -> None:
    one_by_one, batched = ModelStats(), ModelStats()
    for wait in WAITS_NS:
        one_by_one.record_queue(wait)
    batched.record_queue_waits(WAITS_NS)
    assert (batched.queue.count, batched.queue.ns) == (one_by_one.queue.count, one_by_one.queue.ns) == (
        8, sum(WAITS_NS))
    assert batched.histograms is not None and one_by_one.histograms is not None
    assert batched.histograms.queue.counts == one_by_one.histograms.queue.counts
