"""The life of one HTTP/2 stream (RFC 9113 §5.1), as a table: state × event → next state.

Why a table: which frame may arrive or leave in which state is the protocol's own statement of it, and a
table is checked by reading it against the RFC's diagram. Everything else about a stream (its windows, its
queued DATA, its handler) lives on `streams.H2Stream`; the core (core.py) moves `H2Stream.state` through
`transition` as frames are received and sent, for either role. Without server push there are no reserved
states. A frame without END_STREAM is an event too (`RECV_DATA`, `SEND_DATA`): it changes no state, but the
table says where it is allowed.

An illegal received frame is the peer's error: on a half-closed (remote) or closed stream a stream error
STREAM_CLOSED (§5.1), on an idle stream a connection error PROTOCOL_ERROR (§5.1, "idle"). An illegal sent
frame is ours: RuntimeError.
"""

from __future__ import annotations

import enum

from .frames import H2ConnectionError, H2Error, H2StreamError


class StreamState(enum.Enum):
    IDLE = "idle"
    OPEN = "open"
    HALF_CLOSED_LOCAL = "half-closed (local)"  # we sent END_STREAM; the peer still sends
    HALF_CLOSED_REMOTE = "half-closed (remote)"  # the peer sent END_STREAM; we still send
    CLOSED = "closed"

    # Members are singletons compared by identity: identity hashing makes the table lookup a C call.
    __hash__ = object.__hash__


class StreamEvent(enum.Enum):
    SEND_HEADERS = "send HEADERS"
    RECV_HEADERS = "recv HEADERS"
    SEND_DATA = "send DATA"
    RECV_DATA = "recv DATA"
    SEND_END_STREAM = "send END_STREAM"  # on DATA or HEADERS; the frame's own event is implied
    RECV_END_STREAM = "recv END_STREAM"
    SEND_RST = "send RST_STREAM"
    RECV_RST = "recv RST_STREAM"

    __hash__ = object.__hash__


S, E = StreamState, StreamEvent

TRANSITIONS: dict[tuple[StreamState, StreamEvent], StreamState] = {
    # idle: opened by HEADERS either way (§5.1); the END_STREAM that may come with them follows.
    (S.IDLE, E.SEND_HEADERS): S.OPEN,
    (S.IDLE, E.RECV_HEADERS): S.OPEN,
    # open: both sides send; either END_STREAM half-closes, either RST_STREAM closes.
    (S.OPEN, E.SEND_HEADERS): S.OPEN,
    (S.OPEN, E.RECV_HEADERS): S.OPEN,
    (S.OPEN, E.SEND_DATA): S.OPEN,
    (S.OPEN, E.RECV_DATA): S.OPEN,
    (S.OPEN, E.SEND_END_STREAM): S.HALF_CLOSED_LOCAL,
    (S.OPEN, E.RECV_END_STREAM): S.HALF_CLOSED_REMOTE,
    (S.OPEN, E.SEND_RST): S.CLOSED,
    (S.OPEN, E.RECV_RST): S.CLOSED,
    # half-closed (local): only the peer still sends.
    (S.HALF_CLOSED_LOCAL, E.RECV_HEADERS): S.HALF_CLOSED_LOCAL,
    (S.HALF_CLOSED_LOCAL, E.RECV_DATA): S.HALF_CLOSED_LOCAL,
    (S.HALF_CLOSED_LOCAL, E.RECV_END_STREAM): S.CLOSED,
    (S.HALF_CLOSED_LOCAL, E.SEND_RST): S.CLOSED,
    (S.HALF_CLOSED_LOCAL, E.RECV_RST): S.CLOSED,
    # half-closed (remote): only we still send.
    (S.HALF_CLOSED_REMOTE, E.SEND_HEADERS): S.HALF_CLOSED_REMOTE,
    (S.HALF_CLOSED_REMOTE, E.SEND_DATA): S.HALF_CLOSED_REMOTE,
    (S.HALF_CLOSED_REMOTE, E.SEND_END_STREAM): S.CLOSED,
    (S.HALF_CLOSED_REMOTE, E.SEND_RST): S.CLOSED,
    (S.HALF_CLOSED_REMOTE, E.RECV_RST): S.CLOSED,
    # closed: nothing. (Frames the peer sent before it learnt of the close are dropped by the core before
    # they get here: a closed stream is forgotten, and frames on forgotten ids are ignored, §5.1 "closed".)
}

_RECEIVED = frozenset((E.RECV_HEADERS, E.RECV_DATA, E.RECV_END_STREAM, E.RECV_RST))

# The same table by event, for the request path: `AFTER[event].get(state)` is one dict lookup and builds no
# tuple. None where TRANSITIONS has no move: then `transition` raises the error.
AFTER: dict[StreamEvent, dict[StreamState, StreamState]] = {event: {} for event in StreamEvent}
for (_state, _event), _next in TRANSITIONS.items():
    AFTER[_event][_state] = _next


def transition(state: StreamState, event: StreamEvent, stream_id: int) -> StreamState:
    """The state after `event`; raises the error the RFC names when the table has no such move."""
    new = TRANSITIONS.get((state, event))
    if new is not None:
        return new
    if event not in _RECEIVED:
        raise RuntimeError(f"stream {stream_id}: cannot {event.value} in state {state.value}")
    if state is S.IDLE:
        raise H2ConnectionError(H2Error.PROTOCOL_ERROR, f"{event.value} on idle stream {stream_id}")
    raise H2StreamError(stream_id, H2Error.STREAM_CLOSED,
                        f"{event.value} on {state.value} stream {stream_id}")
