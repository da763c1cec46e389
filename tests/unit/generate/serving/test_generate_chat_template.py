"""A model folder's chat template (engine/generate/serving/chat_template.py): the default, a folder's own
chat_template.json, and the refusals of a malformed one. Pure: files in a temporary folder, no server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.errors import EngineError
from engine.generate.serving.chat_template import DEFAULT, FILENAME, load_chat_template


def test_a_folder_without_a_template_gets_the_default(tmp_path: Path):
    template = load_chat_template(tmp_path, "model 'm'")
    assert template is DEFAULT
    assert template.render([("system", "Be brief."), ("user", "Hi {there}"), ("assistant", "Hello"),
                            ("user", "Again")]) == (
        "<|system|>\nBe brief.\n<|user|>\nHi {there}\n<|assistant|>\nHello\n<|user|>\nAgain\n<|assistant|>\n")
    assert template.stop == ("<|user|>", "<|system|>")


def test_a_folders_own_template_replaces_what_it_names(tmp_path: Path):
    (tmp_path / FILENAME).write_text(json.dumps({
        "user": "[INST] {content} [/INST]", "assistant": " {content}</s>", "prefix": "<s>",
        "generation_prompt": "", "stop": ["</s>"]}))
    template = load_chat_template(tmp_path, "model 'm'")
    assert template.render([("user", "a"), ("assistant", "b"), ("user", "{content}")]) == \
        "<s>[INST] a [/INST] b</s>[INST] {content} [/INST]"
    assert template.system == DEFAULT.system and template.stop == ("</s>",)


@pytest.mark.parametrize(("content", "words"), [
    ("{not json", "not valid JSON"),
    ("[1]", "must be a JSON object"),
    ('{"usr": "{content}"}', "unknown keys ['usr']"),
    ('{"user": 3}', "'user' must be a string"),
    ('{"user": "no placeholder"}', "must contain {content}"),
    ('{"stop": "x"}', "'stop' must be a list"),
    ('{"stop": [""]}', "'stop' must be a list of non-empty strings"),
    ('{"stop": ["a", "b", "c", "d", "e"]}', "'stop' may hold at most 4 strings of at most 256 characters"),
    ('{"stop": ["' + "x" * 257 + '"]}', "'stop' may hold at most 4 strings of at most 256 characters"),
])
def test_a_malformed_template_is_refused_naming_the_problem(tmp_path: Path, content: str, words: str):
    (tmp_path / FILENAME).write_text(content)
    with pytest.raises(EngineError) as refused:
        load_chat_template(tmp_path, "model 'm'")
    assert words in refused.value.message and "model 'm'" in refused.value.message
    assert str(tmp_path) not in refused.value.message
