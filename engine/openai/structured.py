"""A request's structured output fields, checked into one `GrammarSpec` (generate/core/grammar.py).

OpenAI's `response_format`: {"type": "text"} (nothing asked), {"type": "json_object"} (any JSON object),
{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}} (a JSON value valid under
`schema`; `strict` is accepted either way: the schema is always enforced). vLLM's `structured_outputs`
(vLLM ≥ 0.12, after the `guided_*` fields it removed): exactly one of `json` (a schema, as an object or its
text), `regex`, `choice` (a list of strings), `grammar` (a context-free grammar, Lark or GBNF/EBNF as vLLM's
xgrammar and guidance backends take) or `json_object: true`, and for JSON `disable_any_whitespace` (no
whitespace between its tokens; by default any, as vLLM's). Served on chat and completions alike, as vLLM
serves them. Everything else in them is refused by name: a constraint is never silently dropped (a 200
without the constraint asked is the one answer this module must never lead to). Whether the spec compiles is
checked against the model's tokenizer later, by the service (`GrammarCompiler.check`), naming the same field.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..generate.core.grammar import (
    ANY_JSON_OBJECT,
    MAX_GRAMMAR_CHARS,
    GrammarKind,
    GrammarSpec,
    constraint_for_json_schema,
)
from .errors import OpenAIError, bad_request

_SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for json_schema.name
_JSON_SCHEMA_KEYS = frozenset({"name", "schema", "strict", "description"})
_STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")
_STRUCTURED_OPTIONS = ("disable_any_whitespace",)  # vLLM's: JSON with no whitespace between its tokens


def structured_spec(doc: dict[str, Any]) -> GrammarSpec | None:
    """The constraint a request body asks for, or None; OpenAIError (400, its field named) for a field this
    server cannot honour."""
    fmt = _response_format(doc.get("response_format"))
    outputs = _structured_outputs(doc.get("structured_outputs"))
    if fmt is not None and outputs is not None:
        raise bad_request("Send one of 'response_format' and 'structured_outputs', not both.",
                          "structured_outputs", "invalid_value")
    return fmt if fmt is not None else outputs


def _response_format(value: Any) -> GrammarSpec | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request(f"{_show(value)} is not of type 'object' - 'response_format'", "response_format")
    kind = value.get("type")
    extra = set(value) - {"type", "json_schema"}
    if extra:
        key = sorted(extra)[0]
        raise bad_request(f"Unrecognized request argument supplied: response_format.{key}",
                          f"response_format.{key}", "unknown_parameter")
    if kind == "text":
        _no_schema(value, kind)
        return None
    if kind == "json_object":
        _no_schema(value, kind)
        return ANY_JSON_OBJECT
    if kind != "json_schema":
        raise bad_request(f"Invalid value: {_show(kind)}. Supported values are: 'text', 'json_object' and "
                          "'json_schema'.", "response_format.type", "invalid_value")
    where = "response_format.json_schema"
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise bad_request(f"Missing required parameter: '{where}'." if spec is None else
                          f"{_show(spec)} is not of type 'object' - '{where}'", where)
    extra = set(spec) - _JSON_SCHEMA_KEYS
    if extra:
        key = sorted(extra)[0]
        raise bad_request(f"Unrecognized request argument supplied: {where}.{key}", f"{where}.{key}",
                          "unknown_parameter")
    name = spec.get("name")
    if name is None:
        raise bad_request(f"Missing required parameter: '{where}.name'.", f"{where}.name")
    if not isinstance(name, str) or not _SCHEMA_NAME.fullmatch(name):
        raise bad_request(f"Invalid '{where}.name': {_show(name)}; it must be 1 to 64 letters, digits, "
                          "underscores or dashes.", f"{where}.name", "invalid_value")
    for key, types in (("strict", (bool,)), ("description", (str,))):
        if spec.get(key) is not None and not isinstance(spec[key], types):
            raise bad_request(f"{_show(spec[key])} is not of type '{types[0].__name__}' - '{where}.{key}'",
                              f"{where}.{key}")
    schema = spec.get("schema")
    if schema is None:  # OpenAI would take any JSON: an empty constraint is refused here, never dropped
        raise bad_request(f"Missing required parameter: '{where}.schema'.", f"{where}.schema")
    if not isinstance(schema, (dict, bool)):
        raise bad_request(f"{_show(schema)} is not of type 'object' - '{where}.schema'", f"{where}.schema")
    return _schema_spec(schema, f"{where}.schema")


def _no_schema(value: dict[str, Any], kind: str) -> None:
    if value.get("json_schema") is not None:
        raise bad_request(f"'response_format.json_schema' is only for type 'json_schema', not {kind!r}.",
                          "response_format.json_schema", "invalid_value")


def _structured_outputs(value: Any) -> GrammarSpec | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request(f"{_show(value)} is not of type 'object' - 'structured_outputs'",
                          "structured_outputs")
    for key in value:
        known = key in _STRUCTURED_KINDS or key in _STRUCTURED_OPTIONS
        if not known and value[key] not in (None, False):
            raise bad_request(f"'structured_outputs.{key}' is not supported by this server; leave it out (it "
                              f"serves {', '.join(_STRUCTURED_KINDS)}).", f"structured_outputs.{key}",
                              "unsupported_parameter")
    asked = [k for k in _STRUCTURED_KINDS if value.get(k) is not None and value.get(k) is not False]
    if len(asked) != 1:
        raise bad_request("'structured_outputs' must hold exactly one of " + ", ".join(_STRUCTURED_KINDS)
                          + f"; got {len(asked)}" + (f" ({', '.join(asked)})" if asked else "") + ".",
                          "structured_outputs", "invalid_value")
    kind = asked[0]
    where, got = f"structured_outputs.{kind}", value[kind]
    compact, option = value.get("disable_any_whitespace"), "structured_outputs.disable_any_whitespace"
    if compact not in (None, True, False):
        raise bad_request(f"{_show(compact)} is not of type 'boolean' - '{option}'", option)
    if compact and kind not in ("json", "json_object"):
        raise bad_request(f"'{option}' is for JSON, not {kind!r}; leave it out.", option, "invalid_value")
    if kind == "json_object":
        if got is not True:
            raise bad_request(f"{_show(got)} is not of type 'boolean' - '{where}'", where)
        return _schema_spec({"type": "object"}, where, True) if compact else ANY_JSON_OBJECT
    if kind == "json":
        if isinstance(got, str):  # vLLM takes the schema as its text too
            try:
                got = json.loads(got)
            except ValueError as e:
                raise bad_request(f"Invalid '{where}': not a JSON schema ({e}).", where,
                                  "invalid_value") from None
        if not isinstance(got, (dict, bool)):
            raise bad_request(f"{_show(got)} is not of type 'object' - '{where}'", where)
        return _schema_spec(got, where, bool(compact))
    if kind == "choice":
        if not isinstance(got, list) or not got or not all(isinstance(c, str) for c in got):
            raise bad_request(f"Invalid '{where}': it must be a non-empty list of strings.", where,
                              "invalid_value")
        return _spec(GrammarKind.CHOICE, json.dumps(got), where)
    if not isinstance(got, str) or not got:
        raise bad_request(f"Invalid '{where}': it must be a non-empty string.", where, "invalid_value")
    return _spec(GrammarKind.REGEX if kind == "regex" else GrammarKind.GRAMMAR, got, where)


def _schema_spec(schema: dict[str, Any] | bool, where: str, compact: bool = False) -> GrammarSpec:
    """`compact`: no whitespace between the JSON's tokens (llguidance's own schema option, x-guidance)."""
    if compact:
        schema = {"anyOf": [schema]} if isinstance(schema, bool) else dict(schema)
        schema["x-guidance"] = {**schema.get("x-guidance", {}), "whitespace_flexible": False}
    text = json.dumps(schema, separators=(",", ":"))
    if len(text) > MAX_GRAMMAR_CHARS:
        raise _too_long(where, len(text))
    return constraint_for_json_schema(schema, where)


def _spec(kind: GrammarKind, text: str, where: str) -> GrammarSpec:
    if len(text) > MAX_GRAMMAR_CHARS:
        raise _too_long(where, len(text))
    return GrammarSpec(kind, text, where)


def _too_long(where: str, length: int) -> OpenAIError:
    return bad_request(f"Invalid '{where}': {length} characters; at most {MAX_GRAMMAR_CHARS}.", where,
                       "string_above_max_length")


def _show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else repr(value)
