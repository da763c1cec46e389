"""The tool call parsers on recorded answers, whole and fed a character at a time (as a stream may deliver
them): calls with text around them, two calls, and malformed ones (an unterminated tag, bad JSON, a name
missing), which stay content as written."""

from __future__ import annotations

import json

import pytest

from engine.openai.tools import PARSERS
from engine.openai.tools.calls import MAX_CALL_CHARS, ChoiceCalls, Piece, ToolCall


def read(parser: str, text: str) -> tuple[str | None, list[tuple[str, dict]]]:
    content, calls = ChoiceCalls(PARSERS[parser]()).message(text)
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


def read_streamed(parser: str, text: str, step: int = 1) -> tuple[str, list[tuple[str, dict]]]:
    reading = ChoiceCalls(PARSERS[parser]())
    pieces: list[Piece] = []
    for i in range(0, len(text), step):
        pieces += reading.feed(text[i:i + step], False)
    pieces += reading.feed("", True)
    calls = [p.call for p in pieces if p.call is not None]
    assert calls == reading.calls
    return "".join(p.text for p in pieces), [(c.name, json.loads(c.arguments)) for c in calls]


WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'

HERMES = [
    ("one call", f"<tool_call>\n{WEATHER}\n</tool_call>",
     None, [("get_weather", {"city": "Paris", "unit": "celsius"})]),
    ("text before and after", f"Let me look.\n<tool_call>\n{WEATHER}\n</tool_call>\nDone.",
     "Let me look.\n\nDone.", [("get_weather", {"city": "Paris", "unit": "celsius"})]),
    ("two calls", f"<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n"
                  '{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>',
     None, [("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_time", {"zone": "CET"})]),
    ("arguments as a JSON string", '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
     None, [("f", {"a": 1})]),
    ("no arguments", '<tool_call>{"name": "now"}</tool_call>', None, [("now", {})]),
    ("unterminated, JSON complete", f"<tool_call>\n{WEATHER}\n",
     None, [("get_weather", {"city": "Paris", "unit": "celsius"})]),
    ("unterminated, JSON cut", '<tool_call>\n{"name": "get_weather", "argu',
     '<tool_call>\n{"name": "get_weather", "argu', []),
    ("bad JSON", "a <tool_call>{name: f}</tool_call> b", "a <tool_call>{name: f}</tool_call> b", []),
    ("no name", '<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),
    ("arguments not an object", '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
     '<tool_call>{"name": "f", "arguments": [1]}</tool_call>', []),
    ("a bad call beside a good one", f"<tool_call>oops</tool_call><tool_call>{WEATHER}</tool_call>",
     "<tool_call>oops</tool_call>", [("get_weather", {"city": "Paris", "unit": "celsius"})]),
    ("plain text", "Paris is sunny today.", "Paris is sunny today.", []),
    ("a tag's beginning at the end", "Paris <tool_", "Paris <tool_", []),
]

LLAMA3 = [
    ("one call", '{"name": "get_weather", "parameters": {"city": "Paris"}}', None,
     [("get_weather", {"city": "Paris"})]),
    ("after the python tag", '<|python_tag|>{"name": "f", "parameters": {"x": 1}}', None, [("f", {"x": 1})]),
    ("arguments instead of parameters", ' {"name": "f", "arguments": {"x": 1}}', None, [("f", {"x": 1})]),
    ("two calls after ;", '{"name": "f", "parameters": {"s": "a } in a string {"}}; '
                          '{"name": "g", "parameters": {}}', None,
     [("f", {"s": "a } in a string {"}), ("g", {})]),
    ("text after a call", '{"name": "f", "parameters": {}} and then some', "and then some", [("f", {})]),
    ("plain text", "The weather is {sunny}.", "The weather is {sunny}.", []),
    ("not a call", '{"city": "Paris"}', '{"city": "Paris"}', []),
    ("cut short", '{"name": "f", "parameters": {"x":', '{"name": "f", "parameters": {"x":', []),
    ("escaped quote in a string", '{"name": "f", "parameters": {"q": "say \\"}\\""}}', None,
     [("f", {"q": 'say "}"'})]),
]


@pytest.mark.parametrize(("parser", "name", "text", "content", "calls"),
                         [("hermes", *case) for case in HERMES] + [("llama3_json", *case) for case in LLAMA3],
                         ids=[f"hermes: {c[0]}" for c in HERMES] + [f"llama3_json: {c[0]}" for c in LLAMA3])
def test_parser_reads_recorded_answers(parser: str, name: str, text: str, content: str | None,
                                       calls: list[tuple[str, dict]]):
    assert read(parser, text) == (content, calls)
    for step in (1, 3, 7):  # the same calls however the text is cut into pieces
        streamed_text, streamed_calls = read_streamed(parser, text, step)
        assert streamed_calls == calls
        if not calls:
            assert streamed_text == text


def test_calls_get_openai_ids_and_json_string_arguments():
    _, calls = ChoiceCalls(PARSERS["hermes"]()).message(f"<tool_call>{WEATHER}</tool_call>" * 2)
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id
    assert calls[0].as_message_part() == {"id": calls[0].id, "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city":"Paris","unit":"celsius"}'}}


def test_parallel_false_keeps_the_first_call():
    reading = ChoiceCalls(PARSERS["hermes"](), parallel=False)
    content, calls = reading.message(f"<tool_call>{WEATHER}</tool_call><tool_call>{WEATHER}</tool_call>")
    assert content is None and [c.name for c in calls] == ["get_weather"]


def test_finish_reason_is_tool_calls_only_for_an_answer_that_stopped():
    reading = ChoiceCalls(PARSERS["hermes"]())
    reading.message(f"<tool_call>{WEATHER}</tool_call>")
    assert (reading.finish_reason("stop"), reading.finish_reason("length")) == ("tool_calls", "length")
    assert ChoiceCalls(PARSERS["hermes"]()).finish_reason("stop") == "stop"


@pytest.mark.parametrize("parser, opening",
                         [("hermes", "<tool_call>"), ("llama3_json", '{"name": "f", "x": "')])
def test_a_call_past_the_bound_is_content_and_parsing_stops(parser: str, opening: str):
    reading = ChoiceCalls(PARSERS[parser]())
    pieces = reading.feed(opening, False)
    chunk = "y" * 1000
    fed = opening
    while len(fed) <= MAX_CALL_CHARS + len(chunk):
        pieces += reading.feed(chunk, False)
        fed += chunk
    after = f"<tool_call>{WEATHER}</tool_call>"  # no longer read as a call
    pieces += reading.feed(after, True)
    assert not reading.calls and "".join(p.text for p in pieces) == fed + after


def test_stream_pieces_come_in_order():
    reading = ChoiceCalls(PARSERS["hermes"]())
    pieces = reading.feed(f"Hi <tool_call>{WEATHER}</tool_call> bye", True)
    assert [p.text for p in pieces if p.call is None] == ["Hi ", " bye"]
    assert isinstance(pieces[1].call, ToolCall)
