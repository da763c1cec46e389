"""A model folder's chat template: how a list of chat messages becomes one prompt string.

Where it comes from, the first found (`load_chat_template`, at load):
1. `chat_template.json` beside the config: our own small format, an explicit override (below);
2. `chat_template.jinja`, the model's own Jinja template as newer transformers saves it;
3. `tokenizer_config.json`'s `chat_template` (jinja_template.py renders 2 and 3 as transformers does).
A folder with none serves no chat (`ModelChat.template` None: the API refuses chat requests saying so);
completions still work. There is no silent default.

`chat_template.json`, every key optional (the defaults are those shown):

    {
      "system":    "<|system|>\\n{content}\\n",      one message of each role: {content} is its text
      "user":      "<|user|>\\n{content}\\n",
      "assistant": "<|assistant|>\\n{content}\\n",
      "prefix":    "",                              before the first message (a BOS the model wants: chat
                                                    prompts are encoded without adding special tokens)
      "generation_prompt": "<|assistant|>\\n",        after the last one: where the model's answer starts
      "stop":      ["<|user|>", "<|system|>"]       stop strings every chat request gets, besides its own
    }                                                 (at most 4, of at most 256 characters: core/request.py)

`{content}` is replaced literally (str.replace), so braces in a message are text, never a format field.
Messages reach either kind as (role, text): the role `developer` is written as `system` (OpenAI renamed
it), and a message's content is its string, or the `text` of its parts of type "text" joined with "\\n"
(engine/openai/protocol.py).

Tools: a Jinja template gets the request's `tools`, `tool` messages, and an assistant message's
`tool_calls` (each call's `arguments` a dict, as transformers documents); chat_template.json writes none of
them and refuses such a chat. The folder's `tool_call_parser` parameter (`hermes`, `llama3_json`) says how
the model writes calls; when unset it is read from the Jinja template's text (`detect_tool_call_parser`).

`render_chat` serves a request's `add_generation_prompt` and `continue_final_message` the same way for
both kinds: the latter renders without the generation prompt and cuts the text after the final message's
content, as transformers does, so the model continues that message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ...errors import invalid
from ..core.request import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS
from .jinja_template import JinjaTemplate, TemplateRenderError, folder_template_source, special_token_texts

FILENAME = "chat_template.json"
ROLES = ("system", "user", "assistant")  # chat_template.json's; a Jinja template also gets "tool"
TOOL_CALL_PARSERS = ("hermes", "llama3_json")  # the `tool_call_parser` names (engine/openai/tools/)


class ChatTemplate(Protocol):
    @property
    def source(self) -> str:
        """Where it came from (a file name), for the load log."""
        ...

    @property
    def stop(self) -> tuple[str, ...]:
        """The stop strings every chat request gets."""
        ...

    def render(self, messages: Sequence[tuple[str, str]], add_generation_prompt: bool,
               variables: Mapping[str, Any], max_chars: int, tools: list[Any] | None = None,
               fields: Sequence[Mapping[str, Any]] = ()) -> str:
        """The prompt text. `tools`: the request's tool definitions (the template's `tools`); `fields`:
        each message's keys besides role and content (an assistant's `tool_calls`, a tool message's
        `tool_call_id`), empty or one per message."""
        ...


@dataclass(frozen=True, slots=True)
class JsonChatTemplate:
    """chat_template.json's format. It has no variables: a request's `chat_template_kwargs` change
    nothing."""

    system: str = "<|system|>\n{content}\n"
    user: str = "<|user|>\n{content}\n"
    assistant: str = "<|assistant|>\n{content}\n"
    prefix: str = ""
    generation_prompt: str = "<|assistant|>\n"
    stop: tuple[str, ...] = ("<|user|>", "<|system|>")
    source: str = FILENAME

    def render(self, messages: Sequence[tuple[str, str]], add_generation_prompt: bool = True,
               variables: Mapping[str, Any] | None = None, max_chars: int = 0, tools: list[Any] | None = None,
               fields: Sequence[Mapping[str, Any]] = ()) -> str:
        """The prompt for (role, text) messages (its length is bounded by the messages', which the
        request's size bounds). It has no way to write tools, tool calls or tool messages: a chat with any
        is refused (TemplateRenderError)."""
        if tools or any(fields) or any(role not in ROLES for role, _ in messages):
            raise TemplateRenderError(f"{FILENAME} cannot write tools, tool calls or tool messages; the "
                                      "model needs a Jinja chat template that does (chat_template.jinja)")
        parts = [self.prefix]
        for role, text in messages:
            parts.append(getattr(self, role).replace("{content}", text))
        if add_generation_prompt:
            parts.append(self.generation_prompt)
        return "".join(parts)


@dataclass(frozen=True, slots=True)
class ModelChat:
    """A model version's chat: its folder's template (None: it serves no chat) and the special tokens' text
    a request's own Jinja template is rendered with."""

    template: ChatTemplate | None
    special_tokens: Mapping[str, str] = field(default_factory=dict)
    tool_call_parser: str = ""  # how its answers are read for tool calls (TOOL_CALL_PARSERS); "": not read


@dataclass(frozen=True, slots=True)
class ChatOptions:
    """A request's say in how its chat is rendered (vLLM's fields of these names)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    variables: Mapping[str, Any] = field(default_factory=dict)  # chat_template_kwargs
    tools: list[Any] | None = None  # the request's `tools`, for the template's `tools`
    fields: Sequence[Mapping[str, Any]] = ()  # each message's tool parts (ChatTemplate.render)


def render_chat(template: ChatTemplate, messages: Sequence[tuple[str, str]], options: ChatOptions,
                max_chars: int) -> str:
    """The prompt text. TemplateRenderError when the template refuses the chat, or the final message to
    continue is not in what it wrote; jinja_template.RenderedTooLong past `max_chars`."""
    add_prompt = options.add_generation_prompt and not options.continue_final_message
    text = template.render(messages, add_prompt, options.variables, max_chars, options.tools, options.fields)
    if not options.continue_final_message:
        return text
    final = messages[-1][1]
    loc = text.rfind(final.strip())
    if loc < 0:
        raise TemplateRenderError("continue_final_message is set but the final message does not appear in "
                                  "the chat after applying the chat template")
    # as transformers: keep the message's own trailing spaces where the template kept them
    if text[loc:loc + len(final.lstrip())] == final:
        return text[:loc + len(final.lstrip())]
    return text[:loc + len(final.strip())]


def load_chat_template(folder: Path, where: str, params: Mapping[str, str] | None = None,
                       config_folder: Path | None = None) -> ModelChat:
    """The folder's chat (see the module docstring for the order). INVALID_ARG naming the problem for a
    malformed file or a template that does not parse (the version's load fails, saying why). `params`: the
    config's parameters (its `bos_token` / `eos_token` name the special tokens when tokenizer_config.json
    does not). `folder` holds the tokenizer's files (a Hugging Face export's may be in `1/`: a KServe
    single-model folder is served that way); `config_folder`, the model folder beside its config, where
    our own chat_template.json overrides them (default: `folder`)."""
    params = params or {}
    override = (config_folder or folder) / FILENAME
    if not override.is_file():
        override = folder / FILENAME
    tokens = special_token_texts(folder, params, where)
    parser = params.get("tool_call_parser", "")
    if parser and parser not in TOOL_CALL_PARSERS:
        raise invalid(f"{where}: parameter tool_call_parser '{parser}' is not one of "
                      f"{list(TOOL_CALL_PARSERS)}")
    if override.is_file():
        return ModelChat(_load_json(override, where), tokens, parser)
    found = folder_template_source(folder, where)
    if found is None:
        return ModelChat(None, tokens, parser)
    source, origin = found
    try:
        template = JinjaTemplate(source, tokens, origin)
    except TemplateRenderError as e:
        raise invalid(f"{where}: {origin}: {e}") from None
    return ModelChat(template, tokens, parser or detect_tool_call_parser(source))


def detect_tool_call_parser(source: str) -> str:
    """The tool call format a Jinja template teaches its model, read from its text when the config names
    none: Hermes / Qwen2.5 write `<tool_call>`, Llama 3.1+ `<|python_tag|>` or its JSON form's
    `"parameters"` instructions. "" when it shows neither (or renders no tools at all)."""
    if "tools" not in source:
        return ""
    if "<tool_call>" in source:
        return "hermes"
    if "<|python_tag|>" in source or '"parameters": dictionary' in source:
        return "llama3_json"
    return ""


def _load_json(path: Path, where: str) -> JsonChatTemplate:
    try:
        doc = json.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise invalid(f"{where}: {FILENAME} is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise invalid(f"{where}: {FILENAME} must be a JSON object")
    known = {*ROLES, "prefix", "generation_prompt", "stop"}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise invalid(f"{where}: {FILENAME} has unknown keys {unknown}; it may have {sorted(known)}")
    fields: dict[str, str | tuple[str, ...]] = {}
    for key, value in doc.items():
        if key == "stop":
            if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
                raise invalid(f"{where}: {FILENAME} 'stop' must be a list of non-empty strings")
            if len(value) > MAX_STOP_STRINGS or max(map(len, value), default=0) > MAX_STOP_STRING_CHARS:
                raise invalid(f"{where}: {FILENAME} 'stop' may hold at most {MAX_STOP_STRINGS} strings of at "
                              f"most {MAX_STOP_STRING_CHARS} characters (every chat request checks them "
                              "after each token)")
            fields[key] = tuple(value)
        elif not isinstance(value, str):
            raise invalid(f"{where}: {FILENAME} '{key}' must be a string")
        elif key in ROLES and "{content}" not in value:
            raise invalid(f"{where}: {FILENAME} '{key}' must contain {{content}}")
        else:
            fields[key] = value
    return JsonChatTemplate(**fields)  # type: ignore[arg-type]
