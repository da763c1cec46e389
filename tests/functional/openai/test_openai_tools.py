"""The tool loop through the `openai` package: a request with tools gets the model's tool calls (parsed
from what it generated), the application answers with tool messages, and the next request renders them
and gets the model's answer; whole and streamed.

Random weights do not write tool calls, so the model here is the tiny decoder (byte tokenizer) with its
output head replaced by a script: its logits are a table looked up by position, one-hot on the script's
next byte, so greedy decoding from a prompt of P0 tokens writes the first answer (two `<tool_call>`s, then
EOS) and from one of P1 tokens the second. The model really generates them: the engine runs it, the
parser reads its output. P0 and P1 are the prompts' lengths as this server renders them, worked out
before the model is built with the server's own code (protocol.py `parse_request`, the folder's template,
chat_template.py `render_chat`); each answer's `usage.prompt_tokens` is checked against them, so a server
that renders otherwise fails here rather than passing by chance. The template is Qwen2.5's own (Hermes
`<tool_call>` form); the folder names no `tool_call_parser`: it is found from the template's text.

tool_choice "required" and a named function are enforced by the grammar: the example tiny decoder (random
weights, sampled with seeds) answers each with a call whose arguments its schema admits, every time.

A function's `strict: true` under auto (tools/strict.py): the scripted model's first call is outside the
strict schema, and the grammar makes it valid (whole, streamed, and on a second folder whose calls are read
as Llama 3's JSON); sampled, every call found is valid; a strict schema that does not compile is a 400.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import openai
import pytest
from onnx import helper, numpy_helper

from conftest import EXAMPLES, ROOT, RunningServer, openai_client, start_server
from engine.generate.serving.chat_template import ChatOptions, load_chat_template, render_chat
from engine.openai.protocol import parse_request
from hubserve_models import examples
from hubserve_models.tiny_decoder import TinyDecoderShape, tiny_decoder_model

MODEL = "tool_decoder"
CONTEXT = 2048
EOS = 257  # the byte tokenizer's
QWEN25_TEMPLATE = (ROOT / "tests" / "fixtures" / "chat_templates" / "qwen2_5.jinja").read_text()

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
QUESTION = [{"role": "user", "content": "What is the weather in Paris and in Lyon?"}]
FIRST = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>')
RESULTS = ['{"temperature": 21}', '{"temperature": 19}']
SECOND = "It is 21 degrees in Paris and 19 in Lyon."
CALL_ID_CHARS = len("call_") + 24  # the server's call ids: fixed length, so the second prompt's is known


def second_turn(calls: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """The messages after the first answer: its calls (id, name, arguments) and one tool message each."""
    assistant = {"role": "assistant", "content": None, "tool_calls": [
        {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls]}
    return [*QUESTION, assistant, *({"role": "tool", "tool_call_id": i, "content": r}
                                    for (i, _, _), r in zip(calls, RESULTS, strict=True))]


def prompt_tokens(folder: Path, messages: list[dict[str, Any]], tools: list[Any] = TOOLS) -> int:
    """The prompt's length as the server will render and encode it (a byte a token, no BOS for chat)."""
    api = parse_request({"model": MODEL, "messages": messages, "tools": tools}, chat=True)
    template = load_chat_template(folder, MODEL).template
    assert template is not None
    options = ChatOptions(tools=list(api.tools.tools), fields=api.message_fields)
    return len(render_chat(template, api.messages, options, 10 * CONTEXT).encode())


LLAMA_MODEL = "tool_llama"
LLAMA_FIRST = ('{"name": "get_weather", "parameters": {"city": "Paris"}}; '
               '{"name": "get_weather", "parameters": {"city": "Lyon"}}')

# strict under auto: a schema the script's first call ("Paris") breaks and its second ("Lyon") keeps
STRICT_ARGS = {"type": "object", "properties": {"city": {"enum": ["Brest", "Lyon"]}}, "required": ["city"]}


def strict_tools(folder: Path, first: int) -> list[Any]:
    """get_weather, strict, with STRICT_ARGS, its description cut so that the prompt is as long as TOOLS'
    (the script is keyed on the prompt's length: the model writes FIRST from this prompt too)."""
    tool = {"type": "function", "function": {"name": "get_weather", "description": "",
                                             "parameters": STRICT_ARGS, "strict": True}}
    pad = first - prompt_tokens(folder, QUESTION, [tool])
    assert pad >= 0
    tool["function"]["description"] = "w" * pad  # type: ignore[index]
    assert prompt_tokens(folder, QUESTION, [tool]) == first
    return [tool]


def scripted_model(scripts: dict[int, str]) -> Any:
    """The tiny decoder whose logits are one-hot on a script's next byte: the token at position p (the
    prompt's last, then each generated one) predicts the one at p + 1, so a script for a prompt of P
    tokens (its text, then EOS) starts on row P - 1."""
    model = tiny_decoder_model(TinyDecoderShape(max_positions=CONTEXT))
    table = np.zeros((CONTEXT, 258), np.float32)
    for start, text in scripts.items():
        for offset, token in enumerate([*text.encode(), EOS]):
            assert not table[start - 1 + offset].any(), "two scripts overlap"
            table[start - 1 + offset, token] = 20.0
    graph = model.graph
    head = next(n for n in graph.node if "logits" in n.output)
    head.output[list(head.output).index("logits")] = "random_logits"
    graph.initializer.append(numpy_helper.from_array(table, "script"))
    graph.node.append(helper.make_node("Gather", ["script", "position_ids"], ["logits"], axis=0))
    return model


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("tools") / "repo"
    folder = root / MODEL
    (folder / "1").mkdir(parents=True)
    config = (EXAMPLES / "tiny_decoder" / "config.pbtxt").read_text()
    config = config.replace('name: "tiny_decoder"', f'name: "{MODEL}"').replace(
        'key: "max_model_len" value { string_value: "512" }', f'key: "max_model_len" value {{ string_value: '
        f'"{CONTEXT}" }}')
    assert f'"{CONTEXT}"' in config
    (folder / "config.pbtxt").write_text(config)
    (folder / "chat_template.jinja").write_text(QWEN25_TEMPLATE)
    first = prompt_tokens(folder, QUESTION)
    placeholder = "c" * CALL_ID_CHARS
    second = prompt_tokens(folder, second_turn([(placeholder, "get_weather", '{"city":"Paris"}'),
                                                (placeholder, "get_weather", '{"city":"Lyon"}')]))
    model = scripted_model({first: FIRST, second: SECOND})
    (folder / "1" / "model.onnx").write_bytes(model.SerializeToString())
    # the same template and prompt, its calls read as Llama 3's JSON (the folder's tool_call_parser)
    llama = root / LLAMA_MODEL
    (llama / "1").mkdir(parents=True)
    (llama / "config.pbtxt").write_text(config.replace(f'name: "{MODEL}"', f'name: "{LLAMA_MODEL}"') +
                                        'parameters { key: "tool_call_parser" value { string_value: '
                                        '"llama3_json" } }\n')
    (llama / "chat_template.jinja").write_text(QWEN25_TEMPLATE)
    (llama / "1" / "model.onnx").write_bytes(scripted_model({first: LLAMA_FIRST}).SerializeToString())
    running = start_server(root, tmp_path_factory.mktemp("tools_log") / "server.log")
    running.prompts = (first, second)  # type: ignore[attr-defined]
    running.strict_tools = strict_tools(folder, first)  # type: ignore[attr-defined]
    yield running
    running.stop()


@pytest.fixture
def client(server: RunningServer) -> openai.OpenAI:
    return openai_client(server)


def test_the_tool_loop_whole(server: RunningServer, client: openai.OpenAI):
    first, second = server.prompts  # type: ignore[attr-defined]
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, temperature=0)
    choice = answer.choices[0]
    assert answer.usage is not None and answer.usage.prompt_tokens == first
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls or []
    assert [(c.type, c.function.name, c.function.arguments) for c in calls] == [  # as the model wrote them
        ("function", "get_weather", '{"city": "Paris"}'), ("function", "get_weather", '{"city": "Lyon"}')]
    assert all(c.id.startswith("call_") and len(c.id) == CALL_ID_CHARS for c in calls)
    assert calls[0].id != calls[1].id

    messages = second_turn([(c.id, c.function.name, c.function.arguments) for c in calls])
    final = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, temperature=0)
    assert final.usage is not None and final.usage.prompt_tokens == second
    assert (final.choices[0].message.content, final.choices[0].message.tool_calls,
            final.choices[0].finish_reason) == (SECOND, None, "stop")


def test_the_tool_loop_streamed(server: RunningServer, client: openai.OpenAI):
    first, second = server.prompts  # type: ignore[attr-defined]
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == first
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    assert not "".join(d.content or "" for d in deltas)
    parts = [t for d in deltas for t in d.tool_calls or []]
    # each call: its index, id, type and name first (empty arguments), then its arguments in fragments as
    # the model writes them (a byte a token: one or a few characters each)
    heads = [(i, p.index, p.function.name if p.function else None) for i, p in enumerate(parts) if p.id]
    assert [(index, name) for _, index, name in heads] == [(0, "get_weather"), (1, "get_weather")]
    assert heads[0][0] == 0 and heads[1][0] - heads[0][0] > 2 and len(parts) - heads[1][0] > 2
    assert all(p.function and p.function.name is None and p.index == (0 if i < heads[1][0] else 1)
               for i, p in enumerate(parts) if not p.id)
    calls: dict[int, list[str]] = {}
    for p in parts:
        entry = calls.setdefault(p.index, [p.id or "", "", ""])
        if p.function and p.function.name:
            entry[1] = p.function.name
        entry[2] += (p.function.arguments if p.function else "") or ""
    assert [(name, args) for _, name, args in calls.values()] == [  # as the model wrote them, as whole
        ("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Lyon"}')]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "tool_calls" and not any(finishes[:-1])

    messages = second_turn([(i, n, a) for i, n, a in calls.values()])
    stream = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    rest = list(stream)
    assert rest[-1].usage is not None and rest[-1].usage.prompt_tokens == second
    assert "".join(c.choices[0].delta.content or "" for c in rest if c.choices) == SECOND
    assert not any(c.choices[0].delta.tool_calls for c in rest if c.choices)
    assert [c.choices[0].finish_reason for c in rest if c.choices][-1] == "stop"


def test_tool_choice_none_renders_the_tools_and_reads_no_calls(server: RunningServer, client: openai.OpenAI):
    first, _ = server.prompts  # type: ignore[attr-defined]
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, tool_choice="none",
                                            temperature=0)
    assert answer.usage is not None and answer.usage.prompt_tokens == first  # the tools were in the prompt
    assert (answer.choices[0].message.content, answer.choices[0].message.tool_calls,
            answer.choices[0].finish_reason) == (FIRST, None, "stop")


def test_parallel_tool_calls_false_keeps_the_first(client: openai.OpenAI):
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, temperature=0,
                                            parallel_tool_calls=False)
    calls = answer.choices[0].message.tool_calls or []
    assert [json.loads(c.function.arguments) for c in calls] == [{"city": "Paris"}]


def test_forced_choices_conflict_with_response_format(client: openai.OpenAI):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, tool_choice="required",
                                       response_format={"type": "json_object"})
    assert err.value.body["param"] == "tool_choice"


def test_strict_under_auto_the_script_s_call_is_made_valid(server: RunningServer, client: openai.OpenAI):
    """The model writes FIRST ("Paris", then "Lyon"); with get_weather strict, "Paris" is outside its enum:
    the grammar lets the model write only a valid call (greedy among the allowed: "Brest", the lower byte,
    so the script goes on in step), whole and streamed alike; the second call is the model's own."""
    tools = server.strict_tools  # type: ignore[attr-defined]
    want = [("get_weather", '{"city": "Brest"}'), ("get_weather", '{"city": "Lyon"}')]
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=tools, temperature=0)
    choice = answer.choices[0]
    assert answer.usage is not None and answer.usage.prompt_tokens == server.prompts[0]  # type: ignore[attr-defined]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []] == want
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, tools=tools, temperature=0,
                                                 stream=True))
    calls: dict[int, list[str]] = {}
    for part in (t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []):
        entry = calls.setdefault(part.index, ["", ""])
        entry[0] += (part.function.name if part.function else "") or ""
        entry[1] += (part.function.arguments if part.function else "") or ""
    assert [tuple(c) for c in calls.values()] == want


def test_strict_under_auto_on_llama3_json(server: RunningServer, client: openai.OpenAI):
    """The same on a folder whose calls are Llama 3's JSON objects: its script's "Paris" is made valid."""
    tools = server.strict_tools  # type: ignore[attr-defined]
    want = [("get_weather", '{"city": "Brest"}'), ("get_weather", '{"city": "Lyon"}')]
    loose = client.chat.completions.create(model=LLAMA_MODEL, messages=QUESTION, tools=TOOLS, temperature=0)
    assert [json.loads(c.function.arguments)["city"] for c in loose.choices[0].message.tool_calls or []] == \
        ["Paris", "Lyon"]  # (not strict: as the script wrote them)
    answer = client.chat.completions.create(model=LLAMA_MODEL, messages=QUESTION, tools=tools, temperature=0)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []] == want


def test_strict_under_auto_seeded_samples_call_only_within_the_schema(server: RunningServer,
                                                                       client: openai.OpenAI):
    """Sampled (the script's choice between the enum's two cities is a coin toss, and the rest of the
    answer drifts from the script after "Lyon"), every call found is valid under its schema."""
    tools = server.strict_tools  # type: ignore[attr-defined]
    found = 0
    for seed in range(4):
        answer = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=tools, temperature=1.0,
                                                seed=seed, max_tokens=200)
        for call in answer.choices[0].message.tool_calls or []:
            assert call.function.name == "get_weather"
            jsonschema.validate(json.loads(call.function.arguments), STRICT_ARGS)
            found += 1
    assert found >= 4


def test_strict_under_auto_fails_closed(client: openai.OpenAI):
    """A strict function's schema the grammar cannot compile is a 400 naming it; beside response_format a
    Hermes model's answer is JSON, which holds no call: served."""
    bad: Any = [TOOLS[0], {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"when": {"type": "string", "format": "nope"}}}}}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=QUESTION, tools=bad, max_tokens=8)
    assert err.value.body["param"] == "tools[1].function.parameters" and "Unknown format: nope" in \
        err.value.message
    strict: Any = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}]
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=strict, max_tokens=8,
                                            response_format={"type": "json_object"})
    assert answer.choices[0].message.tool_calls is None


def test_tokenize_counts_the_tools(server: RunningServer):
    first, _ = server.prompts  # type: ignore[attr-defined]
    body = json.dumps({"model": MODEL, "messages": QUESTION, "tools": TOOLS}).encode()
    request = urllib.request.Request(f"http://{server.http_url}/tokenize", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:  # no httpx: the test extra does not bring it
        got = json.loads(answer.read())
    assert got["count"] == first


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """The example tiny decoder (random weights): its template shows no tool format."""
    root = tmp_path_factory.mktemp("tools_tiny")
    (root / "repo" / "tiny_decoder").mkdir(parents=True)
    shutil.copy(EXAMPLES / "tiny_decoder" / "config.pbtxt", root / "repo" / "tiny_decoder" / "config.pbtxt")
    examples.build_repository(root / "repo", ["tiny_decoder"])
    running = start_server(root / "repo", root / "server.log")
    yield openai_client(running)
    running.stop()


def test_a_model_without_a_tool_format_refuses_auto(tiny: openai.OpenAI):
    """Tools with auto are a 400 saying so, while tool_choice none is served."""
    with pytest.raises(openai.BadRequestError) as err:
        tiny.chat.completions.create(model="tiny_decoder", messages=QUESTION, tools=TOOLS)
    assert err.value.body["param"] == "tools" and "tool_call_parser" in err.value.body["message"]
    ok = tiny.chat.completions.create(model="tiny_decoder", messages=QUESTION, tools=TOOLS,
                                      tool_choice="none", max_tokens=2)
    assert ok.choices[0].message.tool_calls is None


# Random weights under the grammar: every answer is a call whose arguments the schema admits
ARGS = {"type": "object", "properties": {"city": {"enum": ["Paris", "Lyon", "Nice"]},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}
FORCED_TOOLS: Any = [{"type": "function", "function": {"name": "forecast", "parameters": ARGS}},
                     {"type": "function", "function": {"name": "now", "parameters": {
                         "type": "object", "properties": {}, "additionalProperties": False}}}]


def check_call(name: str, arguments: str) -> None:
    assert name in ("forecast", "now")
    jsonschema.validate(json.loads(arguments), ARGS if name == "forecast" else
                        FORCED_TOOLS[1]["function"]["parameters"])


def test_a_named_function_is_always_called_with_valid_arguments(tiny: openai.OpenAI):
    named: Any = {"type": "function", "function": {"name": "forecast"}}
    for seed in range(8):
        answer = tiny.chat.completions.create(model="tiny_decoder", messages=QUESTION, tools=FORCED_TOOLS,
                                              tool_choice=named, temperature=1.0, seed=seed, max_tokens=100)
        choice = answer.choices[0]
        calls = choice.message.tool_calls or []
        assert choice.finish_reason == "tool_calls" and choice.message.content is None and len(calls) == 1
        assert calls[0].function.name == "forecast" and calls[0].id.startswith("call_")
        check_call(calls[0].function.name, calls[0].function.arguments)


def test_required_is_always_one_call_or_more(tiny: openai.OpenAI):
    for seed in range(8):
        answer = tiny.chat.completions.create(model="tiny_decoder", messages=QUESTION, tools=FORCED_TOOLS,
                                              tool_choice="required", temperature=1.0, seed=seed,
                                              max_tokens=200)
        calls = answer.choices[0].message.tool_calls or []
        assert answer.choices[0].finish_reason == "tool_calls" and calls
        for call in calls:
            check_call(call.function.name, call.function.arguments)
    single = tiny.chat.completions.create(model="tiny_decoder", messages=QUESTION, tools=FORCED_TOOLS,
                                          tool_choice="required", parallel_tool_calls=False, temperature=1.0,
                                          seed=0, max_tokens=200)
    assert len(single.choices[0].message.tool_calls or []) == 1


def test_a_named_call_streamed_and_the_loop_goes_on(tiny: openai.OpenAI):
    named: Any = {"type": "function", "function": {"name": "forecast"}}
    chunks = list(tiny.chat.completions.create(model="tiny_decoder", messages=QUESTION, tools=FORCED_TOOLS,
                                               tool_choice=named, temperature=1.0, seed=5, max_tokens=100,
                                               stream=True))
    parts = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert parts[0].index == 0 and parts[0].id and parts[0].function and parts[0].function.name == "forecast"
    arguments = "".join(p.function.arguments or "" for p in parts if p.function)
    check_call("forecast", arguments)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    # the tool's answer goes back; the model answers in text (random: any text). Its template writes each
    # message's content as a string: the call's message carries "" (null would fail that template)
    messages: Any = [*QUESTION, {"role": "assistant", "content": "", "tool_calls": [
        {"id": parts[0].id, "type": "function", "function": {"name": "forecast", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": parts[0].id, "content": "sunny"}]
    final = tiny.chat.completions.create(model="tiny_decoder", messages=messages, tools=FORCED_TOOLS,
                                         tool_choice="none", max_tokens=8, temperature=0)
    assert final.choices[0].message.tool_calls is None
    assert final.choices[0].finish_reason in ("stop", "length")


def test_a_tool_schema_the_grammar_cannot_compile_is_a_400_naming_tools(tiny: openai.OpenAI):
    """required and named compile the tools' schemas (forced.py): one llguidance refuses fails closed."""
    bad: Any = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"when": {"type": "string", "format": "nope"}}}}}]
    for choice in ("required", {"type": "function", "function": {"name": "f"}}):
        with pytest.raises(openai.BadRequestError) as err:
            tiny.chat.completions.create(model="tiny_decoder", messages=QUESTION, tools=bad,
                                         tool_choice=choice, max_tokens=8)
        assert err.value.body["param"] == "tools" and "Unknown format: nope" in err.value.message
