"""The life of one HTTP/1.1 connection (RFC 9112), as two tables: state × event → next state.

Why two: the client's side and ours move independently. A pipelining client sends its next request while
we are still answering the one before, so "reading a body" and "streaming an answer" are both true at
once (h11's `_state.py` keeps the same two sides). Why tables: which move is allowed when is then read in
one place, and everything connection.py does with a connection follows from the state it is in, instead of
from a dozen flags that together meant the same thing.

`ReadState`, the request being read (the parser's side): IDLE between requests, HEAD from a request's first
byte to the end of its header fields, BODY until the message ends, and STOPPED once nothing more is parsed
(the client broke a rule, or our last answer is out): what it still sends is discarded.

`AnswerState`, our side: IDLE with nothing in flight, WAITING for the answer of the one dispatched request,
STREAMING its answer (chunked, or to the close: a close-delimited body), then, once the connection is
ending, LINGERING (our last answer is out and our FIN follows it; we read and discard until the client
closes or falls silent), CLOSING (the transport is closing and flushes what we wrote) and GONE (the client
went away, or we dropped it). Answers leave in request order, one at a time, so this side needs no more.

What is not a state: a parsed request waiting behind the one in flight sits in connection.py's queue, and
reading is paused exactly while that queue is not empty; a transport that will take no more of our writes
is timed (`pause_writing`), not stated. connection.py moves both states through `read_after` and
`answer_after`. A move the table does not have is a bug of ours, never the client's: llhttp refuses what
the client gets wrong before the table is asked. So a refused move raises RuntimeError.
"""

from __future__ import annotations

import enum
from typing import NoReturn


class ReadState(enum.Enum):
    IDLE = "idle"  # between requests: the next byte begins a head
    HEAD = "head"  # request line and header fields arriving (their time runs from the first byte)
    BODY = "body"  # header fields in, the body arriving (until the message ends)
    STOPPED = "stopped"  # nothing more is parsed: what the client still sends is discarded

    # Members are singletons compared by identity: identity hashing makes the table lookup a C call.
    __hash__ = object.__hash__


class ReadEvent(enum.Enum):
    BEGIN = "a request's first byte"  # llhttp's on_message_begin
    HEAD_END = "the end of its header fields"  # on_headers_complete
    COMPLETE = "the end of the message"  # on_message_complete
    STOP = "stop reading"  # the client broke a rule, or the connection is ending

    __hash__ = object.__hash__


class AnswerState(enum.Enum):
    IDLE = "idle"  # nothing in flight
    WAITING = "waiting"  # one request dispatched to the routes; its answer not begun
    STREAMING = "streaming"  # its streamed answer's head is out, the body goes in chunks
    STREAMING_TO_CLOSE = "streaming to the close"  # head out, the body ends at our FIN (no length, no chunks)
    LINGERING = "lingering"  # our last answer written, FIN after it; reading and discarding
    CLOSING = "closing"  # the transport is closing: it flushes our answers, then goes
    GONE = "gone"  # the client went away, or we dropped the connection

    __hash__ = object.__hash__


class AnswerEvent(enum.Enum):
    DISPATCH = "dispatch a request whose answer comes later"
    STREAM_CHUNKED = "start a chunked streamed answer"
    STREAM_TO_CLOSE = "start a close-delimited streamed answer"
    ANSWERED = "the request in flight is answered"  # its future resolved: answer written, or stream ended
    LINGER = "write our last answer"  # Connection: close, an error, or draining
    CLOSE = "close the transport"  # idle or draining, or a lingering client fell silent
    LOSE = "lose the connection"  # connection_lost, a refused connection, or an abort

    __hash__ = object.__hash__


R, RE = ReadState, ReadEvent
A, AE = AnswerState, AnswerEvent

READ_TRANSITIONS: dict[tuple[ReadState, ReadEvent], ReadState] = {
    # one request: head, body, done; then the next one may begin (pipelined or later)
    (R.IDLE, RE.BEGIN): R.HEAD,
    (R.HEAD, RE.HEAD_END): R.BODY,
    (R.BODY, RE.COMPLETE): R.IDLE,
    # stopping: from anywhere, for good
    (R.IDLE, RE.STOP): R.STOPPED,
    (R.HEAD, RE.STOP): R.STOPPED,
    (R.BODY, RE.STOP): R.STOPPED,
    (R.STOPPED, RE.STOP): R.STOPPED,
}

ANSWER_TRANSITIONS: dict[tuple[AnswerState, AnswerEvent], AnswerState] = {
    # one request in flight at a time; an answer at once (or a refusal) never leaves IDLE
    (A.IDLE, AE.DISPATCH): A.WAITING,
    (A.WAITING, AE.STREAM_CHUNKED): A.STREAMING,
    (A.WAITING, AE.STREAM_TO_CLOSE): A.STREAMING_TO_CLOSE,
    (A.WAITING, AE.ANSWERED): A.IDLE,
    (A.STREAMING, AE.ANSWERED): A.IDLE,
    (A.STREAMING_TO_CLOSE, AE.ANSWERED): A.IDLE,  # and LINGER follows: the close ends its body
    # ending: our last answer is written with nothing in flight; then the close
    (A.IDLE, AE.LINGER): A.LINGERING,
    (A.IDLE, AE.CLOSE): A.CLOSING,
    (A.LINGERING, AE.CLOSE): A.CLOSING,
    # losing: from anywhere (an abort may drop a request in flight: connection_lost cancels it)
    **{(state, AE.LOSE): A.GONE for state in AnswerState},
}

# No more answers on the connection: the request path's "is it over" test, one set lookup.
ENDED = frozenset((A.LINGERING, A.CLOSING, A.GONE))

# The tables by event, for the request path: `READ_AFTER[event].get(state) or read_refused(state, event)` is
# one dict lookup, builds no tuple and calls nothing on a move the table has (each request makes five).
READ_AFTER: dict[ReadEvent, dict[ReadState, ReadState]] = {event: {} for event in ReadEvent}
for (_read, _read_event), _read_next in READ_TRANSITIONS.items():
    READ_AFTER[_read_event][_read] = _read_next
ANSWER_AFTER: dict[AnswerEvent, dict[AnswerState, AnswerState]] = {event: {} for event in AnswerEvent}
for (_answer, _answer_event), _answer_next in ANSWER_TRANSITIONS.items():
    ANSWER_AFTER[_answer_event][_answer] = _answer_next


def read_after(state: ReadState, event: ReadEvent) -> ReadState:
    """The read side's state after `event`; RuntimeError when the table has no such move (our bug)."""
    return READ_AFTER[event].get(state) or read_refused(state, event)


def answer_after(state: AnswerState, event: AnswerEvent) -> AnswerState:
    """Our side's state after `event`; RuntimeError when the table has no such move (our bug)."""
    return ANSWER_AFTER[event].get(state) or answer_refused(state, event)


def read_refused(state: ReadState, event: ReadEvent) -> NoReturn:
    raise RuntimeError(f"HTTP/1.1 connection: {event.value} while reading is {state.value}")


def answer_refused(state: AnswerState, event: AnswerEvent) -> NoReturn:
    raise RuntimeError(f"HTTP/1.1 connection: cannot {event.value} while {state.value}")


__all__ = ["ANSWER_AFTER", "ANSWER_TRANSITIONS", "ENDED", "READ_AFTER", "READ_TRANSITIONS", "AnswerEvent",
           "AnswerState", "ReadEvent", "ReadState", "answer_after", "answer_refused", "read_after",
           "read_refused"]
