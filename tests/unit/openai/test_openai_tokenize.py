"""vLLM's /tokenize and /detokenize bodies (engine/openai/tokenize.py): the two /tokenize forms told apart by
`messages`, each taking its own fields and refusing the other's by name, the prompt fields checked by
protocol.py as a generation request's are, and /detokenize's token ids. Pure: no server (the same over HTTP
against a real model: tests/functional/openai/test_openai_operations.py)."""

from __future__ import annotations

import pytest

from engine.openai.errors import OpenAIError
from engine.openai.tokenize import parse_detokenize, parse_tokenize, tokenize_answer

CHAT = [{"role": "user", "content": "hi"}]


def test_the_completion_form_is_a_completions_prompt():
    request = parse_tokenize({"model": "m", "prompt": "hello", "add_special_tokens": False})
    assert not request.api.chat and request.api.prompts == ("hello",)
    assert not request.api.add_special_tokens and not request.return_token_strs


def test_the_chat_form_is_a_chat_completions_prompt():
    request = parse_tokenize({"model": "m", "messages": CHAT, "return_token_strs": True,
                              "mm_processor_kwargs": {}})
    assert request.api.chat and request.api.messages == (("user", "hi"),) and request.return_token_strs


@pytest.mark.parametrize("doc, param, code", [
    ({"model": "m", "prompt": "x", "temperature": 0}, "temperature", "unknown_parameter"),
    ({"model": "m", "prompt": "x", "add_generation_prompt": True}, "add_generation_prompt",
     "unknown_parameter"),  # a chat form field, in the completion form
    ({"model": "m", "messages": CHAT, "prompt": "x"}, "prompt", "unknown_parameter"),
    ({"model": "m", "prompt": [1, 2]}, "prompt", "invalid_type"),
    ({"model": "m", "prompt": "x", "return_token_strs": 1}, "return_token_strs", "invalid_type"),
    ({"model": "m", "messages": CHAT, "mm_processor_kwargs": {"a": 1}}, "mm_processor_kwargs",
     "unsupported_parameter"),
    ({"model": "m", "messages": CHAT, "tools": [{"type": "function"}]}, "tools[0].function", None),
    ({"prompt": "x"}, "model", None),
    ({"model": "m", "messages": []}, "messages", "empty_array"),
])
def test_tokenize_refusals_name_the_field(doc: dict, param: str, code: str | None):
    with pytest.raises(OpenAIError) as err:
        parse_tokenize(doc)
    assert (err.value.status, err.value.param, err.value.code) == (400, param, code)


def test_detokenize_takes_a_model_and_token_ids():
    assert parse_detokenize({"model": "m", "tokens": [0, 5]}).tokens == (0, 5)
    assert parse_detokenize({"model": "m", "tokens": []}).tokens == ()
    for doc, param in (({"tokens": [1]}, "model"), ({"model": "m"}, "tokens"),
                       ({"model": "m", "tokens": [-1]}, "tokens"),
                       ({"model": "m", "tokens": [True]}, "tokens"),
                       ({"model": "m", "tokens": [1], "prompt": "x"}, "prompt")):
        with pytest.raises(OpenAIError) as err:
            parse_detokenize(doc)
        assert err.value.param == param, doc


def test_the_answer_is_vllms():
    assert tokenize_answer([1, 2], 512, None) == {"count": 2, "max_model_len": 512, "tokens": [1, 2],
                                                  "token_strs": None}
