"""A chat request's tool fields checked (engine/openai/tools/request.py through protocol.py): OpenAI's shapes
accepted, the bounds and malformed ones refused naming the field, tool messages and an assistant's calls
handed to the template (arguments as a dict), and required / named tool_choice turned into the JSON schema
that constrains the answer to a call (tools/forced.py), and read back."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from engine.generate.core.grammar import GrammarKind
from engine.openai.errors import OpenAIError
from engine.openai.protocol import parse_request
from engine.openai.tools.calls import ARGUMENTS, OPEN, ChoiceCalls
from engine.openai.tools.forced import NamedCallParser, RequiredCallsParser
from engine.openai.tools.request import MAX_TOOL_CHARS, MAX_TOOLS

USER = [{"role": "user", "content": "q"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "d",
                                         "parameters": {"type": "object", "properties": {}}}}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": USER, **fields}


def test_tools_and_their_defaults():
    api = parse_request(chat(tools=[TOOL]), chat=True)
    assert api.tools.tools == (TOOL,) and api.tools.choice == "auto" and api.tools.parses
    assert api.tools.parallel
    none = parse_request(chat(tools=[TOOL], tool_choice="none", parallel_tool_calls=False), chat=True)
    assert none.tools.tools == (TOOL,) and not none.tools.parses and not none.tools.parallel
    assert not parse_request(chat(), chat=True).tools.parses


def test_tool_messages_and_an_assistants_calls_reach_the_template():
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    api = parse_request(chat(messages=messages, tools=[TOOL]), chat=True)
    assert api.messages == (("user", "q"), ("assistant", ""), ("tool", "sunny"))
    assert api.message_fields == ({}, {"content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"x": 1}}}]},
        {"tool_call_id": "call_1"})


def bad(name: str, **changes: Any) -> dict[str, Any]:
    return {**TOOL["function"], "name": name, **changes}


@pytest.mark.parametrize("doc, param, code", [
    (chat(tools={"a": 1}), "tools", "invalid_type"),
    (chat(tools=[TOOL] * (MAX_TOOLS + 1)), "tools", "array_above_max_length"),
    (chat(tools=[{"type": "retrieval"}]), "tools[0]", "invalid_value"),
    (chat(tools=[{"type": "function", "function": bad("has space")}]), "tools[0].function.name",
     "invalid_value"),
    (chat(tools=[TOOL, TOOL]), "tools[1].function.name", "invalid_value"),
    (chat(tools=[{"type": "function", "function": bad("f", parameters=[1])}]), "tools[0].function.parameters",
     "invalid_type"),
    (chat(tools=[{"type": "function", "function": bad("f", extra=1)}]), "tools[0]", "unknown_parameter"),
    (chat(tools=[{"type": "function", "function": bad("f", description="x" * MAX_TOOL_CHARS)}]), "tools[0]",
     "invalid_value"),
    (chat(tool_choice="auto"), "tool_choice", "invalid_value"),  # no tools
    (chat(tools=[TOOL], tool_choice="sometimes"), "tool_choice", "invalid_value"),
    (chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "other"}}), "tool_choice",
     "invalid_value"),
    (chat(tools=[TOOL], tool_choice="required", response_format={"type": "json_object"}), "tool_choice",
     "invalid_value"),
    (chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}},
          structured_outputs={"regex": "a"}), "tool_choice", "invalid_value"),
    (chat(tools=[{"type": "function", "function": bad(f"f{i}", parameters={"description": "x" * 60_000})}
                 for i in range(2)], tool_choice="required"), "tools", "invalid_value"),  # past the grammar's
    (chat(tools=[TOOL], parallel_tool_calls="yes"), "parallel_tool_calls", "invalid_type"),
    (chat(messages=[{"role": "tool", "content": "x"}]), "messages[0].tool_call_id", None),
    (chat(messages=[{"role": "user", "content": "x", "tool_calls": []}]), "messages[0].tool_calls", None),
    (chat(messages=[{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f",
                                                                                  "arguments": "[1]"}}]}]),
     "messages[0].tool_calls[0].function.arguments", "invalid_value"),
    (chat(messages=[{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]),
     "messages[0].tool_calls[0]", "invalid_value"),
    ({"model": "m", "prompt": "x", "tools": [TOOL]}, "tools", "unsupported_parameter"),
])
def test_refusals_name_the_field(doc: dict[str, Any], param: str, code: str | None):
    with pytest.raises(OpenAIError) as err:
        parse_request(doc, chat="messages" in doc)
    assert (err.value.status, err.value.param, err.value.code) == (400, param, code)


NAMED = {"type": "function", "function": {"name": "get_weather"}}


def test_named_and_required_constrain_the_answer_to_a_call():
    assert parse_request(chat(tools=[TOOL]), chat=True).structured is None  # auto: the model's own words
    named = parse_request(chat(tools=[TOOL], tool_choice=NAMED), chat=True).structured
    assert named is not None and named.kind is GrammarKind.JSON_SCHEMA and named.param == "tools"
    assert json.loads(named.text) == {"type": "object", "properties": {},
                                      "x-guidance": {"whitespace_flexible": False}}
    other = {"type": "function", "function": {"name": "now"}}
    required = parse_request(chat(tools=[TOOL, other], tool_choice="required", parallel_tool_calls=False),
                             chat=True).structured
    assert required is not None
    schema = json.loads(required.text)
    assert (schema["type"], schema["minItems"], schema["maxItems"]) == ("array", 1, 1)
    assert [item["properties"]["name"] for item in schema["items"]["anyOf"]] == [
        {"type": "string", "enum": ["get_weather"]}, {"type": "string", "enum": ["now"]}]
    assert schema["items"]["anyOf"][1]["properties"]["parameters"] == {"type": "object"}


def test_a_named_choice_leaves_the_tools_the_template_renders_as_they_were_sent():
    sent = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    api = parse_request(chat(tools=[copy.deepcopy(sent)], tool_choice=NAMED), chat=True)
    assert api.structured is not None and api.tools.tools == (sent,)


def test_the_forced_forms_are_read_back_as_calls():
    named = ChoiceCalls(NamedCallParser("get_weather"))
    content, calls = named.message('{"city":"Paris"}')
    assert content is None and [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city":"Paris"}')]
    required = ChoiceCalls(RequiredCallsParser())
    content, calls = required.message('[{"name":"a","parameters":{}},{"name":"b","parameters":{"x":1}}]')
    assert content is None and [(c.name, c.arguments) for c in calls] == [("a", "{}"), ("b", '{"x":1}')]
    cut = ChoiceCalls(NamedCallParser("get_weather"))  # stopped by max_tokens: content as written
    assert cut.message('{"city":"Pa') == ('{"city":"Pa', [])


def test_a_named_call_streams_its_arguments_as_they_come():
    reading = ChoiceCalls(NamedCallParser("get_weather"))
    pieces = reading.feed('{"city"', False) + reading.feed(':"Paris"}', True)
    assert [(p.kind, p.index, p.text) for p in pieces] == [
        (OPEN, 0, ""), (ARGUMENTS, 0, '{"city"'), (ARGUMENTS, 0, ':"Paris"}')]
    assert pieces[0].call is not None and pieces[0].call.name == "get_weather"
    assert [(c.id, c.arguments) for c in reading.calls] == [(pieces[0].call.id, '{"city":"Paris"}')]
    cut = ChoiceCalls(NamedCallParser("get_weather"))  # stopped by max_tokens: what was sent stands
    assert [p.kind for p in cut.feed('{"city":"Pa', True)] == [OPEN, ARGUMENTS]
    assert cut.calls == [] and cut.finish_reason("length") == "length"
