"""The generate extension over HTTP: `POST /v2/models/{m}[/versions/{v}]/generate` (one JSON answer) and
`.../generate_stream` (server-sent events, one per response). http_routes.py runs `answer_generate` in a
task per request; the JSON mapping is generate_codec.py's, the event framing sse.py's.

What happens, as in Triton (server src/http_server.cc HandleGenerate, GenerateRequestClass):
1. the model's input metadata is looked up (an unknown model or version fails here), the body parsed and
   mapped to an inference; every failure so far, and whatever the submission refuses (a missing input, a
   full queue), is a plain JSON error with its status, on both endpoints;
2. the responses come from `_responses`, the one seam to the engine;
3. `generate` answers the one response as JSON (an error response with its status; other than one
   response is INTERNAL); `generate_stream` writes each response as an event as it comes, with the status
   of the first (200, or an error's: Triton sets the status from the first response), `text/event-stream`,
   chunked; an error becomes an `{"error": ...}` event and ends the stream; a response that only says
   "final" writes nothing.
A client that disconnects cancels the task (the connection cancels its in-flight future), which closes the
iterator, which cancels the request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from ..errors import EngineError, ErrorCode, invalid
from ..types import InferenceRequest, InferenceResponse
from . import sse
from .generate_codec import decode_generate, encode_generate, input_metadata, many_responses
from .http_types import Answer, ResponseStream

log = logging.getLogger("hubserve.http")

# (model name, version) → the model's metadata as the metadata endpoint answers it; raises EngineError.
MetadataSource = Callable[[str, str], Awaitable[dict[str, Any]]]
_JSON = b"application/json"


@dataclass(frozen=True, slots=True)
class StreamedResponse:
    """One response of a request on the streaming path: `response` None for one that only says `final`."""

    response: InferenceResponse | None
    final: bool


class Submitter(Protocol):
    """What `_responses` needs of the engine: DataPlane here, workers/remote.py's EngineClient in a
    frontend process."""

    def submit(self, request: InferenceRequest, start_ns: int = ..., on_done: Any = ...
               ) -> asyncio.Future[InferenceResponse]: ...


def _responses(dataplane: Submitter, request: InferenceRequest, start_ns: int
               ) -> AsyncIterator[StreamedResponse]:
    """THE SEAM between the generate endpoints and the engine: the responses of `request`, in order, the
    last one `final`. Raises at once (EngineError) for what fails before inference: an unknown model, a
    request the model refuses, a full queue; an error of the inference itself is raised from the iterator.
    Closing the iterator early cancels the request.

    Today every model answers a request once, so this is the unary path: one submission, one final
    response. Once decoupled models exist this body becomes `dataplane.infer_stream(request)` and nothing
    else changes (an iterator that raises even its early errors lazily only turns them into a stream's
    first event, with the error's status, instead of a JSON error)."""
    future = dataplane.submit(request, start_ns)
    return _one_response(future)


async def _one_response(future: asyncio.Future[InferenceResponse]) -> AsyncIterator[StreamedResponse]:
    try:
        response = await future  # a cancelled task cancels the future it awaits: the request leaves
    finally:
        future.cancel()  # closed before the answer came (a no-op once done)
    yield StreamedResponse(response, True)


async def answer_generate(submitter: Submitter, metadata: MetadataSource, name: str, version: str,
                          body: bytes | bytearray, max_input_bytes: int, start_ns: int,
                          stream: ResponseStream | None, status: Mapping[ErrorCode, int]) -> Answer | None:
    """One generate request, run as the route's task. `stream` None: `generate`, the answer returned (an
    EngineError raised is answered as JSON with its status by the route). Otherwise `generate_stream`: an
    error before inference is raised likewise; once responses come they are written through `stream`, with
    the status `status` gives an error first in the stream, and None is returned (the connection then ends
    the chunked body)."""
    inputs = input_metadata(await metadata(name, version))
    try:
        doc = orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError as e:
        raise invalid(f"malformed JSON in request body: {e}") from None
    request = decode_generate(name, version, doc, inputs, max_input_bytes)
    responses = _responses(submitter, request, start_ns)
    try:
        if stream is None:
            return await _collect(responses)
        await _stream(responses, stream, status)
        return None
    finally:  # also when cancelled (the client left): closing the iterator cancels the request
        close = getattr(responses, "aclose", None)
        if close is not None:
            await close()


async def _collect(responses: AsyncIterator[StreamedResponse]) -> Answer:
    """`generate`: exactly one response, else INTERNAL in Triton's words; an error response is raised."""
    answers = [r.response async for r in responses if r.response is not None]
    if len(answers) != 1:
        raise many_responses()
    return 200, encode_generate(answers[0]), _JSON, b""


async def _stream(responses: AsyncIterator[StreamedResponse], stream: ResponseStream,
                  status: Mapping[ErrorCode, int]) -> None:
    """`generate_stream`: an event per response, written as it comes; the first response (or error) sets
    the status. An error ends the stream with its event."""
    started = False
    while True:
        try:
            item = await anext(responses)
        except StopAsyncIteration:
            break
        except EngineError as e:
            _start(stream, started, status[e.code])
            stream.send(sse.error_event(e.message))
            return
        except Exception as e:  # a bug: the client still learns the stream failed
            log.exception("generate_stream failed")
            _start(stream, started, status[ErrorCode.INTERNAL])
            stream.send(sse.error_event(f"internal error: {e}"))
            return
        if item.response is not None:
            started = _start(stream, started, 200)
            stream.send(sse.data_event(encode_generate(item.response)))
            await stream.drain()
        if item.final:
            break
    _start(stream, started, 200)  # no response at all: an empty stream, as Triton's flag-only answer


def _start(stream: ResponseStream, started: bool, status: int) -> bool:
    if not started:
        stream.start(status, sse.CONTENT_TYPE)
    return True


__all__ = ["MetadataSource", "StreamedResponse", "Submitter", "answer_generate"]
