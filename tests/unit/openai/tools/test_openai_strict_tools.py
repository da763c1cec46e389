"""`strict: true` under tool_choice auto (engine/openai/tools/strict.py): the grammar, compiled by the
engine's own compiler for the byte tokenizer and for the Qwen2 fixture's BPE tokenizer, fed recorded
answers a token at a time. Free text and valid calls (text around them, several, white space as models
write it) are accepted to the end with EOS allowed, and the parser reads from them exactly the calls the
grammar let through; a strict function's argument that its schema refuses, an undeclared function and text
after an opened call are refused at the offending token; a non-strict function's arguments may be any
object. Seeded walks of a "model" pushed off its planned answer by the grammar write only valid calls. No
strict tool, no grammar; beside response_format, a 400 unless no call can be read."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from engine.generate.core.grammar import ANY_JSON_OBJECT, GrammarCompiler, GrammarKind, GrammarSpec
from engine.generate.core.tokenizer import ByteTokenizer, JsonTokenizer, Tokenizer
from engine.openai.errors import OpenAIError
from engine.openai.tools import PARSERS
from engine.openai.tools.calls import ChoiceCalls
from engine.openai.tools.request import parse_tools
from engine.openai.tools.strict import check_combination, strict_calls

QWEN2 = Path(__file__).resolve().parents[4] / "tests" / "fixtures" / "llm" / "models" / "qwen2"
FORECAST = {"type": "object", "properties": {"city": {"enum": ["Paris", "Lyon"]},
                                             "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "forecast", "parameters": FORECAST, "strict": True}},
         {"type": "function", "function": {"name": "note", "parameters": {"type": "object"}}}]
KEY = {"hermes": "arguments", "llama3_json": "parameters"}


def call(parser: str, name: str, arguments: Any, indent: int | None = None) -> str:
    body = json.dumps({"name": name, KEY[parser]: arguments}, indent=indent)
    return f"<tool_call>\n{body}\n</tool_call>" if parser == "hermes" else body


def compiled(parser: str, tokenizer: Tokenizer) -> tuple[GrammarCompiler, GrammarSpec]:
    strict = strict_calls(parse_tools({"tools": TOOLS}), parser, tokenizer)
    assert strict is not None and [s.param for s in strict.schemas] == ["tools[0].function.parameters"]
    compiler = GrammarCompiler(tokenizer)
    compiler.check(strict.grammar)
    return compiler, strict.grammar


@pytest.fixture(scope="module", params=["byte", "qwen2", "qwen2_tags"])
def tokenizer(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """The byte tokenizer, the fixture's BPE, and that BPE with Qwen3's tags as added tokens (not special,
    as its tokenizer.json has them), which a model writes as one token each."""
    if request.param == "byte":
        return ByteTokenizer()
    if request.param == "qwen2":
        return JsonTokenizer(QWEN2 / "tokenizer.json", None, "<|im_end|>")
    doc = json.loads((QWEN2 / "tokenizer.json").read_text())
    size = len(doc["model"]["vocab"]) + len(doc["added_tokens"])
    doc["added_tokens"] += [{"id": size + i, "content": tag, "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": False}
                            for i, tag in enumerate(("<tool_call>", "</tool_call>", "<think>", "</think>"))]
    path = tmp_path_factory.mktemp("qwen2_tags") / "tokenizer.json"
    path.write_text(json.dumps(doc))
    tokenizer = JsonTokenizer(path, None, "<|im_end|>")
    assert tokenizer.encode("a<tool_call>", add_special_tokens=False)[-1] == size
    return tokenizer


def refused_at(compiler: GrammarCompiler, spec: GrammarSpec, tokenizer: Tokenizer, text: str) -> str | None:
    """Feeds `text`'s tokens one at a time as the sampler would (each must be allowed); None when all are
    taken and EOS may follow, else the text before the first refused token (or all of it, EOS refused)."""
    constraint = compiler.constraint(spec)
    tokens = tokenizer.encode(text, add_special_tokens=False)
    for i, token in enumerate(tokens):
        if not constraint.allowed().allows(token):
            return tokenizer.decode(tokens[:i])
        constraint.advance(token)
    return None if constraint.allowed().allows(tokenizer.eos_token_id) else text


def valid_answers(parser: str) -> list[tuple[str, int]]:
    """Recorded answers the grammar must take, with how many calls each holds."""
    paris = call(parser, "forecast", {"city": "Paris", "days": 3})
    lyon = call(parser, "forecast", {"city": "Lyon", "days": 7})
    note = call(parser, "note", {"text": "any {object}", "tags": [1, None]})
    if parser == "hermes":
        return [("", 0), ("It is sunny; no call needed.", 0), (paris, 1), (f"Let me look.\n{paris}", 1),
                (f"<think>\nParis, then Lyon.\n</think>\n\n{paris}\n{lyon}", 2), ("<think></think>Hi", 0),
                (f"{paris}\n{lyon}\nBoth asked.", 2), (f"{note}{paris}", 2),
                ('<tool_call>{"name":"forecast","arguments":{"city":"Lyon","days":1}}</tool_call>', 1)]
    return [("", 0), ("It is sunny, no call needed.", 0), (paris, 1), (f"  {paris}", 1),
            (f"{paris}; {lyon}", 2), (f"{note};{paris} done", 2), (f"{paris};", 1),
            ("Text first, then {\"name\": \"forecast\"} is text.", 0)]


@pytest.mark.parametrize("parser", ["hermes", "llama3_json"])
def test_valid_answers_are_taken_and_read_as_the_calls_they_hold(parser: str, tokenizer: Tokenizer):
    compiler, spec = compiled(parser, tokenizer)
    for text, count in valid_answers(parser):
        assert refused_at(compiler, spec, tokenizer, text) is None, text
        _, calls = ChoiceCalls(PARSERS[parser]()).message(text)
        assert len(calls) == count, text
        for found in calls:
            arguments = json.loads(found.arguments)
            if found.name == "forecast":
                jsonschema.validate(arguments, FORECAST)
            assert found.name in ("forecast", "note") and isinstance(arguments, dict)


@pytest.mark.parametrize("parser", ["hermes", "llama3_json"])
def test_calls_outside_the_declared_schemas_are_refused(parser: str, tokenizer: Tokenizer):
    compiler, spec = compiled(parser, tokenizer)
    lead = "Checking.\n" if parser == "hermes" else ""
    refused = [
        (call(parser, "forecast", {"city": "Nice", "days": 3}), '"city": "'),   # not in the enum
        (call(parser, "forecast", {"city": "Paris", "days": 9}), '"days": '),   # past the maximum
        (call(parser, "forecast", {"city": "Paris"}), '"Paris"'),               # "days" missing
        (call(parser, "weather", {}), '"name": "'),                             # not a declared function
        (call(parser, "note", ["not", "an", "object"]), f'"{KEY[parser]}": '),  # arguments not an object
    ]
    for text, before in refused:  # refused at the token that starts the offending value (or just before)
        at = len(lead) + text.index(before) + len(before)
        got = refused_at(compiler, spec, tokenizer, lead + text)
        assert got is not None and at - 4 <= len(got) <= at, (text, got)
    if parser == "hermes":  # once the tag is written, a call must follow it
        assert refused_at(compiler, spec, tokenizer, "a <tool_call> hello") is not None
        tag = tokenizer.encode("<tool_call>", add_special_tokens=False)
        if len(tag) == 1:  # a model that has the tag as a token may not spell it out (an unheld call)
            spelled = tokenizer.encode("<tool_", add_special_tokens=False) + \
                tokenizer.encode("call>", add_special_tokens=False)
            constraint = compiler.constraint(spec)
            for token in spelled[:-1]:
                constraint.advance(token)
            assert not constraint.allowed().allows(spelled[-1])
    else:  # the parser would read calls after the tag: the grammar does not let it start the answer
        assert refused_at(compiler, spec, tokenizer, '<|python_tag|>{"name": "note"') is not None


def planned_answer(rng: random.Random, parser: str) -> bytes:
    """An answer a model might mean to write: text and a few calls, some outside the schemas (a city not in
    the enum, days past 7, an undeclared function, other arguments), compact or indented."""
    calls = []
    for _ in range(rng.randint(0, 3)):
        name = rng.choice(["forecast", "forecast", "note", "weather"])
        arguments: Any = {"city": rng.choice(["Paris", "Lyon", "Nice"]), "days": rng.randint(0, 9)}
        if rng.random() < 0.3:
            arguments = {"x": [1, {"y": "}"}]}
        calls.append(call(parser, name, arguments, rng.choice([None, 2])))
    if parser == "hermes":
        text = rng.choice(["", "Sure. "]) + rng.choice(["\n", " ok ", ""]).join(calls)
    else:
        text = rng.choice(["", " "]) + rng.choice(["\n", "; ", ""]).join(calls)
    return (text + rng.choice(["", " done", "\n"])).encode()


@pytest.mark.parametrize("parser", ["hermes", "llama3_json"])
def test_a_model_held_by_the_grammar_writes_only_valid_calls(parser: str):
    """Seeded walks on the byte tokenizer: each step takes the planned answer's next byte when the grammar
    allows it, else a random allowed token (a model pushed off its plan), until EOS; every call the parser
    then reads is a declared function's, a strict one's arguments valid under its schema."""
    tokenizer = ByteTokenizer()
    compiler, spec = compiled(parser, tokenizer)
    found = deviated = 0
    for seed in range(40):
        rng = random.Random(seed)
        plan, constraint, out = planned_answer(rng, parser), compiler.constraint(spec), bytearray()
        for _ in range(600):
            allowed = constraint.allowed()
            token = plan[len(out)] if len(out) < len(plan) else tokenizer.eos_token_id
            if not allowed.allows(token):
                deviated += 1
                token = rng.choice([int(t) for t in allowed.ids(tokenizer.vocab_size)])
            if token == tokenizer.eos_token_id:
                break
            constraint.advance(token)
            out.append(token)
        for found_call in ChoiceCalls(PARSERS[parser]()).message(out.decode())[1]:
            arguments = json.loads(found_call.arguments)
            assert found_call.name in ("forecast", "note") and isinstance(arguments, dict)
            if found_call.name == "forecast":
                jsonschema.validate(arguments, FORECAST)
            found += 1
    assert found > 20 and deviated > 20  # calls were read, and the grammar did push the walks


def test_no_strict_tool_no_grammar():
    loose = [{"type": "function", "function": {**t["function"], "strict": False}} for t in TOOLS]
    for choice in ("auto", "required", "none"):
        assert strict_calls(parse_tools({"tools": loose, "tool_choice": choice}), "hermes") is None
    assert strict_calls(parse_tools({"tools": TOOLS, "tool_choice": "none"}), "hermes") is None
    assert strict_calls(parse_tools({"tools": TOOLS, "tool_choice": "required"}), "hermes") is None


def test_beside_response_format_only_a_json_answer_on_hermes_is_served():
    tools = parse_tools({"tools": TOOLS})
    check_combination(tools, "hermes", ANY_JSON_OBJECT)  # a JSON value never holds a Hermes call
    check_combination(tools, "llama3_json", None)
    with pytest.raises(OpenAIError) as err:
        check_combination(tools, "llama3_json", ANY_JSON_OBJECT)
    assert err.value.param == "response_format"
    with pytest.raises(OpenAIError) as err:
        check_combination(tools, "hermes", GrammarSpec(GrammarKind.REGEX, ".*", "structured_outputs.regex"))
    assert err.value.param == "structured_outputs"
