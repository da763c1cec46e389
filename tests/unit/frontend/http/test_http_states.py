"""The HTTP/1.1 connection's two state tables (engine/frontend/http/states.py), as plain functions: every
move each table has, and every pair it refuses."""

from __future__ import annotations

import itertools

import pytest

from engine.frontend.http.states import (
    ANSWER_TRANSITIONS,
    ENDED,
    READ_TRANSITIONS,
    AnswerEvent,
    AnswerState,
    ReadEvent,
    ReadState,
    answer_after,
    read_after,
)

R, RE = ReadState, ReadEvent
A, AE = AnswerState, AnswerEvent

# What each side may do, written out once more by hand: the tables are checked against this list.
READ_MOVES = {
    (R.IDLE, RE.BEGIN): R.HEAD,
    (R.HEAD, RE.HEAD_END): R.BODY,
    (R.BODY, RE.COMPLETE): R.IDLE,
    (R.IDLE, RE.STOP): R.STOPPED,
    (R.HEAD, RE.STOP): R.STOPPED,
    (R.BODY, RE.STOP): R.STOPPED,
    (R.STOPPED, RE.STOP): R.STOPPED,
}

ANSWER_MOVES = {
    (A.IDLE, AE.DISPATCH): A.WAITING,
    (A.WAITING, AE.STREAM_CHUNKED): A.STREAMING,
    (A.WAITING, AE.STREAM_TO_CLOSE): A.STREAMING_TO_CLOSE,
    (A.WAITING, AE.ANSWERED): A.IDLE,
    (A.STREAMING, AE.ANSWERED): A.IDLE,
    (A.STREAMING_TO_CLOSE, AE.ANSWERED): A.IDLE,
    (A.IDLE, AE.LINGER): A.LINGERING,
    (A.IDLE, AE.CLOSE): A.CLOSING,
    (A.LINGERING, AE.CLOSE): A.CLOSING,
    **{(state, AE.LOSE): A.GONE for state in AnswerState},
}


def test_the_tables_are_the_moves_written_out():
    assert READ_TRANSITIONS == READ_MOVES
    assert ANSWER_TRANSITIONS == ANSWER_MOVES


@pytest.mark.parametrize("state, event", sorted(READ_MOVES, key=str))
def test_each_read_move(state, event):
    assert read_after(state, event) is READ_MOVES[state, event]


@pytest.mark.parametrize("state, event", sorted(ANSWER_MOVES, key=str))
def test_each_answer_move(state, event):
    assert answer_after(state, event) is ANSWER_MOVES[state, event]


READ_REFUSED = [pair for pair in itertools.product(ReadState, ReadEvent) if pair not in READ_MOVES]
ANSWER_REFUSED = [pair for pair in itertools.product(AnswerState, AnswerEvent) if pair not in ANSWER_MOVES]


@pytest.mark.parametrize("state, event", READ_REFUSED)
def test_every_other_read_move_is_refused(state, event):
    with pytest.raises(RuntimeError, match=state.value):
        read_after(state, event)


@pytest.mark.parametrize("state, event", ANSWER_REFUSED)
def test_every_other_answer_move_is_refused(state, event):
    with pytest.raises(RuntimeError, match=state.value):
        answer_after(state, event)


def test_a_pipelined_request_is_read_while_the_one_before_streams():
    """The two sides move independently: request 2's head and body arrive while request 1's answer streams."""
    read, answer = R.IDLE, A.IDLE
    for event in (RE.BEGIN, RE.HEAD_END, RE.COMPLETE):  # request 1
        read = read_after(read, event)
    answer = answer_after(answer, AE.DISPATCH)
    answer = answer_after(answer, AE.STREAM_CHUNKED)
    read = read_after(read, RE.BEGIN)  # request 2 begins
    read = read_after(read, RE.HEAD_END)
    assert (read, answer) == (R.BODY, A.STREAMING)
    answer = answer_after(answer, AE.ANSWERED)  # request 1's stream ends: request 2 may go
    read = read_after(read, RE.COMPLETE)
    assert (read, answer) == (R.IDLE, A.IDLE)


def test_nothing_is_read_or_answered_once_stopped_or_ended():
    assert not [event for event in ReadEvent if event is not RE.STOP and (R.STOPPED, event) in READ_MOVES]
    for state in ENDED:
        moves = {event for (s, event) in ANSWER_MOVES if s is state}
        assert not moves & {AE.DISPATCH, AE.STREAM_CHUNKED, AE.STREAM_TO_CLOSE, AE.ANSWERED, AE.LINGER}
    assert set(ENDED) == {A.LINGERING, A.CLOSING, A.GONE}


def test_a_close_delimited_stream_then_lingers():
    """Its body ends at our FIN: answered, then our last answer is out."""
    answer = answer_after(answer_after(A.WAITING, AE.STREAM_TO_CLOSE), AE.ANSWERED)
    assert answer_after(answer, AE.LINGER) is A.LINGERING
    assert answer_after(A.LINGERING, AE.CLOSE) is A.CLOSING
    assert answer_after(A.CLOSING, AE.LOSE) is A.GONE
