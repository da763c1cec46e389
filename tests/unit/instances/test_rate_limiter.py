"""Tests of engine/instances/rate_limiter.py's `RateLimiter`: its arithmetic and whom it tells of a release.
Plain synchronous tests; the pools that listen to it are exercised in test_batcher.py."""

from __future__ import annotations

from collections.abc import Callable

from engine.config.model_config import RateLimiterResource
from engine.instances.rate_limiter import RateLimiter

R1 = (RateLimiterResource("R", 1),)
R2 = (RateLimiterResource("R", 2),)


def test_unlimited_limiter_always_admits() -> None:
    limiter = RateLimiter()
    assert all(limiter.try_acquire(()) for _ in range(100))


def test_max_concurrent_executions() -> None:
    limiter = RateLimiter(max_concurrent_executions=2)
    assert limiter.try_acquire(())
    assert limiter.try_acquire(())
    assert not limiter.try_acquire(())
    limiter.release(())
    assert limiter.try_acquire(())
    assert not limiter.try_acquire(())


def test_explicit_resource_counts_are_respected() -> None:
    limiter = RateLimiter(resources={"R": 3})
    limiter.register(R2)  # an explicit count is never resized
    assert limiter.try_acquire(R2)
    assert not limiter.try_acquire(R2)  # 1 left
    assert limiter.try_acquire(R1)
    assert not limiter.try_acquire(R1)
    limiter.release(R2)
    assert limiter.try_acquire(R2)
    assert not limiter.try_acquire(R1)


def test_a_refused_acquire_takes_nothing() -> None:
    limiter = RateLimiter(resources={"R": 1, "S": 1})
    both = (RateLimiterResource("R", 1), RateLimiterResource("S", 1))
    assert limiter.try_acquire((RateLimiterResource("S", 1),))
    assert not limiter.try_acquire(both)  # S is taken; R must not have been taken either
    assert limiter.try_acquire(R1)


def test_unknown_resources_are_sized_to_the_largest_single_need() -> None:
    limiter = RateLimiter()
    assert not limiter.try_acquire(R1)  # never registered: none of it exists
    limiter.register(R1)
    limiter.register(R2)
    limiter.register(R1)
    assert limiter.try_acquire(R2)
    assert not limiter.try_acquire(R1)
    limiter.release(R2)
    assert limiter.try_acquire(R1)
    assert limiter.try_acquire(R1)
    assert not limiter.try_acquire(R1)


def test_registering_while_a_resource_is_held_does_not_create_more_of_it() -> None:
    limiter = RateLimiter()
    limiter.register(R2)
    assert limiter.try_acquire(R2)  # all of R is in use
    limiter.register(R1)  # another model loads meanwhile
    assert not limiter.try_acquire(R1)
    limiter.release(R2)
    assert limiter.try_acquire(R2)
    assert not limiter.try_acquire(R1)  # still exactly 2 units in all


def test_release_calls_every_listener_until_removed() -> None:
    limiter = RateLimiter()
    calls: list[str] = []

    def first() -> None:
        calls.append("first")

    def second() -> None:
        calls.append("second")

    limiter.add_listener(first)
    limiter.add_listener(second)
    assert limiter.try_acquire(())
    limiter.release(())
    assert sorted(calls) == ["first", "second"]
    limiter.remove_listener(first)
    limiter.remove_listener(first)  # removing twice is harmless
    calls.clear()
    assert limiter.try_acquire(())
    limiter.release(())
    assert calls == ["second"]


def test_release_offers_capacity_to_each_listener_first_in_turn() -> None:
    limiter = RateLimiter(max_concurrent_executions=1)
    first_called: list[str] = []
    calls: list[str] = []

    def listener(tag: str) -> Callable[[], None]:
        def called() -> None:
            calls.append(tag)
        return called

    for tag in ("a", "b", "c"):
        limiter.add_listener(listener(tag))
    for _ in range(6):
        assert limiter.try_acquire(())
        calls.clear()
        limiter.release(())
        assert sorted(calls) == ["a", "b", "c"]  # everyone hears of every release
        first_called.append(calls[0])
    assert first_called == ["a", "b", "c", "a", "b", "c"]  # so no busy model keeps the slot to itself


def test_a_resource_has_copies_per_device() -> None:
    """Triton's rule: two instances on GPUs 0 and 1 needing R each take from their own device's copies."""
    limiter = RateLimiter()
    limiter.register(R2, device=0)
    limiter.register(R2, device=1)
    assert limiter.try_acquire(R2, device=0)
    assert not limiter.try_acquire(R1, device=0)  # device 0's two copies are taken
    assert limiter.try_acquire(R2, device=1)  # device 1's are its own
    limiter.release(R2, device=0)
    assert limiter.free("R", 0) == 2 and limiter.free("R", 1) == 0


def test_a_global_resource_has_one_set_of_copies_for_every_device() -> None:
    shared = (RateLimiterResource("G", 1, global_=True),)
    limiter = RateLimiter()
    limiter.register(shared, device=0)
    limiter.register(shared, device=1)
    assert limiter.try_acquire(shared, device=0)
    assert not limiter.try_acquire(shared, device=1)
    limiter.release(shared, device=0)
    assert limiter.try_acquire(shared, device=1)


def test_command_line_counts_apply_to_every_device_or_to_one() -> None:
    """--rate-limit-resource R:3 --rate-limit-resource R:1:1: three copies on each device but GPU 1, which
    has one; the global set of a global resource gets the every-device count."""
    limiter = RateLimiter(resources={"R": 3, "G": 2}, device_resources={("R", 1): 1})
    shared = (RateLimiterResource("G", 1, global_=True),)
    for device in (0, 1, 2):
        limiter.register(R1 + shared, device)
    assert [limiter.free("R", d) for d in (0, 1, 2)] == [3, 1, 3] and limiter.free("G") == 2
    assert limiter.try_acquire(R1, device=1)
    assert not limiter.try_acquire(R1, device=1)
    assert limiter.try_acquire(R2, device=2)
