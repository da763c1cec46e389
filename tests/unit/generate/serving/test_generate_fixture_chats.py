"""The real exporters' folders (tests/fixtures/llm, built by tools/llm_fixtures) against what transformers
recorded: every chat (Qwen2's tool chats with their tools) rendered by the folder's own template
(chat_template.py, jinja_template.py) and encoded as chat prompts are (without adding special tokens) gives
exactly `apply_chat_template`'s text and ids, and a template's refusal its own words; every recorded answer
decoded a token at a time after the prompt's last tokens (detokenize.py) is the text a server returns
(`decode(prompt + output)` after `decode(prompt)`), a SentencePiece answer's leading space included.
Through each folder's tokenizer.json; no model runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.generate.core.detokenize import OutputText, WindowDecoder
from engine.generate.core.tokenizer import JsonTokenizer
from engine.generate.serving.chat_template import ChatOptions, load_chat_template, render_chat
from engine.generate.serving.jinja_template import TemplateRenderError

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "llm"
EXPECTED = {path.stem: json.loads(path.read_text())
            for path in sorted((FIXTURES / "expected").glob("*.json"))}


def recorded(kind: str) -> list[Any]:
    return [pytest.param(name, case, id=f"{name}-{case['name']}")
            for name, doc in EXPECTED.items() for case in doc.get(kind, [])]


def test_every_fixture_folder_is_here():
    assert {"gpt2", "llama", "llama_spm", "qwen2", "llama_genai"} <= set(EXPECTED)
    assert sum(len(doc["chats"]) for doc in EXPECTED.values()) >= 12


@pytest.mark.parametrize(("name", "chat"), recorded("chats"))
def test_a_recorded_chat_renders_and_encodes_to_transformers_prompt_ids(name: str, chat: dict[str, Any]):
    folder = FIXTURES / "models" / name
    template = load_chat_template(folder, f"model '{name}'").template
    assert template is not None
    messages = tuple((m["role"], m["content"]) for m in chat["messages"])
    if "error" in chat:
        with pytest.raises(TemplateRenderError) as refused:
            render_chat(template, messages, ChatOptions(), 1_000_000)
        assert str(refused.value) == chat["error"]
        return
    text = render_chat(template, messages, ChatOptions(), 1_000_000)
    assert text == chat["prompt_text"]
    tokenizer = JsonTokenizer(folder / "tokenizer.json", None, None)
    assert tokenizer.encode(text, add_special_tokens=False) == chat["prompt_ids"]


@pytest.mark.parametrize(("name", "chat"), recorded("tool_chats"))
def test_a_recorded_tool_chat_renders_with_its_tools_to_transformers_prompt_ids(name: str,
                                                                               chat: dict[str, Any]):
    """Qwen2's tool-capable template: the tools in the system turn, the assistant's call and the tool's
    answer, each message's tool parts given as the API gives them (the call's arguments a dict)."""
    folder = FIXTURES / "models" / name
    template = load_chat_template(folder, f"model '{name}'").template
    assert template is not None
    messages = tuple((m["role"], m["content"] or "") for m in chat["messages"])
    fields = tuple({k: v for k, v in m.items() if k not in ("role", "content")} |
                   ({"content": None} if m["content"] is None else {}) for m in chat["messages"])
    text = render_chat(template, messages, ChatOptions(tools=chat["tools"], fields=fields), 1_000_000)
    assert text == chat["prompt_text"]
    tokenizer = JsonTokenizer(folder / "tokenizer.json", None, None)
    assert tokenizer.encode(text, add_special_tokens=False) == chat["prompt_ids"]


@pytest.mark.parametrize(("name", "case"), recorded("prompts") + recorded("chats")
                         + recorded("tool_chats"))
def test_a_recorded_answer_decodes_after_its_prompt_as_a_server_returns_it(name: str, case: dict[str, Any]):
    if case.get("text") is None:  # over the context, a template's refusal, or no clean boundary
        return
    tokenizer = JsonTokenizer(FIXTURES / "models" / name / "tokenizer.json", None, None)
    prompt = case["prompt_ids"]
    text = OutputText(tokenizer.stream_decoder(True, prompt[-WindowDecoder.PROMPT_CONTEXT:]), ())
    for token in case["output_ids"]:
        text.push(token)
    assert text.text() == case["text"]
