"""A model folder's chat template (engine/generate/serving/chat_template.py): where it comes from (its own
chat_template.json, chat_template.jinja, tokenizer_config.json's), none without one, the refusals of a
malformed one, and add_generation_prompt / continue_final_message on either kind. Pure: files in a temporary
folder, no server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.errors import EngineError
from engine.generate.serving.chat_template import (
    FILENAME,
    ChatOptions,
    JsonChatTemplate,
    load_chat_template,
    render_chat,
)
from engine.generate.serving.jinja_template import JinjaTemplate, TemplateRenderError

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CHAT = [("system", "Be brief."), ("user", "Hi {there}"), ("assistant", "Hello"), ("user", "Again")]


def test_a_folder_without_a_template_serves_no_chat(tmp_path: Path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    chat = load_chat_template(tmp_path, "model 'm'")
    assert chat.template is None and chat.special_tokens == {"bos_token": "<s>"}


def test_the_json_template_with_its_defaults(tmp_path: Path):
    (tmp_path / FILENAME).write_text("{}")
    template = load_chat_template(tmp_path, "model 'm'").template
    assert template == JsonChatTemplate()
    assert render_chat(template, CHAT, ChatOptions(), 10_000) == (
        "<|system|>\nBe brief.\n<|user|>\nHi {there}\n<|assistant|>\nHello\n<|user|>\nAgain\n<|assistant|>\n")
    assert template.stop == ("<|user|>", "<|system|>")


def test_a_folders_own_template_replaces_what_it_names(tmp_path: Path):
    (tmp_path / FILENAME).write_text(json.dumps({
        "user": "[INST] {content} [/INST]", "assistant": " {content}</s>", "prefix": "<s>",
        "generation_prompt": "", "stop": ["</s>"]}))
    template = load_chat_template(tmp_path, "model 'm'").template
    assert isinstance(template, JsonChatTemplate)
    assert template.render([("user", "a"), ("assistant", "b"), ("user", "{content}")]) == \
        "<s>[INST] a [/INST] b</s>[INST] {content} [/INST]"
    assert template.system == JsonChatTemplate().system and template.stop == ("</s>",)


def test_the_sources_in_order_json_then_jinja_file_then_tokenizer_config(tmp_path: Path):
    config = {"chat_template": "from-config {{ messages[0]['content'] }}", "eos_token": {"content": "</s>"}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    chat = load_chat_template(tmp_path, "model 'm'")
    assert chat.template is not None and chat.template.source == "tokenizer_config.json chat_template"
    assert chat.template.render([("user", "x")], True, {}, 100) == "from-config x"
    assert chat.special_tokens == {"eos_token": "</s>"}  # an added token's {"content": ...}

    (tmp_path / "chat_template.jinja").write_text("from-file {{ eos_token }}")
    chat = load_chat_template(tmp_path, "model 'm'")
    assert chat.template is not None and chat.template.source == "chat_template.jinja"
    assert chat.template.render([("user", "x")], True, {}, 100) == "from-file </s>"

    (tmp_path / FILENAME).write_text("{}")
    assert isinstance(load_chat_template(tmp_path, "model 'm'").template, JsonChatTemplate)


def test_named_templates_use_default_and_config_parameters_name_the_tokens(tmp_path: Path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": "tool_use", "template": "tools"}, {"name": "default", "template": "{{ bos_token }}chat"}]}))
    chat = load_chat_template(tmp_path, "model 'm'", {"bos_token": "<|begin|>", "tokenizer": "x"})
    assert chat.template is not None
    assert chat.template.render([("user", "x")], True, {}, 100) == "<|begin|>chat"


@pytest.mark.parametrize(("files", "words"), [
    ({"chat_template.jinja": "{% for m in messages %}"},
     "chat_template.jinja: the chat template does not parse"),
    ({"tokenizer_config.json": "{nope"}, "tokenizer_config.json is not valid JSON"),
    ({"tokenizer_config.json": '{"chat_template": 3}'}, "chat_template must be a string or a list"),
    ({"tokenizer_config.json": '{"chat_template": [{"name": "rag", "template": ""}]}'}, "none 'default'"),
])
def test_a_template_that_cannot_serve_fails_the_load_naming_it(tmp_path: Path, files: dict[str, str],
                                                               words: str):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(EngineError) as refused:
        load_chat_template(tmp_path, "model 'm'")
    assert words in refused.value.message and "model 'm'" in refused.value.message


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
def test_a_malformed_json_template_is_refused_naming_the_problem(tmp_path: Path, content: str, words: str):
    (tmp_path / FILENAME).write_text(content)
    with pytest.raises(EngineError) as refused:
        load_chat_template(tmp_path, "model 'm'")
    assert words in refused.value.message and "model 'm'" in refused.value.message
    assert str(tmp_path) not in refused.value.message


def test_no_generation_prompt_and_continuing_the_final_message(tmp_path: Path):
    (tmp_path / "chat_template.jinja").write_text(CHATML)
    template = load_chat_template(tmp_path, "model 'm'").template
    assert template is not None
    chat = [("user", "Name a colour."), ("assistant", "The colour is ")]
    assert render_chat(template, chat, ChatOptions(add_generation_prompt=False), 1000) == (
        "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\nThe colour is <|im_end|>\n")
    # the text is cut after the final message, its trailing space kept where the template kept it
    continued = render_chat(template, chat, ChatOptions(False, continue_final_message=True), 1000)
    assert continued == "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\nThe colour is "
    # the JSON format, the same way
    assert render_chat(JsonChatTemplate(), chat, ChatOptions(False, True), 1000) == \
        "<|user|>\nName a colour.\n<|assistant|>\nThe colour is "


def test_continuing_a_message_the_template_trimmed_cuts_after_its_stripped_text():
    trimming = JinjaTemplate("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] | trim }}</s>"
                             "{% endfor %}", {})
    out = render_chat(trimming, [("user", "a"), ("assistant", " Once upon ")], ChatOptions(False, True), 100)
    assert out == "[user]a</s>[assistant]Once upon"


def test_continuing_a_message_the_template_does_not_write_is_refused():
    silent = JinjaTemplate("{% for m in messages %}{{ m['role'] }};{% endfor %}", {})
    with pytest.raises(TemplateRenderError, match="final message does not appear"):
        render_chat(silent, [("user", "a"), ("assistant", "b")], ChatOptions(False, True), 100)
