"""A model folder's chat template: how a list of chat messages becomes one prompt string.

Our own small format, not Jinja: `chat_template.json` beside the model's config.pbtxt, every key optional:

    {
      "system":    "<|system|>\\n{content}\\n",      one message of each role: {content} is its text
      "user":      "<|user|>\\n{content}\\n",
      "assistant": "<|assistant|>\\n{content}\\n",
      "prefix":    "",                              before the first message
      "generation_prompt": "<|assistant|>\\n",        after the last one: where the model's answer starts
      "stop":      ["<|user|>", "<|system|>"]       stop strings every chat request gets, besides its own
    }                                                 (at most 4, of at most 256 characters: core/request.py)

A folder without the file gets `DEFAULT` (the values above). The role `developer` is written as `system`
(OpenAI renamed it); `tool` and `function` messages are refused. `{content}` is replaced literally
(str.replace), so braces in a message are text, never a format field. A message's content is its string, or
the `text` of its parts of type "text" joined with "\\n".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...errors import invalid
from ..core.request import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS

FILENAME = "chat_template.json"
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    system: str = "<|system|>\n{content}\n"
    user: str = "<|user|>\n{content}\n"
    assistant: str = "<|assistant|>\n{content}\n"
    prefix: str = ""
    generation_prompt: str = "<|assistant|>\n"
    stop: tuple[str, ...] = ("<|user|>", "<|system|>")

    def render(self, messages: Sequence[tuple[str, str]]) -> str:
        """The prompt for (role, text) messages whose roles are already among ROLES."""
        parts = [self.prefix]
        for role, text in messages:
            parts.append(getattr(self, role).replace("{content}", text))
        parts.append(self.generation_prompt)
        return "".join(parts)


DEFAULT = ChatTemplate()


def load_chat_template(folder: Path, where: str) -> ChatTemplate:
    """The folder's template, or DEFAULT without a chat_template.json. INVALID_ARG naming the problem for a
    malformed file (the model then cannot serve chat requests, and says why)."""
    path = folder / FILENAME
    if not path.is_file():
        return DEFAULT
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
    return ChatTemplate(**fields)  # type: ignore[arg-type]
