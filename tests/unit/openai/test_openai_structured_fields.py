"""A request's structured output fields checked into one GrammarSpec (engine/openai/structured.py): which
spec each form gives, and which field a refusal names. Pure: no server (test_openai_structured.py in
tests/functional serves them)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.generate.core.grammar import GrammarKind
from engine.openai.errors import OpenAIError
from engine.openai.protocol import parse_request

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def parse(**fields: Any) -> Any:
    return parse_request({"model": "m", "prompt": "x", **fields}, chat=False).structured


def test_each_form_gives_its_spec_and_names_its_field():
    spec = parse(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}})
    assert spec.kind is GrammarKind.JSON_SCHEMA and json.loads(spec.text) == SCHEMA
    assert spec.param == "response_format.json_schema.schema"
    assert json.loads(parse(response_format={"type": "json_object"}).text) == {"type": "object"}
    assert parse(structured_outputs={"regex": "a+"}).text == "a+"
    assert parse(structured_outputs={"regex": "a+"}).param == "structured_outputs.regex"
    assert json.loads(parse(structured_outputs={"choice": ["x", "y"]}).text) == ["x", "y"]
    assert parse(structured_outputs={"grammar": 'root ::= "a"'}).kind is GrammarKind.GRAMMAR
    assert json.loads(parse(structured_outputs={"json": json.dumps(SCHEMA)}).text) == SCHEMA
    compact = json.loads(parse(structured_outputs={"json": SCHEMA, "disable_any_whitespace": True}).text)
    assert compact["x-guidance"] == {"whitespace_flexible": False}
    assert compact["properties"] == SCHEMA["properties"]


def test_nothing_asked_is_no_spec():
    assert parse() is None
    assert parse(response_format={"type": "text"}) is None
    assert parse(structured_outputs=None) is None


@pytest.mark.parametrize(("fields", "param"), [
    ({"response_format": "json"}, "response_format"),
    ({"response_format": {"type": "json_object", "schema": {}}}, "response_format.schema"),
    ({"response_format": {"type": "json_object", "json_schema": {"name": "a"}}},
     "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}},
     "response_format.json_schema.name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": [1]}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "a", "schema": {}, "strict": "yes"}}},
     "response_format.json_schema.strict"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}, "x": 1}}},
     "response_format.json_schema.x"),
    ({"structured_outputs": ["a"]}, "structured_outputs"),
    ({"structured_outputs": {"choice": ["a", 1]}}, "structured_outputs.choice"),
    ({"structured_outputs": {"regex": ""}}, "structured_outputs.regex"),
    ({"structured_outputs": {"json_object": "yes"}}, "structured_outputs.json_object"),
    ({"structured_outputs": {"json": "x" * 100_001}}, "structured_outputs.json"),
    ({"structured_outputs": {"regex": "a" * 100_001}}, "structured_outputs.regex"),
])
def test_refusals_name_the_part(fields: dict[str, Any], param: str):
    with pytest.raises(OpenAIError) as refused:
        parse(**fields)
    assert refused.value.status == 400 and refused.value.param == param
