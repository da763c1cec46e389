"""`DataPlane.infer_stream` (engine/streaming/responses.py), the transport-neutral response stream,
in-process: one final item for a non-decoupled model; a decoupled model's responses in order, then its final
flag; an error response before the last as an item, the stream going on; an error that ends the request raised
as EngineError; leaving early (aclose, break, the consuming task cancelled) cancels the request, so the
model's is_cancelled() turns true and its one instance takes the next request.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import run_repository
from engine.dataplane import DataPlane
from engine.errors import EngineError, ErrorCode
from engine.repository.lifecycle import ModelRepository
from engine.streaming.responses import StreamedResponse
from engine.types import DataType, InferenceRequest, Tensor
from hubserve_harness import EXAMPLES
from python_models import DECOUPLED_MISUSE, DECOUPLED_MISUSE_CONFIG, add_simple, write_model


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("streaming_repository")
    shutil.copytree(EXAMPLES / "repeat_stream", root / "repeat_stream")
    write_model(root, "misuse", DECOUPLED_MISUSE, DECOUPLED_MISUSE_CONFIG)
    add_simple(root)
    return root


def tensor(name: str, datatype: DataType, values: list[int]) -> Tensor:
    array = np.array(values, dtype=datatype.numpy_dtype)
    return Tensor(name, datatype, array.shape, array)


def repeat(values: list[int]) -> InferenceRequest:
    return InferenceRequest("repeat_stream", "", [tensor("IN", DataType.INT32, values)], id="s")


def mode(value: int) -> InferenceRequest:
    return InferenceRequest("misuse", "", [tensor("MODE", DataType.INT32, [value])])


def text(item: StreamedResponse) -> str:
    assert item.response is not None
    return str(item.response.outputs[0].data[0].decode())


async def collect(dp: DataPlane, request: InferenceRequest) -> list[StreamedResponse]:
    return [item async for item in dp.infer_stream(request)]


def run(repo: Path, test) -> None:
    async def go(repository: ModelRepository) -> None:
        await repository.load_all()
        await test(DataPlane(repository))

    run_repository(go, repo)


def test_a_non_decoupled_model_yields_one_final_response(repo: Path) -> None:
    async def test(dp: DataPlane) -> None:
        ones = tensor("INPUT0", DataType.INT32, [1] * 16)
        request = InferenceRequest("simple", "", [Tensor("INPUT0", DataType.INT32, (1, 16), ones.data[None]),
                                                  Tensor("INPUT1", DataType.INT32, (1, 16), ones.data[None])])
        [item] = await collect(dp, request)
        assert item.final and item.response is not None
        assert item.response.outputs[0].data.tolist() == [[2] * 16]

    run(repo, test)


def test_a_decoupled_model_streams_then_ends(repo: Path) -> None:
    async def test(dp: DataPlane) -> None:
        items = await collect(dp, repeat([3, 1, 4, 1, 5]))
        assert [(int(i.response.outputs[0].data[0]), i.final) for i in items[:-1]] == [  # type: ignore[union-attr]
            (3, False), (1, False), (4, False), (1, False), (5, False)]
        assert items[-1] == StreamedResponse(None, True)
        assert {i.response.id for i in items[:-1]} == {"s"}  # type: ignore[union-attr]
        [last] = await collect(dp, mode(8))  # the final flag sent with a response
        assert last.final and text(last) == "only"

    run(repo, test)


def test_an_error_response_mid_stream_is_an_item_and_the_stream_goes_on(repo: Path) -> None:
    async def test(dp: DataPlane) -> None:
        items = await collect(dp, mode(5))  # one, an error response, two, the final flag alone
        assert text(items[0]) == "one" and not items[0].final
        assert items[1].response is None and not items[1].final and items[1].error is not None
        assert items[1].error.message == "bad piece"
        assert text(items[2]) == "two" and items[3] == StreamedResponse(None, True)

    run(repo, test)


def test_errors_that_end_the_request_are_raised_from_the_iterator(repo: Path) -> None:
    async def test(dp: DataPlane) -> None:
        with pytest.raises(EngineError) as info:
            await collect(dp, InferenceRequest("no_such_model", "", []))
        assert info.value.code is ErrorCode.NOT_FOUND
        with pytest.raises(EngineError, match="must return None"):
            await collect(dp, mode(1))

    run(repo, test)


def test_leaving_early_cancels_the_request(repo: Path) -> None:
    async def test(dp: DataPlane) -> None:
        stream = dp.infer_stream(mode(7))  # holds the model's one instance until cancelled
        assert text(await anext(stream)) == "waiting"
        await stream.aclose()
        [note] = await collect(dp, mode(4))  # runs only once the instance is free
        assert text(note) == "cancelled=True sender=True"

        async def consume() -> None:
            async for _ in dp.infer_stream(mode(7)):
                started.set()

        started = asyncio.Event()
        task = asyncio.create_task(consume())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        [note] = await collect(dp, mode(4))
        assert text(note) == "cancelled=True sender=True"
        model = dp.model("misuse")
        await asyncio.wait_for(model.batcher.drain(), 10)  # nothing left in flight
        assert model.stats.cancelled.count == 2

    run(repo, test)
