"""Tool calls on the chat API: the request's tool fields (request.py) and the parsers that read calls from
a model's answer (calls.py; one module per format: hermes.py, llama3_json.py), chosen by the model folder's
`tool_call_parser` (generate/serving/chat_template.py) for tool_choice auto; for required or a named
function, the grammar that constrains the answer to a call and the readers of that form (forced.py); for
auto with a `strict` tool, the grammar that holds the model's own calls to the tools' schemas (strict.py)."""

from __future__ import annotations

from collections.abc import Callable

from .calls import ToolCallParser
from .hermes import HermesParser
from .llama3_json import Llama3JsonParser

PARSERS: dict[str, Callable[[], ToolCallParser]] = {"hermes": HermesParser, "llama3_json": Llama3JsonParser}
