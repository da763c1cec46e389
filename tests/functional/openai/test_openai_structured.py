"""Structured output on the OpenAI API (/v1) of a real server, through the `openai` package: OpenAI's
`response_format` (json_object, json_schema) and vLLM's `structured_outputs` (json, regex, choice, grammar)
on chat and completions, over two random-weight models sampled at temperature 1 with seeds: the example
tiny_decoder (byte tokenizer) and the Qwen2 fixture folder served as it is (a byte-level BPE of 803 tokens,
its generation_config's EOS ids and sampling defaults). Every answer is parsed and checked against what it
was asked to match; a constrained and an unconstrained request in flight together each get their own; a
constraint the server cannot honour is a 400 naming its field, never a 200 without it."""

from __future__ import annotations

import concurrent.futures
import json
import re
import shutil
from typing import Any

import jsonschema
import openai
import pytest

from conftest import EXAMPLES, ROOT, RunningServer, openai_client, start_server
from hubserve_models import examples

TINY = "tiny_decoder"
QWEN = "qwen2"
MODELS = (TINY, QWEN)
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6}, "age": {"type": "integer", "minimum": 0, "maximum": 99},
    "pet": {"enum": ["cat", "dog", "fish"]}},
    "required": ["name", "age", "pet"], "additionalProperties": False}
JSON_SCHEMA_FORMAT: Any = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA,
                                                                  "strict": True}}
REGEX = r"[A-Z][a-z]{1,5} [0-9]{2}"
MESSAGES: Any = [{"role": "user", "content": "Describe a person."}]


def compact(text: str) -> str:
    """The JSON `text` written without whitespace between its tokens."""
    return json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("structured")
    repo = root / "repo"
    (repo / TINY).mkdir(parents=True)
    shutil.copy(EXAMPLES / TINY / "config.pbtxt", repo / TINY / "config.pbtxt")
    examples.build_repository(repo, [TINY])
    shutil.copytree(ROOT / "tests" / "fixtures" / "llm" / "models" / QWEN, repo / QWEN)  # as it is
    running = start_server(repo, root / "server.log")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai_client(server)


@pytest.mark.parametrize("model", MODELS)
def test_chat_json_schema_through_the_openai_package(client: openai.OpenAI, model: str):
    for seed in range(8):
        answer = client.chat.completions.create(model=model, messages=MESSAGES, temperature=1.0, seed=seed,
                                                max_tokens=200, response_format=JSON_SCHEMA_FORMAT)
        choice = answer.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)


@pytest.mark.parametrize("model", MODELS)
def test_json_object_gives_a_json_object(client: openai.OpenAI, model: str):
    """The tiny model closes its object within max_tokens every time, so each of its samples is parsed; the
    random Qwen2 model wanders into a long string and is cut (still the start of one)."""
    for seed in range(4 if model == QWEN else 8):
        answer = client.completions.create(model=model, prompt="{", temperature=1.0, seed=seed,
                                           max_tokens=120,
                                           extra_body={"response_format": {"type": "json_object"}})
        if model == TINY or answer.choices[0].finish_reason == "stop":
            assert answer.choices[0].finish_reason == "stop", answer.choices[0].text
            assert isinstance(json.loads(answer.choices[0].text), dict)
        else:
            assert answer.choices[0].finish_reason == "length" and answer.choices[0].text.startswith("{")


@pytest.mark.parametrize("model", MODELS)
def test_structured_outputs_regex_choice_grammar_and_json(client: openai.OpenAI, model: str):
    asks: list[tuple[dict[str, Any], Any]] = [
        ({"regex": REGEX}, lambda t: re.fullmatch(REGEX, t)),
        ({"choice": ["red", "green", "blue sky"]}, lambda t: t in ("red", "green", "blue sky")),
        ({"grammar": 'root ::= "[" num ("," num)* "]"\nnum ::= [1-9] [0-9]?'},
         lambda t: re.fullmatch(r"\[[1-9][0-9]?(,[1-9][0-9]?)*\]", t)),
        # compact (vLLM's disable_any_whitespace): a random model would wander in whitespace otherwise
        ({"json": SCHEMA, "disable_any_whitespace": True},
         lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None and t == compact(t)),
        ({"json": json.dumps(SCHEMA), "disable_any_whitespace": True},
         lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
    ]
    for constraint, check in asks:
        for seed in range(6):
            answer = client.completions.create(model=model, prompt="Answer:", temperature=1.0, seed=seed,
                                               max_tokens=150, extra_body={"structured_outputs": constraint})
            text = answer.choices[0].text
            assert answer.choices[0].finish_reason == "stop" and check(text), (constraint, text)
        chat = client.chat.completions.create(model=model, messages=MESSAGES, temperature=1.0, seed=1,
                                              max_tokens=150, extra_body={"structured_outputs": constraint})
        assert check(chat.choices[0].message.content or ""), (constraint, chat.choices[0].message.content)


def test_a_streamed_constrained_chat_is_valid_once_joined(client: openai.OpenAI):
    stream = client.chat.completions.create(model=QWEN, messages=MESSAGES, temperature=1.0, seed=3,
                                            max_tokens=200, response_format=JSON_SCHEMA_FORMAT, stream=True)
    parts, reasons = [], []
    for chunk in stream:
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            reasons.append(choice.finish_reason)
    assert reasons[-1] == "stop"
    jsonschema.validate(json.loads("".join(parts)), SCHEMA)


def test_constrained_and_free_requests_in_flight_together_each_get_their_own(client: openai.OpenAI):
    def free(seed: int) -> str:
        return client.completions.create(model=TINY, prompt="Once", temperature=1.0, seed=seed,
                                         max_tokens=40, extra_body={"ignore_eos": True}).choices[0].text

    def constrained(seed: int) -> str:
        outputs = {"json": SCHEMA, "disable_any_whitespace": True}
        answer = client.completions.create(model=TINY, prompt="Once", temperature=1.0, seed=seed,
                                           max_tokens=200, extra_body={"structured_outputs": outputs})
        return answer.choices[0].text

    alone = [free(s) for s in range(4)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        frees = [pool.submit(free, s) for s in range(4)]
        jsons = [pool.submit(constrained, s) for s in range(4)]
        assert [f.result() for f in frees] == alone
        for f in jsons:
            jsonschema.validate(json.loads(f.result()), SCHEMA)


def test_a_grammar_failing_while_it_generates_fails_that_request_alone(client: openai.OpenAI):
    """A grammar that compiles and then passes llguidance's limit of 2,000 Earley items in a row at its
    first token: that request is a 400 in llguidance's words; free requests in flight beside it get what
    they get alone (before, the whole engine step failed, and every request in it with a 500)."""
    grammar = 'start: "a" t\nt: ' + " | ".join(f'"b{i}"' for i in range(2100))

    def free(seed: int) -> str:
        return client.completions.create(model=TINY, prompt="Once", temperature=1.0, seed=seed,
                                         max_tokens=40, extra_body={"ignore_eos": True}).choices[0].text

    alone = [free(s) for s in range(3)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        frees = [pool.submit(free, s) for s in range(3)]
        failing = pool.submit(client.completions.create, model=TINY, prompt="Once", max_tokens=20,
                              extra_body={"structured_outputs": {"grammar": grammar}})
        with pytest.raises(openai.BadRequestError) as refused:
            failing.result()
        assert [f.result() for f in frees] == alone
    assert "the grammar failed at output token 1" in refused.value.message
    assert "max is 2000" in refused.value.message
    with pytest.raises(openai.APIError) as streamed:  # streamed: an error event (or the 400, head unsent)
        for _ in client.completions.create(model=TINY, prompt="Once", max_tokens=20, stream=True,
                                           extra_body={"structured_outputs": {"grammar": grammar}}):
            pass
    assert "max is 2000" in streamed.value.message


def test_max_tokens_cutting_a_json_short_finishes_with_length(client: openai.OpenAI):
    answer = client.chat.completions.create(model=TINY, messages=MESSAGES, temperature=1.0, seed=0,
                                            max_tokens=4, response_format=JSON_SCHEMA_FORMAT)
    assert answer.choices[0].finish_reason == "length"
    assert (answer.choices[0].message.content or "").startswith("{")


@pytest.mark.parametrize(("extra", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objec"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "pattern": "(?<=a)b"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
     "response_format.json_schema.name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"structured_outputs": {"regex": "[a-z"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"grammar": "root ::= missing_rule"}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
    ({"structured_outputs": {"json": SCHEMA, "whitespace_pattern": " "}},
     "structured_outputs.whitespace_pattern"),
    ({"structured_outputs": {"regex": "a", "disable_any_whitespace": True}},
     "structured_outputs.disable_any_whitespace"),
    ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
     "structured_outputs"),
    ({"guided_json": SCHEMA}, "guided_json"),
    ({"guided_regex": "a+"}, "guided_regex"),
    ({"guided_decoding_backend": "guidance"}, "guided_decoding_backend"),
])
def test_a_constraint_not_honoured_is_a_400_naming_its_field(client: openai.OpenAI, extra: dict[str, Any],
                                                             param: str):
    for chat in (True, False):
        with pytest.raises(openai.BadRequestError) as refused:
            if chat:
                client.chat.completions.create(model=QWEN, messages=MESSAGES, max_tokens=8, extra_body=extra)
            else:
                client.completions.create(model=QWEN, prompt="x", max_tokens=8, extra_body=extra)
        error = refused.value.body
        assert isinstance(error, dict) and error["param"] == param, error
        assert error["type"] == "invalid_request_error"


def test_text_response_format_is_no_constraint(client: openai.OpenAI):
    ask: Any = {"model": TINY, "messages": MESSAGES, "temperature": 1.0, "seed": 5, "max_tokens": 20}
    plain = client.chat.completions.create(**ask)
    text = client.chat.completions.create(**ask, response_format={"type": "text"})
    assert text.choices[0].message.content == plain.choices[0].message.content


def test_the_refusal_says_what_the_grammar_engine_found(client: openai.OpenAI):
    schema = {"type": "string", "format": "nope"}
    bad: Any = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=TINY, messages=MESSAGES, max_tokens=8, response_format=bad)
    assert "Unknown format: nope" in refused.value.message
