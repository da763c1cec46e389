"""The engine's response stream: one request in, its responses out as an async iterator, for every model.

`infer_stream(submit, request)` is what `DataPlane.infer_stream` (and the frontend processes' `EngineClient`)
return; transports that stream (HTTP generate_stream, OpenAI) are built on it. It rides on the request's one
completion path: `submit(request, start_ns, on_done)` queues it, a decoupled model's responses before its
last reach `request.stream` (backends/python/decoupled.py), and the future resolves with the last, so the
request is accounted once, as any other. What the iterator yields:
- a non-decoupled model: exactly one `StreamedResponse(response, final=True)`;
- a decoupled model: each response as it is sent (`final=False`), then its last (`final=True`), which is
  `StreamedResponse(None, True)` when the model sent the final flag alone (Triton's empty final response);
- an error response a decoupled model sends before its last: `StreamedResponse(None, False, error)`, and the
  stream goes on with the model's later responses, as Triton's streams do;
- an error that ends the request (a refusal, an error response sent with the final flag, a failed
  execute): raised from the iterator as EngineError, and the stream ends.
Leaving the iterator early (`break`, `aclose()`, the consuming task cancelled) cancels the request: it leaves
the queue, or the model's `is_cancelled()` turns true, and nothing is left behind.

The queue between the model and the iterator is bounded: the request's `stream_window`
(window.py) is credited as the consumer takes each item, so a consumer that stops taking
(an HTTP client that does not read: its route waits in `drain()`) stops the model's sends once
RESPONSE_WINDOW responses wait here.

The gRPC stream (frontend/grpc/handlers.py) uses the same two hooks directly, as a callback per response,
so that a ModelStreamInfer request costs no task.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from ..errors import EngineError, ErrorCode
from ..types import EMPTY_FINAL, Completion, InferenceRequest, InferenceResponse
from .window import StreamWindow

Submit = Callable[[InferenceRequest, int, "Completion | None"], "asyncio.Future[InferenceResponse]"]


@dataclass(frozen=True, slots=True)
class StreamedResponse:
    """One item of a response stream: `response` (None for a final flag sent alone, or for an error response
    before the last), whether it is the request's last, and `error`, a decoupled model's error response
    before its last (the stream goes on)."""

    response: InferenceResponse | None
    final: bool
    error: EngineError | None = None


class _Items:
    """What the request produced and the iterator has not taken yet; written by the loop's callbacks."""

    __slots__ = ("items", "waiter")

    def __init__(self) -> None:
        self.items: collections.deque[StreamedResponse | BaseException] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None

    def push(self, item: StreamedResponse | BaseException) -> None:
        self.items.append(item)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def streamed(self, response: InferenceResponse | EngineError) -> None:
        self.push(StreamedResponse(None, False, response) if isinstance(response, EngineError)
                  else StreamedResponse(response, False))

    def completed(self, future: asyncio.Future[InferenceResponse]) -> None:
        if future.cancelled():
            self.push(EngineError(ErrorCode.CANCELLED, "the request was cancelled"))
        elif (exc := future.exception()) is not None:
            self.push(exc)
        else:
            result = future.result()
            self.push(StreamedResponse(None if result is EMPTY_FINAL else result, True))


async def infer_stream(submit: Submit, request: InferenceRequest, start_ns: int = 0
                       ) -> AsyncIterator[StreamedResponse]:
    """The responses of `request`, as they come (module docstring). Raises EngineError for a request refused
    before it is queued (unknown model, bad input, full queue), on the first iteration."""
    items = _Items()
    request.stream = items.streamed
    window = request.stream_window = StreamWindow()
    future = submit(request, start_ns, items.completed)
    try:
        while True:
            if not items.items:
                items.waiter = asyncio.get_running_loop().create_future()
                await items.waiter
                items.waiter = None
            item = items.items.popleft()
            if isinstance(item, BaseException):
                raise item
            if not item.final:
                window.taken()  # the model may send one more
            yield item
            if item.final:
                return
    finally:
        if not future.done():
            future.cancel()  # the consumer left first: the request leaves the queue or is cancelled
