"""The request bodies of `POST /v1/completions` and `POST /v1/chat/completions`, checked into `ApiRequest`.

Every field is checked for its type and range here, once, with OpenAI's error shape: `param` names the field,
as OpenAI's own 400s do. Every field is served, or on the compatibility list of fields that change no answer
(`_IGNORED`, each with why), or refused by name: those we do not serve (`echo`, vLLM's removed `guided_*`
fields, the tool and chat template fields on completions, ...) unless sent with a value that asks for nothing,
and unknown ones with OpenAI's "Unrecognized request argument supplied". Chat's tool fields (`tools`,
`tool_choice`, `parallel_tool_calls`, tool messages) are checked by tools/request.py. Extensions beyond
OpenAI's fields, in vLLM's names and with vLLM's meaning (the `openai` client sends them through
`extra_body`): `top_k`, `min_p`, `ignore_eos`, `stop_token_ids`, `repetition_penalty`, `min_tokens`,
`include_stop_str_in_output`, `add_special_tokens`, `truncate_prompt_tokens`, `skip_special_tokens`,
`structured_outputs` (with OpenAI's `response_format`: structured.py), and chat's `chat_template_kwargs`,
`add_generation_prompt`, `continue_final_message` and `chat_template` (the service refuses the last unless
the operator trusts request templates). What the engine checks after every token is bounded here
(generate/core/request.py): at most 4 `stop` strings of at most 256 characters, at most 128 `stop_token_ids`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from ..generate.core.grammar import GrammarSpec
from ..generate.core.request import MAX_LOGPROBS, MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS
from ..generate.serving.request_defaults import SAMPLING_DEFAULTS
from .errors import OpenAIError, bad_request
from .structured import structured_spec
from .tools.forced import forced_call_spec
from .tools.request import ToolRequest, message_fields, parse_tools

MAX_N = 16          # choices per request
MAX_PROMPTS = 64    # prompts in one completions request
MAX_COMPLETION_LOGPROBS = 5  # completions' `logprobs` (OpenAI's limit); chat's `top_logprobs` goes to 20


@dataclass(frozen=True, slots=True)
class ApiRequest:
    """A checked request. `prompts` (completions) or `messages` (chat: (role, text), roles checked) says
    what to complete; the rest says how."""

    chat: bool
    model: str
    prompts: tuple[str | tuple[int, ...], ...]
    messages: tuple[tuple[str, str], ...]
    max_tokens: int | None           # None: as many as the context leaves (chat's default)
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    n: int
    stream: bool
    include_usage: bool
    logprobs: int | None = None      # each token's log-probability and this many most likely; None: none
    # vLLM's extensions (sampling: generate/core/request.py SamplingParams; the prompt: prompt.py PromptDoor)
    min_p: float = 0.0
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    add_special_tokens: bool = True  # vLLM's defaults: true for completions, false for chat (its template
    # writes the BOS)
    truncate_prompt_tokens: int | None = None  # keep the prompt's last this many tokens; -1: the context's
    skip_special_tokens: bool = True
    # chat only: how the messages are rendered (generate/serving/chat_template.py)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None  # a request's own Jinja template (served only when trusted: service)
    # response_format / structured_outputs (structured.py): what the output must match; None: anything
    structured: GrammarSpec | None = None
    tools: ToolRequest = ToolRequest()  # chat: tools, tool_choice (openai/tools/request.py)
    message_fields: tuple[dict[str, Any], ...] = ()  # chat: each message's tool parts, for its template
    # the sampling fields the request left out, which get the model folder's defaults where it has them
    # (generate/serving/request_defaults.py), else the ones above
    unset: frozenset[str] = frozenset()


def parse_body(body: bytes | bytearray) -> dict[str, Any]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise bad_request(f"We could not parse the JSON body of your request ({e}). The body must be a JSON "
                          "object with the request's fields.") from None
    if not isinstance(doc, dict):
        raise bad_request("The request body must be a JSON object.")
    return doc


def parse_request(doc: dict[str, Any], chat: bool) -> ApiRequest:
    model = doc.get("model")
    if model is None:
        raise bad_request("You must provide a model parameter.", "model")
    if not isinstance(model, str) or not model:
        raise bad_request(f"{_show(model)} is not a valid model name - 'model'", "model")
    _check_fields(doc, chat)
    messages: tuple[tuple[str, str], ...] = ()
    fields: tuple[dict[str, Any], ...] = ()
    prompts: tuple[str | tuple[int, ...], ...] = ()
    tools = ToolRequest()
    if chat:
        messages, fields = _messages(doc.get("messages"))
        tools = parse_tools(doc)
        max_tokens = _int(doc, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = _int(doc, "max_tokens", 1)
        wanted = _bool(doc, "logprobs", False)
        top = _int(doc, "top_logprobs", 0, MAX_LOGPROBS)
        if top and not wanted:
            raise bad_request("'top_logprobs' needs 'logprobs' set to true.", "top_logprobs")
        logprobs = (top or 0) if wanted else None
    else:
        prompts = _prompts(doc.get("prompt"))
        max_tokens = _int(doc, "max_tokens", 1)
        if max_tokens is None and "max_tokens" not in doc:
            max_tokens = 16  # OpenAI's default for completions
        logprobs = _int(doc, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
    stream = _bool(doc, "stream", False)
    options = doc.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise bad_request(f"{_show(options)} is not of type 'object' - 'stream_options'",
                              "stream_options")
        if not stream:
            raise bad_request("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                              "stream_options")
        include_usage = _bool(options, "include_usage", False, "stream_options.include_usage")
    temperature = _number(doc, "temperature", 0.0, 2.0)
    top_p = _number(doc, "top_p", 0.0, 1.0)
    if top_p is not None and top_p == 0.0:
        top_p = 1e-9  # OpenAI accepts 0: only the most likely token remains
    min_tokens = _int(doc, "min_tokens", 0) or 0
    if max_tokens is not None and min_tokens > max_tokens:
        field = "max_completion_tokens" if doc.get("max_completion_tokens") is not None else "max_tokens"
        raise bad_request(f"Invalid 'min_tokens': {min_tokens}; it must be at most '{field}' ({max_tokens}).",
                          "min_tokens", "invalid_value")
    truncate = _int(doc, "truncate_prompt_tokens", -1)
    if truncate == 0:
        raise bad_request("Invalid 'truncate_prompt_tokens': 0; it must be at least 1 (-1: the model's "
                          "context).", "truncate_prompt_tokens", "invalid_value")
    add_generation_prompt = _bool(doc, "add_generation_prompt", True)
    continue_final = _bool(doc, "continue_final_message", False)
    if chat and continue_final and add_generation_prompt:
        raise bad_request("Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                          "continue_final_message", "invalid_value")
    repetition = _number(doc, "repetition_penalty", 0.0, 100.0)
    if repetition == 0.0:
        raise bad_request("Invalid 'repetition_penalty': 0; it must be greater than 0 (1: no penalty).",
                          "repetition_penalty", "invalid_value")
    structured = structured_spec(doc)
    forced = forced_call_spec(tools)  # tool_choice required or named: the answer constrained to a call
    if forced is not None:
        if structured is not None:
            raise bad_request("'tool_choice' required or a named function constrains the answer to a call: "
                              "send no 'response_format' or 'structured_outputs' with it.", "tool_choice",
                              "invalid_value")
        structured = forced
    return ApiRequest(
        chat=chat, model=model, prompts=prompts, messages=messages, max_tokens=max_tokens,
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        top_k=_int(doc, "top_k", 0) or 0,
        seed=_int(doc, "seed", -(2**63), 2**64 - 1),
        stop=_stop(doc.get("stop")),
        stop_token_ids=tuple(_int_list(doc.get("stop_token_ids"), "stop_token_ids", MAX_STOP_TOKEN_IDS)),
        ignore_eos=_bool(doc, "ignore_eos", False),
        presence_penalty=_number(doc, "presence_penalty", -2.0, 2.0) or 0.0,
        frequency_penalty=_number(doc, "frequency_penalty", -2.0, 2.0) or 0.0,
        repetition_penalty=1.0 if repetition is None else repetition,
        n=_int(doc, "n", 1, MAX_N) or 1,
        stream=stream, include_usage=include_usage, logprobs=logprobs,
        min_p=_number(doc, "min_p", 0.0, 1.0) or 0.0, min_tokens=min_tokens,
        include_stop_str_in_output=_bool(doc, "include_stop_str_in_output", False),
        add_special_tokens=_bool(doc, "add_special_tokens", not chat), truncate_prompt_tokens=truncate,
        skip_special_tokens=_bool(doc, "skip_special_tokens", True),
        add_generation_prompt=add_generation_prompt, continue_final_message=continue_final,
        chat_template_kwargs=_template_kwargs(doc.get("chat_template_kwargs")),
        chat_template=_template(doc.get("chat_template")), tools=tools, message_fields=fields,
        structured=structured,
        unset=frozenset(k for k in SAMPLING_DEFAULTS if doc.get(k) is None))


# Every field a request may carry is in one of the lists below; any other is refused by name
# (`_check_fields`), so that no field is silently ignored unless we know it changes nothing (the `openai`
# package sends only the fields its caller passes, and vLLM's through `extra_body`).
#
# Read and served by parse_request:
_SERVED_BOTH = frozenset({
    "model", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "stream", "stream_options",
    "presence_penalty", "frequency_penalty", "logprobs",
    # vLLM's extensions, with vLLM's meaning
    "top_k", "min_p", "ignore_eos", "stop_token_ids", "repetition_penalty", "min_tokens",
    "include_stop_str_in_output", "add_special_tokens", "truncate_prompt_tokens", "skip_special_tokens",
    # structured output (structured.py): OpenAI's response_format, vLLM's structured_outputs
    "response_format", "structured_outputs"})
_SERVED = {True: _SERVED_BOTH | {"messages", "max_completion_tokens", "top_logprobs", "chat_template",
                                 "chat_template_kwargs", "add_generation_prompt", "continue_final_message",
                                 "tools", "tool_choice", "parallel_tool_calls"},
           False: _SERVED_BOTH | {"prompt"}}

# The compatibility list: accepted and ignored, each because it cannot change the answer here.
_IGNORED: dict[str, str] = {
    "user": "OpenAI's end-user id for its abuse monitoring",
    "safety_identifier": "OpenAI's successor to `user`",
    "prompt_cache_key": "a routing hint for OpenAI's prompt cache; ours finds shared prefixes itself",
    "metadata": "tags for OpenAI's stored completions; nothing is stored here",
    "store": "whether OpenAI keeps the completion for its dashboards; nothing is kept here",
    "service_tier": "OpenAI's price and latency tier; every request here is served alike",
}

# Not served, refused by name unless sent with a value that asks for nothing (field → the values that may
# be sent besides null). vLLM's among them stay here until they are served.
_OFF: tuple[Any, ...] = (False, 0, "", [], {})
_UNSERVED: dict[str, tuple[Any, ...]] = {
    "logit_bias": _OFF, "tools": _OFF, "functions": _OFF, "tool_choice": (*_OFF, "none"),
    "parallel_tool_calls": (True, False),  # completions: `tools` is chat's
    "function_call": (*_OFF, "none"), "suffix": _OFF,
    "echo": _OFF, "best_of": (*_OFF, 1), "audio": _OFF, "prediction": _OFF, "modalities": ([], ["text"]),
    "reasoning_effort": (), "verbosity": (), "web_search_options": (),
    # vLLM's chat template inputs, served for chat (above); a completion has no template
    "chat_template": (), "chat_template_kwargs": ({},), "add_generation_prompt": (True,),
    "continue_final_message": (False,),
    # vLLM's: how special tokens are joined to the text when written (`tokenizers` writes them its own way)
    "spaces_between_special_tokens": (True,),
    # vLLM's guided decoding, removed by vLLM 0.12 for `structured_outputs` (served): refused by name
    "guided_json": (), "guided_regex": (), "guided_choice": (), "guided_grammar": (),
    "guided_decoding_backend": (), "guided_whitespace_pattern": (),
}


def _check_fields(doc: dict[str, Any], chat: bool) -> None:
    served = _SERVED[chat]
    for key, value in doc.items():
        if key in served or key in _IGNORED:
            continue
        allowed = _UNSERVED.get(key)
        if allowed is None:
            raise bad_request(f"Unrecognized request argument supplied: {key}", key, "unknown_parameter")
        if value is not None and not any(type(value) is type(ok) and value == ok for ok in allowed):
            raise bad_request(f"'{key}' is not supported by this server; leave it out.", key,
                              "unsupported_parameter")


def _messages(value: Any) -> tuple[tuple[tuple[str, str], ...], tuple[dict[str, Any], ...]]:
    """The (role, text) of each message, and each one's tool parts (tools/request.py `message_fields`)."""
    if value is None:
        raise bad_request("Missing required parameter: 'messages'.", "messages")
    if not isinstance(value, list):
        raise bad_request(f"{_show(value)} is not of type 'array' - 'messages'", "messages")
    if not value:
        raise bad_request("[] is too short - 'messages': send at least one message.", "messages",
                          "empty_array")
    out, fields = [], []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad_request(f"{_show(message)} is not of type 'object' - '{where}'", where)
        role = message.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise bad_request(f"Invalid value {_show(role)} for '{where}.role': this server takes 'system', "
                              "'developer', 'user', 'assistant' and 'tool' messages.", f"{where}.role")
        extra = message_fields(message, role, where)
        content = message.get("content")
        text = "" if content is None and "tool_calls" in extra else _content(content, f"{where}.content")
        out.append((role, text))
        fields.append(extra)
    return tuple(out), tuple(fields)


# The render variables a request's chat_template_kwargs may not replace (jinja_template.py sets them).
_TEMPLATE_VARIABLES = frozenset({"messages", "add_generation_prompt", "tools", "documents"})


def _template_kwargs(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request(f"{_show(value)} is not of type 'object' - 'chat_template_kwargs'",
                          "chat_template_kwargs", "invalid_type")
    taken = sorted(_TEMPLATE_VARIABLES & set(value))
    if taken:
        raise bad_request(f"'chat_template_kwargs' may not set {taken}: the server sets them (send "
                          "'add_generation_prompt' as its own field).", "chat_template_kwargs",
                          "invalid_value")
    return value


def _template(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise bad_request(f"{_show(value)} is not of type 'string' - 'chat_template'", "chat_template",
                          "invalid_type")
    return value


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        raise bad_request(f"Missing required parameter: '{where}'.", where)
    if not isinstance(value, list):
        raise bad_request(f"{_show(value)} is not of type 'string' or 'array' - '{where}'", where)
    texts = []
    for i, part in enumerate(value):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise bad_request(f"'{where}[{i}]' must be a text part ({{\"type\": \"text\", \"text\": ...}}); "
                              "this server takes text only.", f"{where}[{i}]")
        texts.append(part["text"])
    return "\n".join(texts)


def _prompts(value: Any) -> tuple[str | tuple[int, ...], ...]:
    """A string, a list of strings, a list of token ids, or a list of lists of token ids."""
    if value is None:
        raise bad_request("Missing required parameter: 'prompt'.", "prompt")
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not value:
        raise bad_request(f"{_show(value)} is not a valid prompt: send a string, a list of strings, a list "
                          "of token ids or a list of lists of token ids - 'prompt'", "prompt")
    if all(isinstance(p, str) for p in value):
        prompts: tuple[str | tuple[int, ...], ...] = tuple(value)
    elif all(_is_int(t) for t in value):
        prompts = (tuple(value),)
    elif all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in value):
        prompts = tuple(tuple(p) for p in value)
    else:
        raise bad_request("'prompt' mixes types: send a string, a list of strings, a list of token ids or a "
                          "list of lists of token ids.", "prompt")
    if len(prompts) > MAX_PROMPTS:
        raise bad_request(f"'prompt' has {len(prompts)} prompts; send at most {MAX_PROMPTS}.", "prompt")
    return prompts


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request(f"{_show(value)} is not of type 'string' or 'array' of strings - 'stop'", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise _too_long("stop", MAX_STOP_STRINGS, len(stops))
    for i, stop in enumerate(stops):
        if len(stop) > MAX_STOP_STRING_CHARS:
            where = "stop" if isinstance(value, str) else f"stop[{i}]"
            raise bad_request(f"Invalid '{where}': string too long. Expected a string with maximum length "
                              f"{MAX_STOP_STRING_CHARS}, but got a string with length {len(stop)} instead.",
                              where, "string_above_max_length")
    return tuple(s for s in stops if s)


def _too_long(key: str, limit: int, length: int) -> OpenAIError:
    """OpenAI's answer to an array past its limit (as it answers 'tools' past 128)."""
    return bad_request(f"Invalid '{key}': array too long. Expected an array with maximum length {limit}, but "
                       f"got an array with length {length} instead.", key, "array_above_max_length")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(doc: dict[str, Any], key: str, low: int, high: int | None = None) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    if not _is_int(value):
        raise bad_request(f"{_show(value)} is not of type 'integer' - '{key}'", key, "invalid_type")
    if value < low or (high is not None and value > high):
        bound = f"at least {low}" if high is None else f"between {low} and {high}"
        raise bad_request(f"Invalid '{key}': {value}; it must be {bound}.", key, "invalid_value")
    return int(value)


def _int_list(value: Any, key: str, limit: int) -> list[int]:
    if value is None:
        return []
    if isinstance(value, list) and len(value) > limit:  # before looking at each
        raise _too_long(key, limit, len(value))
    if not isinstance(value, list) or not all(_is_int(t) and t >= 0 for t in value):
        raise bad_request(f"{_show(value)} is not a list of token ids - '{key}'", key, "invalid_type")
    return value


def _number(doc: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"{_show(value)} is not of type 'number' - '{key}'", key, "invalid_type")
    if not low <= value <= high:
        raise bad_request(f"Invalid '{key}': {value}; it must be between {low:g} and {high:g}.", key,
                          "invalid_value")
    return float(value)


def _bool(doc: dict[str, Any], key: str, default: bool, name: str = "") -> bool:
    value = doc.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        name = name or key
        raise bad_request(f"{_show(value)} is not of type 'boolean' - '{name}'", name, "invalid_type")
    return value


def _show(value: Any) -> str:
    """A value as an error message quotes it: JSON, cut short."""
    text = orjson.dumps(value).decode() if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
