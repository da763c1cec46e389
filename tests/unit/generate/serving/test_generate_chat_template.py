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


HERMES = ("{% if tools %}{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
          "Answer with <tool_call>...</tool_call>\n{% endif %}"
          "{% for m in messages %}{{ m.role }}: {{ m.content }}"
          "{% for c in m.tool_calls or [] %} <tool_call>{{ c.function.name }} "
          "{{ c.function.arguments | tojson }}</tool_call>{% endfor %}"
          "{% if m.tool_call_id %} ({{ m.tool_call_id }}){% endif %}{{ '\\n' }}{% endfor %}")
TOOL = {"type": "function", "function": {"name": "f", "parameters": {}}}


def test_a_jinja_template_gets_the_tools_and_each_messages_tool_parts():
    template = JinjaTemplate(HERMES, {})
    calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]
    chat = [("user", "q"), ("assistant", ""), ("tool", "42")]
    fields = [{}, {"tool_calls": calls, "content": None}, {"tool_call_id": "call_1"}]
    out = render_chat(template, chat, ChatOptions(False, tools=[TOOL], fields=fields), 10_000)
    assert out == (f"{json.dumps(TOOL)}\nAnswer with <tool_call>...</tool_call>\nuser: q\n"
                   'assistant: None <tool_call>f {"x": 1}</tool_call>\ntool: 42 (call_1)\n')


@pytest.mark.parametrize("tools, chat, fields", [
    ([TOOL], [("user", "q")], []),
    (None, [("user", "q"), ("tool", "42")], [{}, {"tool_call_id": "c"}]),
])
def test_the_json_template_refuses_tools(tools, chat, fields):
    with pytest.raises(TemplateRenderError, match="cannot write tools"):
        render_chat(JsonChatTemplate(), chat, ChatOptions(tools=tools, fields=fields), 10_000)


@pytest.mark.parametrize("source, params, parser", [
    (HERMES, {}, "hermes"),
    ("{% if tools %}Respond in the format {\"name\": function name, \"parameters\": dictionary of argument "
     "name and its value}.{% endif %}{{ messages[0].content }}", {}, "llama3_json"),
    ("{% if tools %}<|python_tag|>{% endif %}{{ messages[0].content }}", {}, "llama3_json"),
    (CHATML, {}, ""),  # no tools: nothing to read
    (CHATML, {"tool_call_parser": "hermes"}, "hermes"),  # the config says so
    (HERMES, {"tool_call_parser": "llama3_json"}, "llama3_json"),  # the config over the template
])
def test_the_tool_call_parser_is_the_configs_else_found_in_the_template(tmp_path: Path, source, params,
                                                                        parser):
    (tmp_path / "chat_template.jinja").write_text(source)
    assert load_chat_template(tmp_path, "model 'm'", params).tool_call_parser == parser


def test_an_unknown_tool_call_parser_fails_the_load(tmp_path: Path):
    (tmp_path / "chat_template.jinja").write_text(CHATML)
    with pytest.raises(EngineError, match="tool_call_parser 'mistral' is not one of"):
        load_chat_template(tmp_path, "model 'm'", {"tool_call_parser": "mistral"})
