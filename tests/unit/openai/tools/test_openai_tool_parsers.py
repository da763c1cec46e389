"""The tool call parsers on recorded answers, whole and fed a character at a time or in token-sized pieces
(as a stream may deliver them): calls with text around them, two calls, and malformed ones (an unterminated
tag, bad JSON, a name missing), which stay content as written; streamed, each call's argument fragments
concatenate to the whole answer's `arguments` string."""

from __future__ import annotations

import json
import random

import pytest

from engine.openai.tools import PARSERS
from engine.openai.tools.calls import ARGUMENTS, MAX_CALL_CHARS, OPEN, TEXT, ChoiceCalls, Piece, ToolCall


def read(parser: str, text: str) -> tuple[str | None, list[tuple[str, dict]]]:
    content, calls = ChoiceCalls(PARSERS[parser]()).message(text)
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


def accumulate(pieces: list[Piece]) -> tuple[str, list[ToolCall], dict[int, int]]:
    """What a streaming client rebuilds from the pieces (as the `openai` package's helpers do): the content,
    each call from its opening and its concatenated argument fragments, and how many fragments each had."""
    calls: dict[int, ToolCall] = {}
    fragments: dict[int, int] = {}
    for p in pieces:
        if p.kind == OPEN:
            assert p.call is not None and p.call.arguments == "" and p.index == len(calls)
            calls[p.index] = p.call
            fragments[p.index] = 0
        elif p.kind == ARGUMENTS:
            call = calls[p.index]
            calls[p.index] = ToolCall(call.id, call.name, call.arguments + p.text)
            fragments[p.index] += 1
        else:
            assert p.kind == TEXT and p.call is None
    return "".join(p.text for p in pieces if p.kind == TEXT), list(calls.values()), fragments


def read_streamed(parser: str, text: str, step: int = 1) -> tuple[str, list[tuple[str, dict]]]:
    reading = ChoiceCalls(PARSERS[parser]())
    pieces: list[Piece] = []
    for i in range(0, len(text), step):
        pieces += reading.feed(text[i:i + step], False)
    pieces += reading.feed("", True)
    content, calls, _ = accumulate(pieces)
    assert calls == reading.calls  # the concatenated fragments are each call's arguments
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


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


OPENED_THEN_BROKEN = {"llama3_json: cut short"}


@pytest.mark.parametrize(("parser", "name", "text", "content", "calls"),
                         [("hermes", *case) for case in HERMES] + [("llama3_json", *case) for case in LLAMA3],
                         ids=[f"hermes: {c[0]}" for c in HERMES] + [f"llama3_json: {c[0]}" for c in LLAMA3])
def test_parser_reads_recorded_answers(parser: str, name: str, text: str, content: str | None,
                                       calls: list[tuple[str, dict]]):
    assert read(parser, text) == (content, calls)
    if f"{parser}: {name}" in OPENED_THEN_BROKEN:
        return  # streamed, its opening and fragments went out (test_a_call_broken_after_it_opened)
    for step in (1, 3, 7):  # the same calls however the text is cut into pieces
        streamed_text, streamed_calls = read_streamed(parser, text, step)
        assert streamed_calls == calls
        if not calls:
            assert streamed_text == text


def test_calls_get_openai_ids_and_json_string_arguments():
    _, calls = ChoiceCalls(PARSERS["hermes"]()).message(f"<tool_call>{WEATHER}</tool_call>" * 2)
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id
    assert calls[0].as_message_part() == {"id": calls[0].id, "type": "function", "function": {  # as written
        "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}


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
    assert [p.kind for p in pieces] == [TEXT, OPEN, ARGUMENTS, TEXT]
    assert [p.text for p in pieces if p.kind == TEXT] == ["Hi ", " bye"]


def stream(parser: str, cuts: list[str], parallel: bool = True) -> tuple[ChoiceCalls, list[Piece]]:
    reading = ChoiceCalls(PARSERS[parser](), parallel)
    pieces: list[Piece] = []
    for i, cut in enumerate(cuts):
        pieces += reading.feed(cut, i == len(cuts) - 1)
    return reading, pieces


def tokens(text: str, seed: int) -> list[str]:
    """`text` cut as a tokenizer might: pieces of 1 to 6 characters, cut anywhere (inside tags too)."""
    rng, out, i = random.Random(seed), [], 0
    while i < len(text):
        n = rng.randint(1, 6)
        out.append(text[i:i + n])
        i += n
    return out


STREAMED = [  # recorded answers whose calls stream: their arguments, as the non-streamed answer gives them
    ("hermes", f"Checking.\n<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n"
               '{"name": "get_time", "arguments": {"zone": "CET", "nested": {"a": [1, {"b": "}"}]}}}\n'
               "</tool_call>\nDone.",
     ['{"city": "Paris", "unit": "celsius"}', '{"zone": "CET", "nested": {"a": [1, {"b": "}"}]}}']),
    ("hermes", '<tool_call>{"arguments":{"q":"a \\"quoted\\" </tool_call-like> \\\\"},"name":"search"}'
               "</tool_call>", ['{"q":"a \\"quoted\\" </tool_call-like> \\\\"}']),
    ("llama3_json", '<|python_tag|>{"name": "f", "parameters": {"s": "a } in a string {", "n": -1.5e3}}; '
                    '{"name": "g", "parameters": {}}', ['{"s": "a } in a string {", "n": -1.5e3}', "{}"]),
    ("llama3_json", '{"name": "f", "parameters": {"x": {"y": [true, null]}}} and then some',
     ['{"x": {"y": [true, null]}}']),
]


@pytest.mark.parametrize(("parser", "text", "arguments"), STREAMED)
def test_arguments_stream_as_written_and_concatenate_to_the_whole_answer(parser: str, text: str,
                                                                         arguments: list[str]):
    whole_content, whole = ChoiceCalls(PARSERS[parser]()).message(text)
    assert [c.arguments for c in whole] == arguments
    for cuts in ([text], list(text), *(tokens(text, seed) for seed in range(5))):
        reading, pieces = stream(parser, cuts)
        content, calls, fragments = accumulate(pieces)
        assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole]
        assert calls == reading.calls and (content.strip() or None) == whole_content
        assert reading.finish_reason("stop") == "tool_calls"
        if len(cuts) == len(text) and "search" not in text:  # a character at a time: many fragments
            assert all(fragments[i] >= len(a) - 11 for i, a in enumerate(arguments))


def test_a_call_opens_before_its_arguments_are_complete():
    reading = ChoiceCalls(PARSERS["hermes"]())
    pieces = reading.feed('<tool_call>{"name": "get_weather", "arguments": {"city": "Pa', False)
    assert [(p.kind, p.index) for p in pieces] == [(OPEN, 0), (ARGUMENTS, 0)]
    assert pieces[0].call is not None and pieces[0].call.name == "get_weather"
    assert pieces[1].text == '{"city": "Pa'
    assert [p.text for p in reading.feed('ris"}}</tool_call>', True)] == ['ris"}']


@pytest.mark.parametrize(("text", "arguments"), [
    ('<tool_call>{"arguments": {"a": 1}, "name": "f"}</tool_call>', '{"a": 1}'),  # the name comes last
    ('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', '{"a":1}'),  # a JSON string
    ('<tool_call>{"name": "f"}</tool_call>', "{}"),
])
def test_a_call_whose_arguments_cannot_stream_goes_out_whole(text: str, arguments: str):
    _, whole = ChoiceCalls(PARSERS["hermes"]()).message(text)
    reading, pieces = stream("hermes", list(text))
    assert [p.kind for p in pieces] == [OPEN, ARGUMENTS] and pieces[1].text == arguments
    assert [c.arguments for c in whole] == [arguments]


@pytest.mark.parametrize(("parser", "text", "sent"), [
    ("hermes", '<tool_call>{"name": "f", "arguments": {"x": 1,, }}</tool_call> after', '{"x": 1,, }'),
    ("hermes", '<tool_call>{"name": "f", "arguments": {"x": [1, 2', '{"x": [1, 2'),  # stopped (max_tokens)
    ("llama3_json", '{"name": "f", "parameters": {"x":', '{"x":'),
])
def test_a_call_broken_after_it_opened(parser: str, text: str, sent: str):
    """Streamed, the opening and fragments already sent stand (they cannot be taken back; vLLM's parsers
    leave them too): the call keeps its index and the stream's finish reason is tool_calls, and the rest of
    its text is not sent again as content. The whole answer has no call: the text is content as written."""
    reading, pieces = stream(parser, list(text))
    content, calls, _ = accumulate(pieces)
    assert [(c.name, c.arguments) for c in calls] == [("f", sent)]
    assert content == (" after" if text.endswith(" after") else "")
    assert reading.calls == [] and reading.finish_reason("stop") == "tool_calls"
    whole = ChoiceCalls(PARSERS[parser]())
    assert whole.message(text) == (text, []) and whole.finish_reason("stop") == "stop"


def test_parallel_false_streams_only_the_first_call():
    text = f"<tool_call>{WEATHER}</tool_call><tool_call>" + WEATHER.replace("Paris", "Rome") + "</tool_call>"
    reading, pieces = stream("hermes", list(text), parallel=False)
    _, calls, _ = accumulate(pieces)
    assert [json.loads(c.arguments)["city"] for c in calls] == ["Paris"] and reading.calls == calls


def test_long_arguments_fed_in_small_pieces_stream_whole():
    """The bound's other side: a call just under MAX_CALL_CHARS, cut in 3-character pieces, is read in one
    pass (the scanner never rereads), and its fragments are its arguments."""
    value = "x" * (MAX_CALL_CHARS - 100)
    text = f'<tool_call>{{"name": "f", "arguments": {{"v": "{value}"}}}}</tool_call>'
    reading, pieces = stream("hermes", [text[i:i + 3] for i in range(0, len(text), 3)])
    _, calls, fragments = accumulate(pieces)
    assert calls == reading.calls and calls[0].arguments == f'{{"v": "{value}"}}' and fragments[0] > 1000


@pytest.mark.parametrize("parser, opening", [("hermes", '<tool_call>{"name": "f", "arguments": {"x": "'),
                                             ("llama3_json", '{"name": "f", "parameters": {"x": "')])
def test_a_streaming_call_past_the_bound_stops_and_the_rest_is_content(parser: str, opening: str):
    """Past MAX_CALL_CHARS an opened call stops where it is (what went out stays) and nothing more is
    parsed: the text after it is content, as for a call that never opened."""
    reading = ChoiceCalls(PARSERS[parser]())
    pieces = reading.feed(opening, False)
    for _ in range(MAX_CALL_CHARS // 1000 + 1):
        pieces += reading.feed("y" * 1000, False)
    pieces += reading.feed(f"<tool_call>{WEATHER}</tool_call>", True)
    content, calls, _ = accumulate(pieces)
    assert [c.name for c in calls] == ["f"] and len(calls[0].arguments) > MAX_CALL_CHARS - 1000
    assert content == f"<tool_call>{WEATHER}</tool_call>" and reading.calls == []
