"""tool_choice "required" and a named function streamed (engine/openai/tools/forced.py): answers the Qwen2
fixture model wrote under the grammar that forces the call, recorded token by token as the server
delivered them, fed back one token at a time. Each call opens (its name, empty arguments) before its
arguments are complete, its arguments follow a fragment per token, and the fragments concatenate to exactly
the `arguments` the whole answer gives; an answer cut by max_tokens keeps what was sent."""

from __future__ import annotations

import json

import pytest

from engine.openai.tools.calls import ARGUMENTS, BROKEN, OPEN, TEXT, ChoiceCalls, Piece, ToolCall
from engine.openai.tools.forced import NamedCallParser, RequiredCallsParser

# qwen2, tool_choice "required", temperature 1, seed 0: two calls (the tool's one argument an enum of one)
REQUIRED_TWO = [
    "[", "{", '"', "n", "ame", '"', ":", '"', "g", "et", "_", "w", "e", "a", "ther", '"', ",", '"', "par",
    "am", "et", "er", "s", '"', ":", "{", '"', "ci", "ty", '"', ":", '"', "P", "a", "ris", '"', "}", "}", ",",
    "{", '"', "n", "ame", '"', ":", '"', "g", "et", "_", "w", "e", "a", "ther", '"', ",", '"', "par", "am",
    "et", "er", "s", '"', ":", "{", '"', "ci", "ty", '"', ":", '"', "P", "a", "ris", '"', "}", "}", "]"]
# seed 3: a third call whose arguments go on with a key the schema allows (no additionalProperties: false),
# here cut after 125 tokens as max_tokens cuts it
REQUIRED_CUT = REQUIRED_TWO[:-1] + [
    ",", "{", '"', "n", "ame", '"', ":", '"', "g", "et", "_", "w", "e", "a", "ther", '"', ",", '"', "par",
    "am", "et", "er", "s", '"', ":", "{", '"', "ci", "ty", '"', ":", '"', "P", "a", "ris", '"', ",", '"',
    " here", "ar", "por", " En", "\u2c2d", "ed", " this", "pla", "\u7e1f", "ve", "th"]
# the named function get_weather, greedy
NAMED = ["{", '"', "ci", "ty", '"', ":", '"', "P", "a", "ris", '"', "}"]
PARIS = '{"city":"Paris"}'


def streamed(reading: ChoiceCalls, tokens: list[str]) -> list[Piece]:
    pieces: list[Piece] = []
    for token in tokens:
        pieces += reading.feed(token, False)
    return pieces + reading.feed("", True)


def rebuilt(pieces: list[Piece]) -> tuple[list[ToolCall], list[int]]:
    """What a client rebuilds from the stream: each call from its opening and its fragments (and how many
    fragments each had); no content."""
    calls: list[ToolCall] = []
    fragments: list[int] = []
    for p in pieces:
        assert p.kind in (OPEN, ARGUMENTS), p
        if p.kind == OPEN:
            assert p.call is not None and p.call.arguments == "" and p.index == len(calls)
            calls.append(p.call)
            fragments.append(0)
        else:
            call = calls[p.index]
            calls[p.index] = ToolCall(call.id, call.name, call.arguments + p.text)
            fragments[p.index] += 1
    return calls, fragments


def test_required_calls_stream_a_fragment_per_token():
    reading = ChoiceCalls(RequiredCallsParser())
    pieces = streamed(reading, REQUIRED_TWO)
    calls, fragments = rebuilt(pieces)
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", PARIS)] * 2
    assert fragments == [len(NAMED)] * 2  # the arguments' tokens, each as it came
    assert calls == reading.calls and reading.finish_reason("stop") == "tool_calls"
    # the first call opens before its arguments begin, the second after the first closed
    assert pieces.index(next(p for p in pieces if p.kind == OPEN and p.index == 1)) == len(NAMED) + 1


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_required_fragments_join_to_the_whole_answers_arguments(step: int):
    text = "".join(REQUIRED_TWO)
    content, whole = ChoiceCalls(RequiredCallsParser()).message(text)
    reading = ChoiceCalls(RequiredCallsParser())
    calls, _ = rebuilt(streamed(reading, [text[i:i + step] for i in range(0, len(text), step)]))
    assert content is None
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole]


def test_required_cut_by_max_tokens_keeps_what_was_sent():
    reading = ChoiceCalls(RequiredCallsParser())
    calls, _ = rebuilt(streamed(reading, REQUIRED_CUT))
    third = "".join(REQUIRED_CUT[REQUIRED_CUT.index("par", 60) + 7:])  # the third call's arguments so far
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", PARIS)] * 2 + [("get_weather", third)]
    assert len(reading.calls) == 2 and reading.finish_reason("length") == "length"
    # whole, the two complete calls stand and the cut one is content as written
    content, whole = ChoiceCalls(RequiredCallsParser()).message("".join(REQUIRED_CUT))
    assert [(c.name, c.arguments) for c in whole] == [("get_weather", PARIS)] * 2
    assert content == '{"name":"get_weather","parameters":' + third


def test_required_cut_before_a_call_opened_is_content():
    tokens = REQUIRED_TWO[:20]  # `[{"name":"get_weather","par`
    reading = ChoiceCalls(RequiredCallsParser())
    pieces = streamed(reading, tokens)
    assert [(p.kind, p.text) for p in pieces] == [(TEXT, "".join(tokens))] and reading.calls == []
    assert ChoiceCalls(RequiredCallsParser()).message("".join(tokens)) == ("".join(tokens), [])


def test_required_with_parallel_false_streams_only_the_first_call():
    reading = ChoiceCalls(RequiredCallsParser(), parallel=False)
    calls, _ = rebuilt(streamed(reading, REQUIRED_TWO))
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", PARIS)] and len(reading.calls) == 1


def test_a_named_call_streams_a_fragment_per_token():
    reading = ChoiceCalls(NamedCallParser("get_weather"))
    calls, fragments = rebuilt(streamed(reading, NAMED))
    _, whole = ChoiceCalls(NamedCallParser("get_weather")).message("".join(NAMED))
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole] == [
        ("get_weather", PARIS)]
    assert fragments == [len(NAMED)] and reading.finish_reason("stop") == "tool_calls"


def test_what_the_form_does_not_allow_is_content():
    """Not written under the grammar (it cannot be): the parser does not lose it."""
    assert ChoiceCalls(RequiredCallsParser()).message("no call") == ("no call", [])
    assert ChoiceCalls(RequiredCallsParser()).message("[]") == ("[]", [])
    content, calls = ChoiceCalls(RequiredCallsParser()).message(f'[{{"name":"a","parameters":{PARIS}}}] and')
    assert (content, [(c.name, c.arguments) for c in calls]) == ("and", [("a", PARIS)])
    reading = ChoiceCalls(RequiredCallsParser())
    pieces = streamed(reading, ['[{"name":"a","parameters":{}}', ',{"name":"b","parameters":[1]}]'])
    assert [p.kind for p in pieces] == [OPEN, ARGUMENTS] and [c.name for c in reading.calls] == ["a"]
    assert BROKEN not in [p.kind for p in pieces]  # ChoiceCalls keeps a broken call out of the stream
    assert json.loads(reading.calls[0].arguments) == {}
