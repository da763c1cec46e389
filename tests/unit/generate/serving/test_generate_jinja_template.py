"""The Jinja environment of models' own chat templates (engine/generate/serving/jinja_template.py), with
templates written in the shapes the model families ship: Llama-3 (`| trim`, bos_token on the first
message), Qwen2's ChatML (a default system turn), Mistral's [INST] (raise_exception on the role order) and a
tools template (tojson). Pure: no folder, no server."""

from __future__ import annotations

import datetime
import json

import pytest

from engine.generate.serving.jinja_template import JinjaTemplate, RenderedTooLong, TemplateRenderError

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

QWEN2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

MISTRAL = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")

# multi-line, as templates are written in files: trim_blocks and lstrip_blocks keep the tags' lines out
TOOLS = """\
{% if tools is not none %}
<tools>
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
</tools>
{% endif %}
{% for message in messages %}
    {% if message['role'] == 'user' %}
U: {{ message['content'] }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}A:{% endif %}"""

TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}


def render(source: str, messages: list[tuple[str, str]], add_generation_prompt: bool = True,
           tokens: dict[str, str] = TOKENS, **variables: object) -> str:
    return JinjaTemplate(source, tokens).render(messages, add_generation_prompt, variables, 100_000)


def test_llama3_trims_each_message_and_writes_bos_first():
    out = render(LLAMA3, [("system", "  Be brief.\n"), ("user", "Hi")],
                 tokens={"bos_token": "<|begin_of_text|>"})
    assert out == ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert not render(LLAMA3, [("user", "Hi")], False).endswith("assistant<|end_header_id|>\n\n")


def test_qwen2_adds_its_default_system_turn_only_without_one():
    assert render(QWEN2, [("user", "Hi")]) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert render(QWEN2, [("system", "Terse."), ("user", "Hi")], False) == (
        "<|im_start|>system\nTerse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")


def test_mistral_writes_inst_and_refuses_a_wrong_role_order_in_its_own_words():
    assert render(MISTRAL, [("user", "a"), ("assistant", "b"), ("user", "c")]) == \
        "<s>[INST] a [/INST]b</s>[INST] c [/INST]"
    with pytest.raises(TemplateRenderError, match=r"^Conversation roles must alternate user/assistant"):
        render(MISTRAL, [("user", "a"), ("user", "b")])
    with pytest.raises(TemplateRenderError, match="Only user and assistant roles are supported!"):
        render(MISTRAL, [("user", "a"), ("system", "s")])


def test_tools_and_documents_are_none_unless_given_and_tojson_is_transformers():
    messages = [("user", "Weather?")]
    assert render(TOOLS, messages) == "U: Weather?\nA:"
    tool = {"name": "météo", "parameters": {"b": 1, "a": [1, 2]}}
    out = JinjaTemplate(TOOLS, TOKENS).render(messages, True, {}, 10_000, tools=[tool])
    # non-ASCII kept, nothing HTML-escaped, keys in their order: json.dumps with ensure_ascii=False
    assert out == f"<tools>\n{json.dumps(tool, ensure_ascii=False)}\n</tools>\nU: Weather?\nA:"
    assert render("{{ x | tojson(indent=2, sort_keys=True) }}", [], x={"b": "<&>", "a": 1}) == \
        '{\n  "a": 1,\n  "b": "<&>"\n}'


def test_chat_template_kwargs_and_the_globals_and_loop_controls():
    thinking = ("{{ messages[-1]['content'] }}{% if enable_thinking is defined and not enable_thinking %}"
                "<think></think>{% endif %}")
    assert render(thinking, [("user", "q")]) == "q"
    assert render(thinking, [("user", "q")], enable_thinking=False) == "q<think></think>"
    assert render("{{ bos_token }}", [], bos_token="<override>") == "<override>"  # kwargs over the tokens
    assert render("{{ strftime_now('%Y') }}", []) == str(datetime.datetime.now().year)
    assert render("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m['content'] }}"
                  "{% endfor %}", [("user", "a"), ("user", "b")]) == "a"
    assert render("[{{ unk_token }}]", []) == "[]"  # a token the folder does not name writes nothing


@pytest.mark.parametrize(("source", "words"), [
    ("{{ nothing.here }}", "'nothing' is undefined"),
    ("{{ messages.append(1) }}", "unsafe"),  # the immutable sandbox: the messages stay as given
    ("{{ ''.__class__.__mro__ }}", "unsafe"),  # no way into Python's internals
    ("{{ 1 / 0 }}", "ZeroDivisionError"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
    ("{% set x = 'x' * 10**9 %}", "a value of 1000000000 items"),  # refused before it is made
    ("{{ 2 ** 100000 }}", "at most 4096 bits"),
])
def test_a_failing_template_is_a_render_error_not_a_crash(source: str, words: str):
    with pytest.raises(TemplateRenderError, match=words):
        render(source, [("user", "x")])


def test_a_template_that_does_not_parse_is_refused_with_its_line():
    with pytest.raises(TemplateRenderError, match=r"does not parse: .*\(line 2\)"):
        JinjaTemplate("ok\n{% if %}", {})


def test_the_rendered_text_is_bounded_while_it_is_written():
    endless = "{% for i in range(100000) %}{{ 'xxxxxxxxxx' }}{% endfor %}"
    with pytest.raises(RenderedTooLong):
        JinjaTemplate(endless, {}).render([], True, {}, 5_000)
    assert len(JinjaTemplate(endless, {}).render([], True, {}, 1_000_000)) == 1_000_000
