"""A chat request's tool fields, checked: `tools`, `tool_choice`, `parallel_tool_calls`, and the tool parts
of its messages (an assistant message's `tool_calls`, a `tool` message's `tool_call_id`).

Called by protocol.py `parse_request` for chat, once per request, with OpenAI's error shape (`param` names
the field). What is checked is bounded: at most MAX_TOOLS tools of at most MAX_TOOL_CHARS characters each
as JSON, at most MAX_TOOLS calls in one assistant message. The tools go to the model's chat template as
sent (the `tools` render variable, transformers' shape: [{"type": "function", "function": {name,
description, parameters}}]); an assistant message's calls go to it as transformers documents them, with
each call's `arguments` a dict (OpenAI sends a JSON string: it is parsed here, and must be an object).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from ..errors import bad_request

MAX_TOOLS = 128  # OpenAI's limit on `tools`
MAX_TOOL_CHARS = 64 * 1024  # one tool's definition as JSON
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name


class ToolChoice:
    NONE = "none"
    AUTO = "auto"
    REQUIRED = "required"


@dataclass(frozen=True, slots=True)
class ToolRequest:
    """The checked tool fields. `choice`: "none", "auto", "required", or the name of the one function the
    request asks for (`named` true)."""

    tools: tuple[dict[str, Any], ...] = ()
    choice: str = ToolChoice.NONE
    named: bool = False
    parallel: bool = True  # parallel_tool_calls: false keeps at most one call per choice

    @property
    def parses(self) -> bool:
        """Whether the answer is parsed for tool calls."""
        return bool(self.tools) and self.choice != ToolChoice.NONE


def parse_tools(doc: dict[str, Any]) -> ToolRequest:
    tools = _tools(doc.get("tools"))
    choice, named = _choice(doc.get("tool_choice"), tools)
    parallel = doc.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request(f"{_show(parallel)} is not of type 'boolean' - 'parallel_tool_calls'",
                          "parallel_tool_calls", "invalid_type")
    return ToolRequest(tools, choice, named, parallel is not False)


def _tools(value: Any) -> tuple[dict[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise bad_request(f"{_show(value)} is not of type 'array' - 'tools'", "tools", "invalid_type")
    if len(value) > MAX_TOOLS:
        raise bad_request(f"Invalid 'tools': array too long. Expected an array with maximum length "
                          f"{MAX_TOOLS}, but got an array with length {len(value)} instead.", "tools",
                          "array_above_max_length")
    seen: set[str] = set()
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise bad_request(f"Invalid '{where}': each tool must be {{\"type\": \"function\", \"function\": "
                              "{...}}.", where, "invalid_value")
        size = len(orjson.dumps(tool))
        if size > MAX_TOOL_CHARS:
            raise bad_request(f"Invalid '{where}': its definition has {size} characters as JSON; at most "
                              f"{MAX_TOOL_CHARS} are taken.", where, "invalid_value")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise bad_request(f"Missing required parameter: '{where}.function'.", f"{where}.function")
        unknown = sorted(set(tool) - {"type", "function"}) + \
            sorted(set(function) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise bad_request(f"Invalid '{where}': unknown fields {unknown}.", where, "unknown_parameter")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise bad_request(f"Invalid '{where}.function.name': {_show(name)} does not match "
                              "'^[a-zA-Z0-9_-]{1,64}$'.", f"{where}.function.name", "invalid_value")
        if name in seen:
            raise bad_request(f"Invalid '{where}.function.name': '{name}' names two tools.",
                              f"{where}.function.name", "invalid_value")
        seen.add(name)
        for key, kind, name in (("description", str, "string"), ("parameters", dict, "object"),
                                ("strict", bool, "boolean")):
            field = function.get(key)
            if field is not None and not isinstance(field, kind):
                raise bad_request(f"{_show(field)} is not of type '{name}' - '{where}.function.{key}'",
                                  f"{where}.function.{key}", "invalid_type")
    return tuple(value)


def _choice(value: Any, tools: tuple[dict[str, Any], ...]) -> tuple[str, bool]:
    if value is None:  # OpenAI's default: auto with tools, none without
        return (ToolChoice.AUTO if tools else ToolChoice.NONE), False
    if value == ToolChoice.NONE:
        return ToolChoice.NONE, False
    if not tools:
        raise bad_request("Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are "
                          "specified.", "tool_choice", "invalid_value")
    if value in (ToolChoice.AUTO, ToolChoice.REQUIRED):
        return value, False
    function = value.get("function") if isinstance(value, dict) else None
    if isinstance(function, dict) and value.get("type") == "function":
        name = function.get("name")
        if name not in {t["function"]["name"] for t in tools}:
            raise bad_request(f"Invalid value for 'tool_choice': no function named {_show(name)} is in "
                              "'tools'.", "tool_choice", "invalid_value")
        return str(name), True
    raise bad_request(f"Invalid value for 'tool_choice': {_show(value)}; send 'none', 'auto', 'required' or "
                      "{\"type\": \"function\", \"function\": {\"name\": ...}}.", "tool_choice",
                      "invalid_value")


def message_fields(message: dict[str, Any], role: str, where: str) -> dict[str, Any]:
    """The tool parts of one message, as the template gets them beside its role and content: an assistant
    message's `tool_calls` (and `content` None when it has none), a tool message's `tool_call_id`; {} for
    others. A tool message without a `tool_call_id`, or calls that are not OpenAI's shape, are refused."""
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise bad_request(f"Missing required parameter: '{where}.tool_call_id'.", f"{where}.tool_call_id")
        return {"tool_call_id": call_id}
    calls = message.get("tool_calls")
    if role != "assistant" or calls is None:
        if calls is not None:
            raise bad_request(f"'{where}.tool_calls' is only allowed on assistant messages.",
                              f"{where}.tool_calls")
        return {}
    if not isinstance(calls, list) or len(calls) > MAX_TOOLS:
        raise bad_request(f"'{where}.tool_calls' must be an array of at most {MAX_TOOLS} calls.",
                          f"{where}.tool_calls", "invalid_value")
    out = []
    for i, call in enumerate(calls):
        here = f"{where}.tool_calls[{i}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function" or \
                not isinstance(call.get("id"), str) or not isinstance(function.get("name"), str):
            raise bad_request(f"Invalid '{here}': a call is {{\"id\", \"type\": \"function\", \"function\": "
                              "{\"name\", \"arguments\"}}.", here, "invalid_value")
        arguments = _arguments(function.get("arguments"), f"{here}.function.arguments")
        out.append({"id": call["id"], "type": "function",
                    "function": {"name": function["name"], "arguments": arguments}})
    fields: dict[str, Any] = {"tool_calls": out}
    if message.get("content") is None:
        fields["content"] = None
    return fields


def _arguments(value: Any, where: str) -> dict[str, Any]:
    """A call's arguments as the template takes them: a dict (transformers: templates write them with
    `tojson`), from OpenAI's JSON string."""
    if isinstance(value, dict):
        return value
    try:
        parsed = orjson.loads(value) if isinstance(value, str) else None
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise bad_request(f"Invalid '{where}': {_show(value)} is not a JSON object in a string.", where,
                          "invalid_value")
    return parsed


def _show(value: Any) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= 60 else text[:57] + "..."
