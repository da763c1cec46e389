"""Tests of engine/scheduling/batching/batcher.py's `Batcher` with engine/instances/pool.py's `InstancePool`,
through real `Model`s running the identity backend (OUTPUTn = INPUTn) on real instance threads.

Each test is a plain function around `asyncio.run`. Nothing here sleeps in place of synchronization: tests
wait on conditions with a bound (`until`), and concurrency is read from public state: requests accepted
(`batcher.pending_count`) minus requests still queued (`len(batcher.policy)`) are the ones executing.
Backend delays only make an instance stay busy; assertions are about order and counts, never about time.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from engine.config import steps as cfg
from engine.config.model_config import ModelConfig
from engine.errors import EngineError, ErrorCode
from engine.instances.rate_limiter import RateLimiter
from engine.model import InstanceModel
from engine.proto import model_config_pb2 as pb
from engine.types import DataType, InferenceRequest, InferenceResponse, RequestedOutput, Tensor

T = TypeVar("T")
BOUND_S = 10.0  # a safety net against hangs, far above anything a passing test needs


# --------------------------------------------------------------------------------------------- helpers

def model_config(body: str, name: str = "ident", inputs: int = 1, dims: str = "[-1]",
                 max_batch_size: int = 8, **parameters: object) -> ModelConfig:
    """An identity-backend config: `inputs` INT32 inputs and as many outputs, plus `body` (pbtxt)."""
    io = "".join(f'input {{ name: "INPUT{i}" data_type: TYPE_INT32 dims: {dims} }}\n'
                 f'output {{ name: "OUTPUT{i}" data_type: TYPE_INT32 dims: {dims} }}\n'
                 for i in range(inputs))
    params = "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
                     for k, v in parameters.items())
    text = f'backend: "identity"\nmax_batch_size: {max_batch_size}\n{io}{params}{body}'
    msg = pb.ModelConfig()
    cfg.parse_pbtxt(text, msg)
    cfg.autocomplete(msg, None, name)
    return cfg.validate(msg, f"{name}/config.pbtxt")


async def started(config: ModelConfig, limiter: RateLimiter | None = None) -> InstanceModel:
    model = InstanceModel(config, 1, Path("unused"), (), limiter or RateLimiter())
    await model.start()
    return model


def request(model: InstanceModel, *arrays: np.ndarray, id: str = "", outputs: list[str] | None = None,
            **parameters: Any) -> InferenceRequest:
    tensors = [Tensor(f"INPUT{i}", DataType.INT32, a.shape, a) for i, a in enumerate(arrays)]
    wanted = [RequestedOutput(n) for n in outputs] if outputs is not None else None
    return InferenceRequest(model.name, "", tensors, id=id, outputs=wanted, parameters=parameters)


def data(value: int, shape: tuple[int, ...] = (1, 3)) -> np.ndarray:
    return np.full(shape, value, dtype=np.int32)


def output(response: InferenceResponse, name: str = "OUTPUT0") -> np.ndarray:
    for tensor in response.outputs:
        if tensor.name == name:
            return tensor.data
    raise AssertionError(f"response has no output {name!r}")


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait until `condition()` holds, checking at every turn of the loop, for at most BOUND_S."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BOUND_S
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"not within {BOUND_S}s: {what}")
        await asyncio.sleep(0.001)


async def bounded(awaitable: Awaitable[T]) -> T:
    return await asyncio.wait_for(awaitable, BOUND_S)


def executing(model: InstanceModel) -> int:
    """Requests taken from the queue and not yet answered."""
    return model.batcher.pending_count - len(model.batcher.policy)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


# --------------------------------------------------------------------------------------------- batching

def test_concurrent_requests_form_real_batches_and_each_gets_its_own_data() -> None:
    async def main() -> None:
        model = await started(model_config("dynamic_batching { }", execute_delay_ms=20))
        try:
            n = 24
            responses = await bounded(asyncio.gather(
                *(model.infer(request(model, data(i), id=f"r{i}")) for i in range(n))))
            for i, response in enumerate(responses):
                assert response.id == f"r{i}"
                np.testing.assert_array_equal(output(response), data(i))
            assert model.stats.inference_count == n
            assert model.stats.execution_count < n  # requests really shared executions
            assert max(model.stats.batches) > 1
            assert model.batcher.pending_count == 0
        finally:
            await model.stop()

    run(main)


def test_requests_of_batch_size_above_one_merge_and_split_back_exactly() -> None:
    async def main() -> None:
        # A window far longer than the test: only a full batch (1 + 3 + 2 = 6) can be sent.
        config = model_config("dynamic_batching { max_queue_delay_microseconds: 100000000 }",
                              inputs=2, dims="[2]", max_batch_size=6)
        model = await started(config)
        try:
            rng = np.random.default_rng(7)
            sizes = (1, 3, 2)
            inputs = [(rng.integers(-1000, 1000, (s, 2), dtype=np.int32),
                       rng.integers(-1000, 1000, (s, 2), dtype=np.int32)) for s in sizes]
            requests = [request(model, a, b, id=str(i)) for i, (a, b) in enumerate(inputs)]
            requests[1] = request(model, *inputs[1], id="1", outputs=["OUTPUT1"])
            responses = await bounded(asyncio.gather(*(model.infer(r) for r in requests)))

            assert model.stats.execution_count == 1
            assert model.stats.inference_count == 6
            assert list(model.stats.batches) == [6]
            for (a, b), response in zip(inputs, responses, strict=True):
                if response.id == "1":
                    assert [t.name for t in response.outputs] == ["OUTPUT1"]
                else:
                    np.testing.assert_array_equal(output(response, "OUTPUT0"), a)
                    assert output(response, "OUTPUT0").shape == a.shape
                np.testing.assert_array_equal(output(response, "OUTPUT1"), b)
                for tensor in response.outputs:
                    assert tuple(tensor.shape) == tensor.data.shape
        finally:
            await model.stop()

    run(main)


def test_a_backend_failure_fails_only_that_batch() -> None:
    async def main() -> None:
        model = await started(model_config("dynamic_batching { }", execute_delay_ms=100, fail_on_value=13))
        try:
            first = asyncio.ensure_future(model.infer(request(model, data(1), id="first")))
            await until(lambda: executing(model) == 1, "the first request executing alone")
            # Queued behind it: "bad" and "mate" share a batch; "other" has another shape, so its own batch.
            rest = [request(model, data(13), id="bad"), request(model, data(2), id="mate"),
                    request(model, data(4, (1, 5)), id="other")]
            results = await bounded(asyncio.gather(*(model.infer(r) for r in rest), return_exceptions=True))
            bad, mate, other = results
            for failed in (bad, mate):
                assert isinstance(failed, EngineError)
                assert failed.code is ErrorCode.INTERNAL
                assert "input contains 13" in failed.message
            assert isinstance(other, InferenceResponse)
            np.testing.assert_array_equal(output(other), data(4, (1, 5)))
            np.testing.assert_array_equal(output(await bounded(first)), data(1))

            after = await bounded(model.infer(request(model, data(3))))  # the instance survived the failure
            np.testing.assert_array_equal(output(after), data(3))
            assert model.batcher.pending_count == 0
        finally:
            await model.stop()

    run(main)


# --------------------------------------------------------------------------------------------- queue policy

def test_a_full_queue_rejects_at_once() -> None:
    async def main() -> None:
        config = model_config("dynamic_batching { default_queue_policy { max_queue_size: 1 } }",
                              execute_delay_ms=200)
        model = await started(config)
        try:
            running = asyncio.ensure_future(model.infer(request(model, data(0))))
            await until(lambda: executing(model) == 1, "the first request executing")
            queued = asyncio.ensure_future(model.infer(request(model, data(1))))
            await until(lambda: len(model.batcher.policy) == 1, "the second request queued")
            with pytest.raises(EngineError) as info:
                await bounded(model.infer(request(model, data(2))))
            assert info.value.code is ErrorCode.RESOURCE_EXHAUSTED
            assert "'ident'" in info.value.message
            assert not running.done()  # rejected while the instance was still busy: not after waiting
            await bounded(asyncio.gather(running, queued))
            assert model.stats.inference_count == 2
            assert model.batcher.pending_count == 0
        finally:
            await model.stop()

    run(main)


def test_a_queue_timeout_fires_while_the_only_instance_is_busy() -> None:
    async def main() -> None:
        body = "dynamic_batching { default_queue_policy { default_timeout_microseconds: 50000 } }"
        config = model_config(body, execute_delay_ms=500)
        model = await started(config)
        try:
            busy = asyncio.ensure_future(model.infer(request(model, data(0))))
            await until(lambda: executing(model) == 1, "the first request executing")
            with pytest.raises(EngineError) as info:
                await bounded(model.infer(request(model, data(1))))
            assert info.value.code is ErrorCode.UNAVAILABLE
            assert "timed out" in info.value.message and "'ident'" in info.value.message
            assert not busy.done()  # the timer fired on its own, not when the instance freed up
            np.testing.assert_array_equal(output(await bounded(busy)), data(0))
            assert model.stats.inference_count == 1  # the timed-out request never ran
            assert model.batcher.pending_count == 0
        finally:
            await model.stop()

    run(main)


def test_the_timeout_parameter_is_honored_only_with_allow_timeout_override() -> None:
    async def scenario(allow: bool) -> tuple[InstanceModel, BaseException | InferenceResponse, bool]:
        flag = str(allow).lower()
        body = f"dynamic_batching {{ default_queue_policy {{ allow_timeout_override: {flag} }} }}"
        model = await started(model_config(body, name=f"allow_{allow}", execute_delay_ms=300))
        busy = asyncio.ensure_future(model.infer(request(model, data(0))))
        await until(lambda: executing(model) == 1, "the first request executing")
        try:
            result: BaseException | InferenceResponse = await bounded(
                model.infer(request(model, data(1), timeout=20_000)))  # 20 ms, in microseconds
        except EngineError as e:
            result = e
        busy_when_answered = not busy.done()
        await bounded(busy)
        return model, result, busy_when_answered

    async def main() -> None:
        (strict, strict_result, _), (lenient, lenient_result, busy) = await asyncio.gather(
            scenario(False), scenario(True))
        try:
            assert isinstance(strict_result, InferenceResponse)  # override ignored: no timeout at all
            np.testing.assert_array_equal(output(strict_result), data(1))
            assert isinstance(lenient_result, EngineError)
            assert lenient_result.code is ErrorCode.UNAVAILABLE and "timed out" in lenient_result.message
            assert busy
            assert lenient.stats.inference_count == 1
        finally:
            await strict.stop()
            await lenient.stop()

    run(main)


def test_a_cancelled_request_is_never_executed() -> None:
    async def main() -> None:
        model = await started(model_config("dynamic_batching { }", execute_delay_ms=200))
        try:
            busy = asyncio.ensure_future(model.infer(request(model, data(0))))
            await until(lambda: executing(model) == 1, "the first request executing")
            queued = asyncio.ensure_future(model.infer(request(model, data(1))))
            await until(lambda: model.batcher.pending_count == 2, "the second request queued")
            queued.cancel()
            with pytest.raises(asyncio.CancelledError):
                await queued
            assert model.batcher.pending_count == 1
            assert len(model.batcher.policy) == 0
            await bounded(busy)
            assert model.stats.inference_count == 1
            assert model.stats.execution_count == 1
            assert model.batcher.pending_count == 0
        finally:
            await model.stop()

    run(main)


def test_cancelling_an_executing_request_leaves_the_model_consistent() -> None:
    async def main() -> None:
        model = await started(model_config("dynamic_batching { }", execute_delay_ms=100))
        try:
            running = asyncio.ensure_future(model.infer(request(model, data(0))))
            await until(lambda: executing(model) == 1, "the request executing")
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running
            assert model.batcher.pending_count == 1  # still executing: it is answered to no one
            await until(lambda: model.batcher.pending_count == 0, "the execution finished")
            after = await bounded(model.infer(request(model, data(1))))
            np.testing.assert_array_equal(output(after), data(1))
        finally:
            await bounded(model.stop())

    run(main)


# --------------------------------------------------------------------------------------- instances and limits

def _sample_after_each(tasks: list[asyncio.Future[Any]], sample: Callable[[], None]) -> None:
    for task in tasks:
        task.add_done_callback(lambda _: sample())


def test_n_instances_run_at_most_n_batches_at_once() -> None:
    async def main() -> None:
        config = model_config('instance_group [{ kind: KIND_CPU count: 2 }]', max_batch_size=0, dims="[3]",
                              execute_delay_ms=30)
        model = await started(config)
        try:
            samples: list[tuple[int, int]] = []

            def sample() -> None:
                samples.append((executing(model), model.batcher.pending_count))

            tasks = [asyncio.ensure_future(model.infer(request(model, np.full((3,), i, np.int32))))
                     for i in range(7)]
            _sample_after_each(tasks, sample)
            await until(lambda: model.batcher.pending_count == 7, "every request accepted")
            sample()
            responses = await bounded(asyncio.gather(*tasks))
            for i, response in enumerate(responses):
                np.testing.assert_array_equal(output(response), np.full((3,), i, np.int32))
            # Never more than 2 at once, and never an idle instance while work is queued.
            assert all(running == min(2, accepted) for running, accepted in samples), samples
            assert max(running for running, _ in samples) == 2
            assert model.stats.execution_count == 7
        finally:
            await model.stop()

    run(main)


def test_a_shared_limiter_of_one_execution_lets_both_models_progress() -> None:
    async def main() -> None:
        limiter = RateLimiter(max_concurrent_executions=1)
        a = await started(model_config("", "a", max_batch_size=0, dims="[3]", execute_delay_ms=20), limiter)
        b = await started(model_config("", "b", max_batch_size=0, dims="[3]", execute_delay_ms=20), limiter)
        try:
            finished: list[str] = []
            most = 0

            def sample(tag: str) -> None:
                nonlocal most
                finished.append(tag)
                most = max(most, executing(a) + executing(b))

            x = np.zeros(3, np.int32)
            a_tasks = [asyncio.ensure_future(a.infer(request(a, x))) for _ in range(5)]
            b_task = asyncio.ensure_future(b.infer(request(b, x)))
            for task in a_tasks:
                task.add_done_callback(lambda _: sample("a"))
            b_task.add_done_callback(lambda _: sample("b"))
            await until(lambda: a.batcher.pending_count == 5 and b.batcher.pending_count == 1, "all accepted")
            assert executing(a) + executing(b) == 1
            await bounded(asyncio.gather(*a_tasks, b_task))
            assert most <= 1
            assert a.stats.execution_count == 5 and b.stats.execution_count == 1
            # "b" queued behind a backlog of "a": it must not wait for the whole backlog to drain.
            assert finished.index("b") < len(finished) - 1, finished
        finally:
            await a.stop()
            await b.stop()

    run(main)


def test_rate_limiter_resources_are_respected() -> None:
    group = 'instance_group [{ kind: KIND_CPU count: 2 rate_limiter { resources [{ name: "R" count: 1 }] } }]'

    async def most_at_once(units: int) -> int:
        limiter = RateLimiter(resources={"R": units})
        model = await started(model_config(group, name=f"r{units}", max_batch_size=0, dims="[3]",
                                           execute_delay_ms=20), limiter)
        try:
            most = 0

            def sample() -> None:
                nonlocal most
                most = max(most, executing(model))

            x = np.zeros(3, np.int32)
            tasks = [asyncio.ensure_future(model.infer(request(model, x))) for _ in range(5)]
            _sample_after_each(tasks, sample)
            await until(lambda: model.batcher.pending_count == 5, "every request accepted")
            sample()
            await bounded(asyncio.gather(*tasks))
            assert model.stats.execution_count == 5
            return most
        finally:
            await model.stop()

    async def main() -> None:
        assert await most_at_once(1) == 1  # two instances, but one unit of R: one at a time
        assert await most_at_once(2) == 2

    run(main)


# --------------------------------------------------------------------------------------------- ordering

def test_preserve_ordering_delivers_in_order() -> None:
    async def finish_order(preserve: bool) -> list[str]:
        body = ('instance_group [{ kind: KIND_CPU count: 2 }]\n'
                f'dynamic_batching {{ preserve_ordering: {str(preserve).lower()} }}')
        model = await started(model_config(body, name=f"preserve_{preserve}", execute_delay_ms_per_item=40))
        try:
            order: list[str] = []
            # Different shapes, so two batches on two instances; the first (6 items) runs longer.
            big = asyncio.ensure_future(model.infer(request(model, data(1, (6, 2)), id="big")))
            small = asyncio.ensure_future(model.infer(request(model, data(2, (1, 3)), id="small")))
            big.add_done_callback(lambda _: order.append("big"))
            small.add_done_callback(lambda _: order.append("small"))
            await until(lambda: executing(model) == 2, "both batches executing")
            responses = await bounded(asyncio.gather(big, small))
            np.testing.assert_array_equal(output(responses[0]), data(1, (6, 2)))
            np.testing.assert_array_equal(output(responses[1]), data(2, (1, 3)))
            return order
        finally:
            await model.stop()

    async def main() -> None:
        preserved, unordered = await asyncio.gather(finish_order(True), finish_order(False))
        assert preserved == ["big", "small"]
        assert unordered == ["small", "big"]  # the setup really does finish out of order

    run(main)


def test_a_high_priority_request_is_dispatched_before_queued_low_ones() -> None:
    async def main() -> None:
        body = "dynamic_batching { priority_levels: 2 default_priority_level: 2 }"
        model = await started(model_config(body, max_batch_size=1, execute_delay_ms=50))
        try:
            order: list[str] = []

            def submit(tag: str, **parameters: Any) -> asyncio.Future[InferenceResponse]:
                task = asyncio.ensure_future(model.infer(request(model, data(0), id=tag, **parameters)))
                task.add_done_callback(lambda t: order.append(t.result().id))
                return task

            blocker = submit("blocker")
            await until(lambda: executing(model) == 1, "the blocker executing")
            tasks = [submit("low1"), submit("low2", priority=2), submit("high", priority=1)]
            await until(lambda: len(model.batcher.policy) == 3 or blocker.done(), "three requests queued")
            assert not blocker.done()  # they queued while the only instance was busy
            await bounded(asyncio.gather(blocker, *tasks))
            assert order == ["blocker", "high", "low1", "low2"]
        finally:
            await model.stop()

    run(main)


def test_a_priority_outside_the_levels_is_rejected_before_queueing() -> None:
    async def main() -> None:
        body = "dynamic_batching { priority_levels: 2 default_priority_level: 1 }"
        model = await started(model_config(body))
        try:
            with pytest.raises(EngineError) as info:
                await bounded(model.infer(request(model, data(0), priority=3)))
            assert info.value.code is ErrorCode.INVALID_ARG
            assert model.batcher.pending_count == 0
        finally:
            await model.stop()

    run(main)


# --------------------------------------------------------------------------------------------- shutdown

def test_stop_drains_accepted_requests_before_returning() -> None:
    async def main() -> None:
        config = model_config("dynamic_batching { max_queue_delay_microseconds: 20000 }", max_batch_size=4,
                              execute_delay_ms=20)
        model = await started(config)
        tasks = [asyncio.ensure_future(model.infer(request(model, data(i), id=str(i)))) for i in range(10)]
        await until(lambda: model.batcher.pending_count == 10, "every request accepted")
        await bounded(model.stop())
        assert all(task.done() for task in tasks)
        for i, task in enumerate(tasks):
            np.testing.assert_array_equal(output(task.result()), data(i))
        assert model.stats.inference_count == 10
        assert model.batcher.pending_count == 0

    run(main)


# ------------------------------------------------------------------------------------- inline execution

def backend_threads(model: InstanceModel) -> list[int]:
    return model.pool._instances[0].backend.threads  # the identity backend's record of where it ran


def test_a_fast_cpu_bound_backend_runs_inline_after_its_first_run() -> None:
    """The hand-off to the instance thread costs more than a tiny CPU batch: once a run measured under
    INLINE_BELOW_NS of CPU, batches no larger run on the loop thread, and keep doing so."""
    async def main() -> None:
        model = await started(model_config("", cpu_bound="true"))
        try:
            for i in range(5):
                await bounded(model.submit(request(model, data(i))))
            threads = backend_threads(model)
            loop_thread = threading.get_ident()
            assert threads[0] != loop_thread  # measured first, on the instance's thread
            assert threads[1:] == [loop_thread] * 4
        finally:
            await model.stop()
    run(main)


def test_a_backend_that_blocks_inline_goes_back_to_its_thread() -> None:
    """The first run is fast, so the backend qualifies for inlining; from the second on every run sleeps 3 ms,
    giving up the CPU of its own accord (a voluntary context switch). The inline run that does so while the
    loop waits is a strike: the backend goes back to its thread at once, and stays there while its average
    says so. (A run merely preempted for as long is no strike; that cannot be staged deterministically.)"""
    async def main() -> None:
        config = model_config("", cpu_bound="true", execute_delay_ms=3, execute_delay_from_run=2)
        model = await started(config)
        try:
            for i in range(5):
                await bounded(model.submit(request(model, data(i))))
            threads = backend_threads(model)
            loop_thread = threading.get_ident()
            assert threads[0] != loop_thread and threads[1] == loop_thread
            assert loop_thread not in threads[2:]
            assert model.pool._instances[0].inline.strikes == 1
        finally:
            await model.stop()
    run(main)


def test_a_backend_not_cpu_bound_never_runs_inline() -> None:
    async def main() -> None:
        model = await started(model_config(""))
        try:
            for i in range(3):
                await bounded(model.submit(request(model, data(i))))
            assert threading.get_ident() not in backend_threads(model)
        finally:
            await model.stop()
    run(main)


def test_an_inline_batch_creates_no_task() -> None:
    """A batch the instance runs in place goes in a plain loop callback: a task would cost more than such a
    batch. Counted by the loop's task factory, which sees every task created on it."""
    async def main() -> None:
        model = await started(model_config("", cpu_bound="true"))
        loop = asyncio.get_running_loop()
        created: list[object] = []

        def counting_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
            created.append(coro)
            return asyncio.Task(coro, loop=loop, **kwargs)

        try:
            await bounded(model.submit(request(model, data(0))))  # measured first, on the thread
            loop.set_task_factory(counting_factory)
            futures = [model.submit(request(model, data(i))) for i in range(1, 5)]
            responses = [await f for f in futures]  # awaiting a future directly creates no task
            loop.set_task_factory(None)
            assert [int(output(r)[0, 0]) for r in responses] == [1, 2, 3, 4]
            assert backend_threads(model)[1:] == [threading.get_ident()] * 4  # they did run inline
            assert created == []
            await until(lambda: model.stats.success.count == 5, "every request is accounted")
        finally:
            loop.set_task_factory(None)
            await model.stop()
    run(main)


def test_one_done_callback_accounts_then_answers() -> None:
    """The frontend's answer (`on_done`) is the future's one done-callback's last step: by then the request is
    accounted, as a success, a failure, or (the future cancelled while queued) cancelled and out of the
    queue, never executed."""
    async def main() -> None:
        model = await started(model_config("", execute_delay_ms=200, fail_on_value=13))
        seen: list[tuple[str, int, int, int]] = []

        def answered(f: asyncio.Future[InferenceResponse]) -> None:
            outcome = "cancelled" if f.cancelled() else "failed" if f.exception() is not None else "ok"
            s = model.stats
            seen.append((outcome, s.success.count, s.fail.count, s.cancelled.count))

        try:
            ok = model.submit(request(model, data(1)), on_done=answered)
            await until(lambda: executing(model) == 1, "the first request executes")
            failing = model.submit(request(model, data(13)), on_done=answered)
            queued = model.submit(request(model, data(2)), on_done=answered)
            queued.cancel()
            await until(lambda: len(seen) == 1, "the cancelled request is answered")
            assert seen == [("cancelled", 0, 0, 1)]
            assert len(model.batcher.policy) == 1  # only `failing` waits
            await bounded(ok)
            with pytest.raises(EngineError):
                await bounded(failing)
            await until(lambda: len(seen) == 3, "every request is answered")
            assert seen[1:] == [("ok", 1, 0, 1), ("failed", 1, 1, 1)]
            assert len(backend_threads(model)) == 2 and model.batcher.pending_count == 0  # `queued` never ran
        finally:
            await model.stop()
    run(main)


def test_an_answered_request_is_freed_without_the_cyclic_collector() -> None:
    """Whatever the batcher keeps for a request (its future, its done-callback, the frontend's answer) holds
    no reference cycle once the request is answered, as a success or cancelled while queued: at thousands of
    requests a second, a cycle would keep every request's buffers until the collector ran. (A failed batch's
    error keeps its traceback, whose frames hold the batch, until collected: failures are rare.)"""
    async def main() -> None:
        model = await started(model_config("", execute_delay_ms=50))
        answered: list[bool] = []
        futures: list[weakref.ref[asyncio.Future[InferenceResponse]]] = []
        gc.disable()
        try:
            for value in (1, 2, 3, 4):
                future = model.submit(request(model, data(value)), on_done=lambda f: answered.append(True))
                futures.append(weakref.ref(future))
                if value == 4:
                    await until(lambda: executing(model) > 0, "a batch executes")
                    future.cancel()  # still queued behind the batch
                del future
            await until(lambda: len(answered) == 4, "every request is answered")
            await until(lambda: model.batcher.pending_count == 0, "every request is done")
            assert [ref() is None for ref in futures] == [True] * 4
        finally:
            gc.enable()
            await model.stop()
    run(main)


# --------------------------------------------------------------------------------------------- early dispatch

async def closed_loop_until_early(model: InstanceModel, clients: int, early_batches: int) -> None:
    """`clients` closed-loop clients (each sends its next request when answered) until the model has sent
    `early_batches` batches early, within BOUND_S."""
    stop = asyncio.Event()

    async def client(c: int) -> None:
        i = 0
        while not stop.is_set():
            value = c * 100_000 + i
            np.testing.assert_array_equal(output(await model.infer(request(model, data(value)))), data(value))
            i += 1

    tasks = [asyncio.ensure_future(client(c)) for c in range(clients)]
    try:
        await until(lambda: model.stats.dispatch_reasons.get("early", 0) >= early_batches,
                    f"{early_batches} batches sent early")
    finally:
        stop.set()
        await bounded(asyncio.gather(*tasks))


def test_a_lone_closed_loop_client_stops_waiting_for_the_window() -> None:
    """After a few epochs (engine/scheduling/batching/join_forecast.py) the batcher knows one client is all
    there is; its requests then leave the queue at once instead of after the 20 ms window."""
    async def main() -> None:
        model = await started(model_config("dynamic_batching { max_queue_delay_microseconds: 20000 }"))
        try:
            await closed_loop_until_early(model, 1, 5)
            queued = model.stats.queue.count, model.stats.queue.ns
            await closed_loop_until_early(model, 1, model.stats.dispatch_reasons["early"] + 10)
            waited_ns = (model.stats.queue.ns - queued[1]) / (model.stats.queue.count - queued[0])
            assert waited_ns < 10_000_000  # well under the window, even on a loaded machine
        finally:
            await model.stop()

    run(main)


def test_closed_loop_clients_go_as_one_batch_once_all_are_in() -> None:
    async def main() -> None:
        config = model_config("dynamic_batching { max_queue_delay_microseconds: 200000 }", execute_delay_ms=2)
        model = await started(config)
        try:
            await closed_loop_until_early(model, 4, 10)
            # Every batch held all four clients, the early ones included: they went when nobody else could
            # join, long before the 200 ms window ended.
            assert set(model.stats.batches) == {4}
            assert model.stats.dispatch_reasons["early"] >= 10
        finally:
            await model.stop()

    run(main)


def test_early_dispatch_false_waits_out_the_window_as_triton_does() -> None:
    async def main() -> None:
        model = await started(model_config("dynamic_batching { max_queue_delay_microseconds: 2000 }",
                                           early_dispatch="false"))
        try:
            for i in range(300):  # about three epochs of a lone client behind a 2 ms window
                await bounded(model.infer(request(model, data(i))))
            assert model.stats.dispatch_reasons == {"window": 300}
        finally:
            await model.stop()

    run(main)
