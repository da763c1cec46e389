"""A model's own Jinja chat template, rendered as transformers' `apply_chat_template` renders it.

Where a folder's template comes from (chat_template.py `load_chat_template` asks `folder_template_source`
after its own `chat_template.json`): `chat_template.jinja` (the file newer transformers saves), else
`tokenizer_config.json`'s `chat_template` (a string, or a list of {name, template} of which "default" is
used). The special tokens' text the template may write (`bos_token`, `eos_token`, `unk_token`,
`pad_token`) comes from `tokenizer_config.json` (a string, or an added token's {"content": ...}), else from
the config's `bos_token` / `eos_token` parameters (the tokenizer.json tokens it names).

The environment is transformers': jinja2's `ImmutableSandboxedEnvironment` (a template can neither reach
Python's internals nor change the messages it is given) with `trim_blocks`, `lstrip_blocks` and the loop
controls extension (`break`, `continue`); the global `raise_exception(message)` and `strftime_now(format)`,
and a `tojson` filter that writes JSON as Python's `json.dumps` does (non-ASCII kept; `indent`,
`separators`, `sort_keys`), not HTML-escaped as jinja2's own. The render variables: `messages` (each
{"role", "content"}), `add_generation_prompt`, `tools` and `documents` (None unless given), the special
tokens, and a request's `chat_template_kwargs` over them.

Rendering runs on the loop (the OpenAI service, per request); what bounds it: the sandbox (no attribute of
Python's internals, `range` of at most 100,000, and here `*` and `**` bounded: MAX_VALUE_ITEMS,
MAX_POWER_BITS), and the text, which is generated piece by piece and stopped at `max_chars` (the prompt's
character bound, generate/serving/prompt.py rule 1). The sandbox is no resource bound (jinja2 says so): a
template that loops without writing, or doubles a string in a loop, or pads one with a filter, is bounded
by none of that; such a template can come only from the model's folder, or a request when the operator
trusts request templates (`--trust-request-chat-template`), which is why they are refused by default.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox

from ...errors import invalid

JINJA_FILENAME = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")
MAX_TEMPLATE_CHARS = 256 * 1024  # a template longer than this is refused (a real one is a few KiB)
MAX_VALUE_ITEMS = 1 << 20  # a string or list a template makes with `*`
MAX_POWER_BITS = 4096  # an integer a template makes with `**`


class TemplateRenderError(Exception):
    """The template refused the chat (its `raise_exception`), or failed on it (an undefined value, a
    sandbox violation): its own message, which the API returns as a 400."""


class RenderedTooLong(Exception):
    """The rendered text passed `max_chars` (the render stopped there)."""

    def __init__(self, max_chars: int) -> None:
        super().__init__(f"the rendered chat is longer than {max_chars} characters")
        self.max_chars = max_chars


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _Sandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """transformers' sandbox, with the two operators that can make one value huge bounded (`'x' * 10**9`
    would hold a gigabyte before the text's bound could see it)."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(times, int) and \
                        len(seq) * times > MAX_VALUE_ITEMS:
                    raise jinja2.sandbox.SecurityError(f"the template makes a value of {len(seq) * times} "
                                                       f"items; at most {MAX_VALUE_ITEMS} are allowed")
        elif isinstance(left, int) and isinstance(right, int) and \
                right * max(abs(left), 2).bit_length() > MAX_POWER_BITS:
            raise jinja2.sandbox.SecurityError(f"the template raises {left} to the power {right}; the result "
                                               f"may have at most {MAX_POWER_BITS} bits")
        return super().call_binop(context, operator, left, right)


def _environment() -> _Sandbox:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _environment()


@functools.lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """The compiled template (cached by its text: a request's own template is compiled once while it stays
    among the 32 last used). TemplateRenderError for one jinja2 cannot parse, or one over
    MAX_TEMPLATE_CHARS."""
    if len(source) > MAX_TEMPLATE_CHARS:
        raise TemplateRenderError(f"the chat template has {len(source)} characters; at most "
                                  f"{MAX_TEMPLATE_CHARS} are taken")
    try:
        return _ENV.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateRenderError(f"the chat template does not parse: {e.message} (line {e.lineno})") \
            from None


class JinjaTemplate:
    """A compiled Jinja chat template and the special tokens' text it is rendered with. Made at load for
    the folder's template, or per request for a request's own (`compile_template` caches the work)."""

    __slots__ = ("_template", "source", "special_tokens", "stop")

    def __init__(self, source: str, special_tokens: Mapping[str, str], origin: str = "") -> None:
        self._template = compile_template(source)
        self.special_tokens = dict(special_tokens)
        self.source = origin  # where it came from, for the load log
        self.stop: tuple[str, ...] = ()  # the model's EOS ends its turns; a Jinja template adds no stops

    def render(self, messages: Sequence[tuple[str, str]], add_generation_prompt: bool,
               variables: Mapping[str, Any], max_chars: int, tools: list[Any] | None = None,
               fields: Sequence[Mapping[str, Any]] = (), documents: list[Any] | None = None) -> str:
        """The chat as the template writes it: TemplateRenderError with the template's words when it
        refuses or fails, RenderedTooLong past `max_chars`. `fields`: each message's keys besides role
        and content (chat_template.py ChatTemplate.render)."""
        context: dict[str, Any] = {**self.special_tokens, **variables}
        extra = fields or [{}] * len(messages)
        context.update(messages=[{"role": role, "content": text, **more}
                                 for (role, text), more in zip(messages, extra, strict=True)],
                       add_generation_prompt=add_generation_prompt, tools=tools, documents=documents)
        pieces: list[str] = []
        length = 0
        try:
            for piece in self._template.generate(context):
                pieces.append(piece)
                length += len(piece)
                if length > max_chars:
                    raise RenderedTooLong(max_chars)
        except jinja2.TemplateError as e:  # raise_exception, UndefinedError, SecurityError
            raise TemplateRenderError(str(e.message or e)) from None
        # a filter or an operator on data it does not take, or a macro calling itself without end
        except (TypeError, ValueError, ArithmeticError, LookupError, RecursionError) as e:
            raise TemplateRenderError(f"{type(e).__name__}: {e}") from None
        return "".join(pieces)


def folder_template_source(folder: Path, where: str) -> tuple[str, str] | None:
    """(the folder's Jinja template, the file it came from), or None when it has none: chat_template.jinja,
    else tokenizer_config.json's `chat_template`. INVALID_ARG for a file that cannot be read."""
    path = folder / JINJA_FILENAME
    if path.is_file():
        try:
            return path.read_text("utf-8"), JINJA_FILENAME
        except (OSError, UnicodeDecodeError) as e:
            raise invalid(f"{where}: {JINJA_FILENAME} cannot be read: {e}") from None
    value = tokenizer_config(folder, where).get("chat_template")
    if value is None:
        return None
    if isinstance(value, list):  # named templates (transformers): "default" is the chat template
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
        if value is None:
            raise invalid(f"{where}: {TOKENIZER_CONFIG}'s chat_template names {sorted(map(str, named))} but "
                          "none 'default'; add chat_template.jinja")
    if not isinstance(value, str):
        raise invalid(f"{where}: {TOKENIZER_CONFIG}'s chat_template must be a string or a list of "
                      "{name, template}")
    return value, f"{TOKENIZER_CONFIG} chat_template"


def special_token_texts(folder: Path, params: Mapping[str, str], where: str) -> dict[str, str]:
    """The special tokens' text a template may write: tokenizer_config.json's, else the config's
    `bos_token` / `eos_token` parameters. A token the folder does not name is left out (undefined in the
    template, which writes it as nothing)."""
    doc = tokenizer_config(folder, where)
    out = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = doc.get(name)
        if isinstance(value, dict):  # an added token written out: {"content": "<s>", "lstrip": ..., ...}
            value = value.get("content")
        if not isinstance(value, str):
            value = params.get(name)
        if isinstance(value, str):
            out[name] = value
    return out


def tokenizer_config(folder: Path, where: str) -> dict[str, Any]:
    """tokenizer_config.json as a dict ({} without the file)."""
    path = folder / TOKENIZER_CONFIG
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise invalid(f"{where}: {TOKENIZER_CONFIG} is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise invalid(f"{where}: {TOKENIZER_CONFIG} must be a JSON object")
    return doc
