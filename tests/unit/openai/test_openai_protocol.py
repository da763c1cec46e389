"""The OpenAI request bodies checked into ApiRequest (engine/openai/protocol.py): defaults, the accepted
shapes of prompts and messages, and what is refused with which `param`. Pure: no server (the same refusals
over HTTP, with their statuses, are test_openai_errors.py)."""

from __future__ import annotations

import pytest

from engine.openai.errors import OpenAIError
from engine.openai.protocol import parse_body, parse_request


def test_chat_defaults_follow_openai():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    api = parse_request({"model": "m", "messages": [{"role": "developer", "content": "d"},
                                                    {"role": "user", "content": parts}]}, chat=True)
    assert api.messages == (("system", "d"), ("user", "a\nb"))
    assert api.max_tokens is None and api.temperature == 1.0 and api.top_p == 1.0 and api.n == 1
    assert not api.stream and not api.include_usage and api.stop == () and api.seed is None


def test_completions_default_to_16_tokens_and_take_every_prompt_shape():
    assert parse_request({"model": "m", "prompt": "x"}, chat=False).max_tokens == 16
    assert parse_request({"model": "m", "prompt": ["a", "b"]}, chat=False).prompts == ("a", "b")
    assert parse_request({"model": "m", "prompt": [1, 2]}, chat=False).prompts == ((1, 2),)
    assert parse_request({"model": "m", "prompt": [[1], [2, 3]]}, chat=False).prompts == ((1,), (2, 3))


def test_max_completion_tokens_wins_and_stop_may_be_one_string():
    api = parse_request({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
                         "max_completion_tokens": 7, "stop": "END", "stream": True,
                         "stream_options": {"include_usage": True}, "seed": -3, "top_k": 4,
                         "ignore_eos": True, "stop_token_ids": [257]}, chat=True)
    assert api.max_tokens == 7 and api.stop == ("END",) and api.stream and api.include_usage
    assert api.seed == -3 and api.top_k == 4 and api.ignore_eos and api.stop_token_ids == (257,)


def test_fields_that_change_nothing_are_accepted():
    api = parse_request({"model": "m", "prompt": "x", "logprobs": None, "echo": False, "best_of": 1,
                         "presence_penalty": 0, "user": "someone", "metadata": {"k": "v"}, "store": True,
                         "skip_special_tokens": True, "guided_json": None}, chat=False)
    assert api.prompts == ("x",)
    chat = parse_request({"model": "m", "messages": [{"role": "user", "content": "x"}],
                          "add_generation_prompt": True, "continue_final_message": False,
                          "chat_template_kwargs": {}, "response_format": {"type": "text"},
                          "tool_choice": "none", "modalities": ["text"]}, chat=True)
    assert chat.messages == (("user", "x"),)


def test_chat_template_fields_are_read_for_chat():
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    api = parse_request({"model": "m", "messages": messages, "add_generation_prompt": False,
                         "continue_final_message": True, "chat_template_kwargs": {"enable_thinking": False},
                         "chat_template": "{{ messages }}"}, chat=True)
    assert (api.add_generation_prompt, api.continue_final_message) == (False, True)
    assert api.chat_template_kwargs == {"enable_thinking": False} and api.chat_template == "{{ messages }}"
    plain = parse_request({"model": "m", "messages": messages}, chat=True)
    assert (plain.add_generation_prompt, plain.continue_final_message) == (True, False)
    assert (plain.chat_template_kwargs, plain.chat_template) == (None, None)
    assert not plain.add_special_tokens  # vLLM's chat default: the template writes the BOS
    assert parse_request({"model": "m", "messages": messages, "add_special_tokens": True},
                         chat=True).add_special_tokens


@pytest.mark.parametrize(("doc", "param", "message"), [
    ({"continue_final_message": True}, "continue_final_message",
     "Cannot set both `continue_final_message` and `add_generation_prompt` to True."),
    ({"chat_template_kwargs": [1]}, "chat_template_kwargs",
     "[1] is not of type 'object' - 'chat_template_kwargs'"),
    ({"chat_template_kwargs": {"messages": [], "tools": 1}}, "chat_template_kwargs",
     "'chat_template_kwargs' may not set ['messages', 'tools']"),
    ({"chat_template": 3}, "chat_template", "3 is not of type 'string' - 'chat_template'"),
    ({"add_generation_prompt": "no"}, "add_generation_prompt", '"no" is not of type \'boolean\''),
])
def test_chat_template_fields_are_checked(doc: dict, param: str, message: str):
    with pytest.raises(OpenAIError) as refused:
        parse_request({"model": "m", "messages": [{"role": "user", "content": "x"}], **doc}, chat=True)
    error = refused.value.body()["error"]
    assert refused.value.status == 400 and error["param"] == param and error["message"].startswith(message)


@pytest.mark.parametrize("field", ["chat_template_kwargs", "add_generation_prompt", "continue_final_message",
                                   "chat_template"])
def test_chat_template_fields_are_refused_for_completions(field: str):
    value = {"chat_template_kwargs": {"a": 1}, "add_generation_prompt": False, "continue_final_message": True,
             "chat_template": "{{ messages }}"}[field]
    with pytest.raises(OpenAIError) as refused:
        parse_request({"model": "m", "prompt": "x", field: value}, chat=False)
    assert refused.value.body()["error"]["code"] == "unsupported_parameter"


@pytest.mark.parametrize(("field", "value"), [
    ("guided_json", {"type": "object"}), ("guided_regex", "a+"), ("guided_choice", ["a", "b"]),
    ("guided_grammar", "root ::= 'a'"), ("guided_decoding_backend", "xgrammar"),
    ("guided_whitespace_pattern", " "), ("spaces_between_special_tokens", False),
    ("reasoning_effort", "low"),
])
def test_unserved_fields_are_refused_by_name(field: str, value: object):
    with pytest.raises(OpenAIError) as refused:
        parse_request({"model": "m", "messages": [{"role": "user", "content": "x"}], field: value}, chat=True)
    error = refused.value.body()["error"]
    assert refused.value.status == 400 and error["param"] == field
    assert error["code"] == "unsupported_parameter"
    assert error["message"] == f"'{field}' is not supported by this server; leave it out."


@pytest.mark.parametrize(("doc", "chat", "field"), [
    ({"prompt": "x", "a_newer_field": {"x": 1}}, False, "a_newer_field"),
    ({"prompt": "x", "temprature": 0.5}, False, "temprature"),
    ({"prompt": "x", "messages": []}, False, "messages"),       # chat's, not completions'
    ({"prompt": "x", "max_completion_tokens": 4}, False, "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "prompt": "x"}, True, "prompt"),
    ({"messages": [{"role": "user", "content": "x"}], "use_beam_search": None}, True, "use_beam_search"),
])
def test_unknown_fields_are_refused_in_openais_words(doc: dict, chat: bool, field: str):
    with pytest.raises(OpenAIError) as refused:
        parse_request({"model": "m", **doc}, chat)
    error = refused.value.body()["error"]
    assert refused.value.status == 400 and error["param"] == field and error["code"] == "unknown_parameter"
    assert error["message"] == f"Unrecognized request argument supplied: {field}"


@pytest.mark.parametrize(("doc", "param"), [
    ({"model": "m", "messages": []}, "messages"),
    ({"model": "m", "messages": [{"role": "user"}]}, "messages[0].content"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "seed": 1.5}, "seed"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": ["a"] * 5}, "stop"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True,
      "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ({"model": "m", "prompt": []}, "prompt"),
    ({"model": "m", "prompt": [[]]}, "prompt"),
    ({"model": "m", "prompt": "x", "echo": True}, "echo"),
    ({"model": "m", "prompt": "x", "response_format": {"type": "json_schema"}},
     "response_format.json_schema"),
    ({"model": "", "prompt": "x"}, "model"),
])
def test_refusals_name_the_field(doc: dict, param: str):
    chat = "messages" in doc
    with pytest.raises(OpenAIError) as refused:
        parse_request(doc, chat)
    assert refused.value.status == 400 and refused.value.param == param
    assert refused.value.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(("doc", "param", "code", "message"), [
    ({"stop": ["a"] * 5}, "stop", "array_above_max_length",
     "Invalid 'stop': array too long. Expected an array with maximum length 4, but got an array with "
     "length 5 instead."),
    ({"stop": ["a", "b" * 257]}, "stop[1]", "string_above_max_length",
     "Invalid 'stop[1]': string too long. Expected a string with maximum length 256, but got a string with "
     "length 257 instead."),
    ({"stop": "b" * 300}, "stop", "string_above_max_length", "Invalid 'stop': string too long."),
    ({"stop_token_ids": list(range(129))}, "stop_token_ids", "array_above_max_length",
     "Invalid 'stop_token_ids': array too long. Expected an array with maximum length 128, but got an array "
     "with length 129 instead."),
])
def test_stop_rules_past_their_bounds_are_refused_as_openai_refuses_long_arrays(doc, param, code, message):
    with pytest.raises(OpenAIError) as refused:
        parse_request({"model": "m", "prompt": "x", **doc}, chat=False)
    error = refused.value.body()["error"]
    assert refused.value.status == 400 and error["param"] == param and error["code"] == code
    assert error["message"].startswith(message)
    ok = parse_request({"model": "m", "prompt": "x", "stop": ["s" * 256] * 4,
                        "stop_token_ids": list(range(128))}, chat=False)
    assert len(ok.stop) == 4 and len(ok.stop_token_ids) == 128


def test_a_body_must_be_a_json_object():
    assert parse_body(b'{"a": 1}') == {"a": 1}
    for body in (b"", b"nul", b"[]", b'"x"'):
        with pytest.raises(OpenAIError) as refused:
            parse_body(body)
        assert refused.value.status == 400


def test_vllms_sampling_and_prompt_fields_are_read():
    api = parse_request({"model": "m", "prompt": "x", "max_tokens": 8, "min_p": 0.1, "min_tokens": 8,
                         "include_stop_str_in_output": True, "add_special_tokens": False,
                         "truncate_prompt_tokens": 5, "skip_special_tokens": False}, chat=False)
    assert not api.skip_special_tokens
    assert (api.min_p, api.min_tokens, api.include_stop_str_in_output) == (0.1, 8, True)
    assert (api.add_special_tokens, api.truncate_prompt_tokens) == (False, 5)
    plain = parse_request({"model": "m", "prompt": "x"}, chat=False)
    assert (plain.min_p, plain.min_tokens, plain.include_stop_str_in_output) == (0.0, 0, False)
    assert (plain.add_special_tokens, plain.truncate_prompt_tokens) == (True, None)
    assert parse_request({"model": "m", "prompt": "x", "truncate_prompt_tokens": -1},
                         chat=False).truncate_prompt_tokens == -1


@pytest.mark.parametrize(("doc", "param", "message"), [
    ({"min_p": 1.5}, "min_p", "Invalid 'min_p': 1.5; it must be between 0 and 1."),
    ({"min_p": "0.1"}, "min_p", "\"0.1\" is not of type 'number' - 'min_p'"),
    ({"min_tokens": -1}, "min_tokens", "Invalid 'min_tokens': -1; it must be at least 0."),
    ({"min_tokens": 17}, "min_tokens", "Invalid 'min_tokens': 17; it must be at most 'max_tokens' (16)."),
    ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens", "Invalid 'truncate_prompt_tokens': 0;"),
    ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens", "Invalid 'truncate_prompt_tokens': -2;"),
    ({"include_stop_str_in_output": 1}, "include_stop_str_in_output", "1 is not of type 'boolean'"),
    ({"add_special_tokens": "no"}, "add_special_tokens", "\"no\" is not of type 'boolean'"),
])
def test_vllms_fields_out_of_range_are_refused_by_name(doc, param, message):
    with pytest.raises(OpenAIError) as refused:
        parse_request({"model": "m", "prompt": "x", **doc}, chat=False)
    error = refused.value.body()["error"]
    assert refused.value.status == 400 and error["param"] == param and error["message"].startswith(message)
    assert error["type"] == "invalid_request_error"
