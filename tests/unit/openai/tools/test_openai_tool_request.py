"""A chat request's tool fields checked (engine/openai/tools/request.py through protocol.py): OpenAI's shapes
accepted, the bounds and malformed ones refused naming the field, tool messages and an assistant's calls
handed to the template (arguments as a dict), and required / named tool_choice refused until enforced."""

from __future__ import annotations

from typing import Any

import pytest

from engine.openai.errors import OpenAIError
from engine.openai.protocol import parse_request
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
    (chat(tools=[TOOL], tool_choice="required"), "tool_choice", "unsupported_value"),
    (chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}}), "tool_choice",
     "unsupported_value"),
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
