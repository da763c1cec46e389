"""engine/heap.py: what a serving process's collector looks like once its models are loaded."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from engine import heap


@pytest.fixture
def restored_collector() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_settle_freezes_what_is_loaded_and_collects_the_young_less_often(restored_collector: None) -> None:
    loaded = [{"config": i} for i in range(100)]  # stands for what a model load leaves behind
    older, oldest = gc.get_threshold()[1:]
    heap.settle_after_load()
    assert gc.get_freeze_count() >= len(loaded)
    assert gc.get_threshold() == (heap.YOUNG_THRESHOLD, older, oldest)


def test_cycles_are_still_collected_after_settling(restored_collector: None) -> None:
    heap.settle_after_load()

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # type: ignore[attr-defined]
    del a, b
    assert gc.collect() >= 2


def test_what_an_unloaded_version_left_in_a_cycle_is_collected_though_it_was_frozen(
        restored_collector: None) -> None:
    class Batcher:  # stands for a version's batcher and its pool, which refer to each other
        pass

    batcher, pool = Batcher(), Batcher()
    batcher.pool, pool.on_release = pool, batcher  # type: ignore[attr-defined]
    alive = weakref.ref(batcher)
    heap.settle_after_load()  # the version was loaded when the server started
    del batcher, pool  # unloaded
    gc.collect()
    assert alive() is not None  # frozen: no collection reaches it
    heap.collect_retired()
    assert alive() is None
    assert gc.get_freeze_count() > 0  # what is still alive is frozen again
