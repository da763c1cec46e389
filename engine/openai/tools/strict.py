"""A function's `strict: true` under tool_choice "auto": the answer is free, but a call the model writes in
its own format must be a call of a declared function whose arguments its schema admits (as vLLM does with
a structural tag when at least one tool is strict, and OpenAI does per function).

Called by service.py once per request with tool_choice auto, with the model folder's parser name. Without
any strict tool there is no grammar (nothing changes, nothing is paid). With one, the answer is
constrained by a Lark grammar (generate/core/grammar.py, llguidance) in the parser's own form, so what the
parser reads from the same text (streamed or whole) is what the grammar let through:
- hermes: any text, and each time it writes `<tool_call>` (a lazy lexeme: the text ends at the tag's first
  occurrence), a JSON call `{"name": N, "arguments": A}` then `</tool_call>`, then any text again;
- llama3_json: an answer starting (after white space) with `{` is calls, `{"name": N, "parameters": A}`,
  separated by `;` or white space, then any text not starting with `{`; any other answer is text (one
  starting with `<|python_tag|>` is refused: the parser would read calls after it).
N is one of the tools' names; A is valid under that function's `parameters` when it is strict, any JSON
object when not. The model may end (EOS) wherever the text may, and max_tokens cuts it as any answer.
White space inside a call is bounded (at most WHITE_RUN characters a gap), so a model cannot wander in it.
llguidance keeps a tokenizer's added tokens apart from text: the Hermes grammar names the tags when they are
tokens, and lets the other added tokens that are not special (Qwen3's `<think>`) come between pieces of text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ...generate.core.grammar import MAX_GRAMMAR_CHARS, GrammarKind, GrammarSpec, constraint_for_json_schema
from ...generate.core.tokenizer import JsonTokenizer, Tokenizer
from ..errors import bad_request
from .forced import parameters_schema
from .hermes import END, START
from .request import ToolChoice, ToolRequest

WHITE_RUN = 16  # white space characters at most between a call's JSON tokens, and around it
_CALL_KEY = {"hermes": "arguments", "llama3_json": "parameters"}  # the key each format's models write


@dataclass(frozen=True, slots=True)
class StrictCalls:
    """What a request with a strict tool under auto must match (`grammar`), and each strict function's
    schema alone (`schemas`: compiled first, so a schema that does not compile is a 400 naming its tool)."""

    grammar: GrammarSpec
    schemas: tuple[GrammarSpec, ...]


def any_strict(tools: ToolRequest) -> bool:
    return tools.choice == ToolChoice.AUTO and not tools.named and \
        any(t["function"].get("strict") is True for t in tools.tools)


def strict_calls(tools: ToolRequest, parser: str, tokenizer: Tokenizer | None = None) -> StrictCalls | None:
    """The constraint auto puts on the answer for `parser`'s format, for the model's `tokenizer` (None: a
    tokenizer whose tags are text); None when no tool is strict (or the choice is not auto). A 400 naming
    `tools` when the grammar is past its bound."""
    if not any_strict(tools) or parser not in _CALL_KEY:
        return None
    key = _CALL_KEY[parser]
    schemas, one_of = [], []
    for i, tool in enumerate(tools.tools):
        function = tool["function"]
        arguments: dict[str, Any] = {"type": "object"}
        if function.get("strict") is True:
            arguments = parameters_schema(function)
            schemas.append(constraint_for_json_schema(arguments, f"tools[{i}].function.parameters"))
        one_of.append({"type": "object", "properties": {"name": {"const": function["name"]}, key: arguments},
                       "required": ["name", key], "additionalProperties": False})
    white = f"[ \\t\\r\\n]{{0,{WHITE_RUN}}}"
    call = json.dumps({"anyOf": one_of, "x-guidance": {"whitespace_pattern": white}}, separators=(",", ":"))
    text = _hermes(call, tokenizer) if parser == "hermes" else _llama3_json(call)
    if len(text) > MAX_GRAMMAR_CHARS:
        raise bad_request(f"Invalid 'tools': the grammar that enforces the strict tools has {len(text)} "
                          f"characters; at most {MAX_GRAMMAR_CHARS} are taken (send fewer or smaller tools).",
                          "tools", "invalid_value")
    return StrictCalls(GrammarSpec(GrammarKind.GRAMMAR, text, "tools"), tuple(schemas))


def _hermes(call: str, tokenizer: Tokenizer | None) -> str:
    """Where the tokenizer has `<tool_call>` as one token (Qwen2.5's added tokens), the grammar names that
    token (llguidance keeps added tokens apart from text: the tag as a string would refuse it), the text may
    not spell the tag out, and the tokenizer's other added tokens that are not special (Qwen3's `<think>`)
    may come between pieces of text; else the tag is text, and the text ends at its first occurrence."""
    start, end = (_one_token(tokenizer, tag) for tag in (START, END))
    close = f"<[{end}]>" if end is not None else f'"{END}"'
    white = f"WHITE: /[ \\t\\r\\n]{{1,{WHITE_RUN}}}/"
    if start is None:  # a lazy lexeme: the text before the tag ends at its first occurrence
        return f"""%llguidance {{}}
start: call* TEXT
call: call_start WHITE? %json {call} WHITE? {close}
call_start[lazy]: TEXT "{START}"
TEXT: /(.|\\n)*/
{white}
"""
    added = tokenizer.added_text_token_ids() if isinstance(tokenizer, JsonTokenizer) else ()
    others = ",".join(str(i) for i in added if i not in (start, end))
    return f"""%llguidance {{}}
start: text (call text)*
text: TEXT?{f" (<[{others}]> TEXT?)*" if others else ""}
call: <[{start}]> WHITE? %json {call} WHITE? {close}
TEXT: /(.|\\n)+/ & ~/(.|\\n)*{START}(.|\\n)*/
{white}
"""


def _one_token(tokenizer: Tokenizer | None, tag: str) -> int | None:
    """The id of the one token `tag` is encoded as, if it is one."""
    if tokenizer is None:
        return None
    ids = tokenizer.encode(tag, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


def _llama3_json(call: str) -> str:
    return f"""%llguidance {{}}
start: PROSE | WHITE? call (SEP? call)* SEP? TAIL?
call: %json {call}
PROSE: /(.|\\n)*/ & ~/[ \\t\\r\\n]*(\\{{|<\\|python_tag\\|>)(.|\\n)*/
WHITE: /[ \\t\\r\\n]{{1,{WHITE_RUN}}}/
SEP: /[; \\t\\r\\n]{{1,{WHITE_RUN}}}/
TAIL: /[^{{; \\t\\r\\n](.|\\n)*/
"""


def check_combination(tools: ToolRequest, parser: str, structured: GrammarSpec | None) -> None:
    """A strict tool under auto beside response_format / structured_outputs: both cannot be enforced at
    once, so it is a 400 naming the other field, except where no call can be read from its answers: a JSON
    value (any JSON schema) never holds a Hermes call, as `<tool_call>` can only be inside one of its
    strings, whose quotes the call's keys would need (so the Agents SDK's output_type with strict tools is
    served on Hermes models)."""
    if structured is None or not any_strict(tools):
        return
    if parser == "hermes" and structured.kind is GrammarKind.JSON_SCHEMA:
        return
    field = structured.param.split(".")[0] or "response_format"
    raise bad_request(f"'{field}' constrains the whole answer, and a tool with 'strict': true under "
                      f"tool_choice auto constrains its {parser} tool calls: both cannot be enforced at "
                      "once; send one of them (or 'strict': false).", field, "invalid_value")
