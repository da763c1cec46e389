"""The tool loop through the `openai` package against the Qwen2 fixture folder (tests/fixtures/llm, built by
tools/llm_fixtures) served AS IT IS (no config.pbtxt): its own Qwen2.5-style template in
tokenizer_config.json lists the tools in the system turn and writes calls as `<tool_call>` blocks and tool
messages as `<tool_response>` blocks, and the server finds its tool call parser (Hermes) from that text.

The loop: a request with tools and a named tool_choice (the grammar forces a valid call whatever the random
weights prefer; the tool's one argument is an enum of one value, so the call is the recorded one) → the
assistant's tool_calls → a tool message → a second request with tools (auto). Each request's prompt is
exactly transformers' `apply_chat_template(messages, tools=...)` ids as recorded in expected/qwen2.json
(`tool_chats`): the same count in `usage.prompt_tokens`, the same ids from /tokenize, and, the prompt being
the same, the second answer is transformers' greedy text; whole and streamed. tool_choice "required" and a
named function, sampled with seeds, stream their calls as the grammar lets the model write them (several
for "required"), the fragments joining to the whole answer's arguments for the same seed."""

from __future__ import annotations

import json
import shutil
import urllib.request
from typing import Any

import jsonschema
import openai
import pytest

from conftest import ROOT, RunningServer, openai_client, start_server

MODEL = "qwen2"
EXPECTED = json.loads((ROOT / "tests" / "fixtures" / "llm" / "expected" / f"{MODEL}.json").read_text())
CHATS = {chat["name"]: chat for chat in EXPECTED["tool_chats"]}
OFFERED, RESULT = CHATS["tools_offered"], CHATS["tool_result"]
TOOLS: Any = OFFERED["tools"]
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}
MAX_TOKENS = EXPECTED["greedy"]["max_new_tokens"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("fixture_tools")
    shutil.copytree(ROOT / "tests" / "fixtures" / "llm" / "models" / MODEL, root / "repo" / MODEL)  # as it is
    running = start_server(root / "repo", root / "server.log")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai_client(server)


def after_the_call(call_id: str, name: str, arguments: str) -> list[dict[str, Any]]:
    """The second request's messages, OpenAI's form of the recorded tool_result chat: the question, the
    assistant's call as the server returned it (arguments a JSON string), and the tool's answer."""
    question, _, tool = RESULT["messages"]
    assistant = {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}
    return [question, assistant, {"role": "tool", "tool_call_id": call_id, "content": tool["content"]}]


def tokenize(server: RunningServer, messages: list[dict[str, Any]]) -> list[int]:
    """The ids /tokenize gives the chat with TOOLS (through urllib: the test extra has no httpx)."""
    body = json.dumps({"model": MODEL, "messages": messages, "tools": TOOLS}).encode()
    request = urllib.request.Request(f"http://{server.http_url}/tokenize", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        tokens: list[int] = json.loads(answer.read())["tokens"]
    return tokens


def test_the_recorded_tool_chats_are_a_whole_loop():
    """What the tests below rely on: the call the grammar forces is the recorded one, and the recorded
    second answer writes no call (random weights), so auto gives it as content."""
    assert TOOLS[0]["function"]["parameters"]["properties"]["city"]["enum"] == ["Paris"]
    call = RESULT["messages"][1]["tool_calls"][0]["function"]
    assert (call["name"], call["arguments"]) == ("get_weather", {"city": "Paris"})
    assert "<tool_call>" in OFFERED["prompt_text"] and "<tool_response>" in RESULT["prompt_text"]
    assert "<tool_call>" not in RESULT["text"]
    assert len(RESULT["prompt_ids"]) + MAX_TOKENS <= EXPECTED["context_length"]


def test_the_tool_loop_whole(server: RunningServer, client: openai.OpenAI):
    first = client.chat.completions.create(model=MODEL, messages=OFFERED["messages"], tools=TOOLS,
                                           tool_choice=NAMED, temperature=0, max_tokens=100)
    choice = first.choices[0]
    assert first.usage is not None and first.usage.prompt_tokens == len(OFFERED["prompt_ids"])
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls or []
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("function", "get_weather", {"city": "Paris"})]

    messages = after_the_call(calls[0].id, calls[0].function.name, calls[0].function.arguments)
    assert tokenize(server, messages) == RESULT["prompt_ids"]  # the tool turn as transformers renders it
    final = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, temperature=0,
                                           max_tokens=MAX_TOKENS)
    assert final.usage is not None
    assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (len(RESULT["prompt_ids"]),
                                                                          len(RESULT["output_ids"]))
    answer = final.choices[0]
    assert (answer.message.content, answer.message.tool_calls, answer.finish_reason) == (
        RESULT["text"], None, RESULT["finish_reason"])


def test_the_tool_loop_streamed(client: openai.OpenAI):
    chunks = list(client.chat.completions.create(model=MODEL, messages=OFFERED["messages"], tools=TOOLS,
                                                 tool_choice=NAMED, temperature=0, max_tokens=100,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == len(OFFERED["prompt_ids"])
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not "".join(d.content or "" for d in deltas)
    parts = [t for d in deltas for t in d.tool_calls or []]
    assert {p.index for p in parts} == {0}
    call_id = next(p.id for p in parts if p.id)
    names = [p.function.name for p in parts if p.function and p.function.name]
    arguments = "".join(p.function.arguments or "" for p in parts if p.function)
    assert (names, json.loads(arguments)) == (["get_weather"], {"city": "Paris"})
    # the call opens first (its name, empty arguments), then its arguments come as they are generated: a
    # fragment per token, which concatenate to the string the whole answer gives for the same request
    assert (parts[0].id, parts[0].function and parts[0].function.arguments) == (call_id, "")
    fragments = [p.function.arguments for p in parts[1:] if p.function and p.function.arguments]
    assert len(fragments) > 1 and all(p.id is None and p.function and p.function.name is None
                                      for p in parts[1:])
    whole = client.chat.completions.create(model=MODEL, messages=OFFERED["messages"], tools=TOOLS,
                                           tool_choice=NAMED, temperature=0, max_tokens=100)
    assert [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls or []] == [
        (names[0], arguments)]
    # the `openai` package's stream helper concatenates the fragments into the same call
    with client.chat.completions.stream(model=MODEL, messages=OFFERED["messages"], tools=TOOLS,
                                        tool_choice=NAMED, temperature=0, max_tokens=100) as helper:
        kinds = [event.type for event in helper]
        helped = helper.get_final_completion().choices[0].message.tool_calls or []
    assert kinds.count("tool_calls.function.arguments.delta") > 1
    assert [(c.function.name, c.function.arguments) for c in helped] == [(names[0], arguments)]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "tool_calls" and not any(finishes[:-1])

    messages = after_the_call(call_id, names[0], arguments)
    rest = list(client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, temperature=0,
                                               max_tokens=MAX_TOKENS, stream=True,
                                               stream_options={"include_usage": True}))
    assert rest[-1].usage is not None and rest[-1].usage.prompt_tokens == len(RESULT["prompt_ids"])
    assert "".join(c.choices[0].delta.content or "" for c in rest if c.choices) == RESULT["text"]
    assert not any(c.choices[0].delta.tool_calls for c in rest if c.choices)
    assert [c.choices[0].finish_reason for c in rest if c.choices and c.choices[0].finish_reason] == [
        RESULT["finish_reason"]]


def streamed_calls(chunks: list[Any]) -> list[tuple[str, str]]:
    """The calls a client rebuilds from the stream's tool_calls deltas, checking their shape: each call's
    first delta carries its index, id, type, name and empty arguments; the others only argument fragments,
    more than one a call (they come as they are generated)."""
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not "".join(d.content or "" for d in deltas)
    calls: list[list[str]] = []
    fragments: list[int] = []
    for part in (t for d in deltas for t in d.tool_calls or []):
        assert part.function is not None
        if part.id is not None:
            assert (part.index, part.type, part.function.arguments) == (len(calls), "function", "")
            assert part.function.name is not None
            calls.append([part.function.name, ""])
            fragments.append(0)
        else:
            assert part.index == len(calls) - 1 and part.function.name is None
            calls[part.index][1] += part.function.arguments or ""
            fragments[part.index] += 1
    assert calls and all(n > 1 for n in fragments)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "tool_calls" and not any(finishes[:-1])
    return [(name, arguments) for name, arguments in calls]


@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_calls_stream_as_they_are_generated(client: openai.OpenAI, choice: str):
    """tool_choice required (parallel calls included) and a named function stream as auto's calls do, and
    the fragments join to exactly the whole answer's arguments for the same seed."""
    tool_choice: Any = "required" if choice == "required" else NAMED
    most = 0
    for seed in range(3):
        fields: Any = dict(model=MODEL, messages=OFFERED["messages"], tools=TOOLS, tool_choice=tool_choice,
                           temperature=1.0, seed=seed, max_tokens=100)
        calls = streamed_calls(list(client.chat.completions.create(**fields, stream=True)))
        whole = client.chat.completions.create(**fields).choices[0]
        assert whole.finish_reason == "tool_calls" and whole.message.content is None
        assert calls == [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]
        assert all(json.loads(arguments) == {"city": "Paris"} for _, arguments in calls)
        most = max(most, len(calls))
    assert most == 1 if choice == "named" else most > 1  # "required" wrote parallel calls for some seed


def test_strict_under_auto_is_served_on_the_bpe_tokenizer(client: openai.OpenAI):
    """get_weather strict under auto: the grammar (tools/strict.py) compiled for the fixture's BPE
    tokenizer; random weights write text, sampled, the same whole and streamed for a seed, and any call
    found is valid under the schema."""
    strict: Any = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}]
    schema = TOOLS[0]["function"]["parameters"]
    for seed in range(3):
        fields: Any = dict(model=MODEL, messages=OFFERED["messages"], tools=strict, temperature=1.0,
                           seed=seed, max_tokens=24)
        whole = client.chat.completions.create(**fields).choices[0]
        chunks = list(client.chat.completions.create(**fields, stream=True))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == (whole.message.content or "") and whole.finish_reason in ("stop", "length",
                                                                                      "tool_calls")
        for call in whole.message.tool_calls or []:
            assert call.function.name == "get_weather"
            jsonschema.validate(json.loads(call.function.arguments), schema)
