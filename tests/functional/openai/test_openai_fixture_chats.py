"""The real exporters' folders (tests/fixtures/llm: Optimum's Llama-3-style, Qwen2 and SentencePiece Llama
exports, and onnxruntime-genai's Llama) chatting through the `openai` package, each served AS IT IS (no
config.pbtxt): its own Jinja template (chat_template.jinja, or tokenizer_config.json's), the prompt encoded
without a second BOS, generation_config.json's EOS list (Llama-3's <|eot_id|> besides <|end_of_text|>) and
sampling defaults (Qwen2's repetition penalty), so every recorded chat answers with transformers' greedy
text, token counts and finish reason, whole and streamed, a SentencePiece answer's leading space included; a
template's refusal is a 400 in its own words. The request says only what a user would: the messages,
max_tokens and temperature 0."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from conftest import ROOT, RunningServer, openai_client, start_server

FIXTURES = ROOT / "tests" / "fixtures" / "llm"
SERVED = ("llama", "qwen2", "llama_spm", "llama_genai")


def expected(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / "expected" / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    running = start_server(FIXTURES / "models", tmp_path_factory.mktemp("fixture_chats_log") / "server.log")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai_client(server)


def recorded_chats() -> list[Any]:
    return [pytest.param(name, chat, id=f"{name}-{chat['name']}")
            for name in SERVED for chat in expected(name)["chats"]]


def ask(name: str) -> dict[str, Any]:
    return {"model": name, "max_tokens": expected(name)["greedy"]["max_new_tokens"], "temperature": 0}


@pytest.mark.parametrize(("name", "chat"), recorded_chats())
def test_a_recorded_chat_answers_as_transformers_did(client: openai.OpenAI, name: str, chat: dict[str, Any]):
    if "error" in chat:  # the template refuses the chat: a 400 in its own words
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(messages=chat["messages"], **ask(name))
        assert refused.value.code == "chat_template_error" and chat["error"] in refused.value.message
        return
    out = client.chat.completions.create(messages=chat["messages"], **ask(name))
    assert out.choices[0].message.content == chat["text"]
    assert out.choices[0].finish_reason == chat["finish_reason"]
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(chat["prompt_ids"]),
                                                                      len(chat["output_ids"]))


@pytest.mark.parametrize("name", list(SERVED))
def test_a_streamed_chat_gives_the_same_text(client: openai.OpenAI, name: str):
    chat = next(c for c in expected(name)["chats"] if c["name"] == "system")
    chunks = list(client.chat.completions.create(messages=chat["messages"], stream=True, **ask(name)))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat["text"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [chat["finish_reason"]]


@pytest.mark.parametrize("name", list(SERVED))
def test_a_completion_keeps_its_first_words_leading_space(client: openai.OpenAI, name: str):
    """Every recorded prompt (a context's worth aside): the server's text is transformers'
    `decode(prompt + output)` after `decode(prompt)`, also where that differs from the answer's tokens
    decoded alone (SentencePiece's leading space)."""
    prompts = [p for p in expected(name)["prompts"] if p.get("text") is not None]
    for prompt in prompts:
        out = client.completions.create(prompt=prompt["prompt"], **ask(name))
        assert out.choices[0].text == prompt["text"], prompt["name"]
        assert out.usage is not None and out.usage.prompt_tokens == len(prompt["prompt_ids"])
    if name == "llama_spm":
        assert any(p["text"] != p["text_alone"] for p in prompts)  # the case this is about is among them
