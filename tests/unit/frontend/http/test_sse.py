"""engine/frontend/http/sse.py: event and chunk framing, and the client's reader, pure."""

from __future__ import annotations

import orjson

from engine.frontend.http import sse


def test_one_event_per_payload_as_triton_writes_it():
    assert sse.data_event(b'{"a":1}') == b'data: {"a":1}\n\n'


def test_error_event_is_an_error_object():
    event = sse.error_event('bad "x"')
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert orjson.loads(event[6:-2]) == {"error": 'bad "x"'}


def test_line_breaks_become_one_data_line_each_and_read_back_joined():
    event = sse.data_event(b"one\ntwo\r\nthree")
    assert event == b"data: one\ndata: two\ndata: three\n\n"
    assert sse.EventReader().feed(event) == [b"one\ntwo\nthree"]


def test_reader_takes_events_split_anywhere():
    stream = sse.data_event(b'{"n":1}') + sse.error_event("stop")
    for cut in range(len(stream) + 1):
        reader = sse.EventReader()
        events = reader.feed(stream[:cut]) + reader.feed(stream[cut:])
        assert events == [b'{"n":1}', b'{"error":"stop"}'], cut


def test_reader_skips_comments_other_fields_and_empty_events():
    assert sse.EventReader().feed(b": keep-alive\n\nevent: x\nid: 3\ndata:v\r\n\r\n\n") == [b"v"]


def test_chunk_framing():
    assert sse.chunk(b"hello") == b"5\r\nhello\r\n"
    assert sse.chunk(b"x" * 26) == b"1a\r\n" + b"x" * 26 + b"\r\n"
    assert sse.chunk(b"") == b""  # an empty chunk would end the body
    assert sse.LAST_CHUNK == b"0\r\n\r\n"
