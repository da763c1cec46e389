"""The generate extension over HTTP: `POST /v2/models/{m}[/versions/{v}]/generate` (one JSON answer) and
`.../generate_stream` (server-sent events, one per response). routes.py runs `answer_generate` in a
task per request; the JSON mapping is generate_codec.py's, the event framing sse.py's.

What happens, as in Triton (server src/http_server.cc HandleGenerate, GenerateRequestClass):
1. the model's input metadata is looked up (an unknown model or version fails here), the body parsed and
   mapped to an inference;
2. the responses come from `_responses`, the one seam to the engine (engine/streaming/responses.py's
   response stream: a decoupled model's responses as it sends them);
3. `generate` answers the one response as JSON (other than one response is INTERNAL); `generate_stream`
   writes each response as an event as it comes, `text/event-stream`, chunked, status 200; a decoupled
   model's error response before its last is an `{"error": ...}` event and the stream goes on with its later
   responses (Triton's behaviour); an error that ends the request after the first response is a last
   `{"error": ...}` event; a response that only says "final" writes nothing.
Every error before the first response is a plain JSON error with its status, on both endpoints: Triton's
answer to a request that fails before inference (a missing input, an unknown model). Triton streams an
error of the first response itself as an event (with the error's status); that one case is JSON here,
because with --workers 2 an error that the engine's submission refused and one the model raised arrive
alike, and both layouts must answer the same.
A client that disconnects cancels the task (the connection cancels its in-flight future), which closes the
iterator, which cancels the request.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from ...errors import EngineError, invalid
from ...streaming.responses import StreamedResponse, infer_stream
from ...types import InferenceRequest, InferenceResponse
from ..engine import Engine
from . import sse
from .generate_codec import decode_generate, encode_generate, input_metadata, many_responses
from .types import Answer, ResponseStream

log = logging.getLogger("hubserve.http")

# (model name, version) → the model's metadata as the metadata endpoint answers it; raises EngineError.
MetadataSource = Callable[[str, str], Awaitable[dict[str, Any]]]
_JSON = b"application/json"


def _responses(engine: Engine, request: InferenceRequest, start_ns: int
               ) -> AsyncIterator[StreamedResponse]:
    """The seam between the generate endpoints and the engine: the responses of `request`, in order, the
    last one `final` (engine/streaming/responses.py: one for a non-decoupled model, 0..N and a final one for a
    decoupled model). Errors (EngineError) are raised from the iterator; closing it early cancels the
    request."""
    return infer_stream(engine.submit, request, start_ns)


async def answer_generate(engine: Engine, metadata: MetadataSource, name: str, version: str,
                          body: bytes | bytearray, max_input_bytes: int, start_ns: int,
                          stream: ResponseStream | None, owner: str = "") -> Answer | None:
    """One generate request, run as the route's task. `stream` None: `generate`, the answer returned (an
    EngineError raised is answered as JSON with its status by the route). Otherwise `generate_stream`: an
    error before the first response is raised likewise; from the first response on, everything is written
    through `stream` and None is returned (the connection then ends the chunked body). `owner`: who sent it
    (HttpRequest.owner, from its admission: a generative model charges its tokens to that key)."""
    inputs = input_metadata(await metadata(name, version))
    try:
        doc = orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError as e:
        raise invalid(f"malformed JSON in request body: {e}") from None
    request = decode_generate(name, version, doc, inputs, max_input_bytes)
    request.owner = owner
    del doc  # the parsed JSON (a Python object per element): not held for as long as the stream runs
    responses = _responses(engine, request, start_ns)
    try:
        if stream is None:
            return await _collect(responses)
        await stream_responses(responses, stream)
        return None
    finally:  # also when cancelled (the client left): closing the iterator cancels the request
        close = getattr(responses, "aclose", None)
        if close is not None:
            await close()


async def _collect(responses: AsyncIterator[StreamedResponse]) -> Answer:
    """`generate`: exactly one response, else INTERNAL in Triton's words; an error response is raised."""
    answers: list[InferenceResponse] = []
    async for item in responses:
        if item.error is not None:
            raise item.error
        if item.response is not None:
            answers.append(item.response)
    if len(answers) != 1:
        raise many_responses()
    return 200, encode_generate(answers[0]), _JSON, b""


async def stream_responses(responses: AsyncIterator[StreamedResponse], stream: ResponseStream) -> None:
    """`generate_stream`: an event per response, written as it comes, after a 200 head sent with the first
    one. A decoupled model's error response before its last is an error event, and the stream goes on. An
    error that ends the request before the first event is raised (a JSON answer); after it, it is the
    stream's last event."""
    started = False
    while True:
        try:
            item = await anext(responses)
        except StopAsyncIteration:
            break
        except Exception as e:
            if not started:
                raise
            if not isinstance(e, EngineError):  # a bug: the client still learns the stream failed
                log.exception("generate_stream failed")
            stream.send(sse.error_event(e.message if isinstance(e, EngineError) else f"internal error: {e}"))
            return
        if item.error is not None:  # a decoupled model's error response before its last: the stream goes on
            event: bytes | None = sse.error_event(item.error.message)
        else:
            event = None if item.response is None else sse.data_event(encode_generate(item.response))
        if event is not None:
            if not started:
                stream.start(200, sse.CONTENT_TYPE)
                started = True
            stream.send(event)
            await stream.drain()
        if item.final:
            break
    if not started:  # no response at all: an empty stream, as Triton answers a flag-only response
        stream.start(200, sse.CONTENT_TYPE)


__all__ = ["MetadataSource", "StreamedResponse", "answer_generate", "stream_responses"]
