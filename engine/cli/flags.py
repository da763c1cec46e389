"""How `hubserve serve` reads Triton's boolean flags, so Triton's command lines run unchanged, and how its
help shows each flag's default.

Triton's parser takes a boolean flag's value as `--flag=VALUE` or `--flag VALUE`, VALUE one of true/on/1 or
false/off/0 in any case (src/command_line_parser.cc, `ParseOption<bool>`), and refuses anything else with
"invalid value for bool option: VALUE". hubserve also takes the bare `--flag` (true) and, where it had
one before, `--no-flag` (false).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

TRUE_WORDS = ("true", "on", "1")
FALSE_WORDS = ("false", "off", "0")


def triton_bool(text: str) -> bool:
    """A boolean flag's value in Triton's words (case-insensitive)."""
    word = text.lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise argparse.ArgumentTypeError(f"invalid value for bool option: {text}")


class TritonBool(argparse.Action):
    """`--flag`, `--flag=true|false|on|off|1|0`, `--flag VALUE`, and `--no-flag` when `negative` is given.

    `also` names other destinations set to True whenever this flag is given, whatever its value: Triton's
    `--grpc-use-ssl-mutual` turns `--grpc-use-ssl` on in the order the flags come (a later
    `--grpc-use-ssl=false` turns it off again), and a command line that serves TLS under Triton must not
    serve plain text here."""

    def __init__(self, option_strings: Sequence[str], dest: str, negative: bool = False,
                 also: Sequence[str] = (), **kwargs: Any) -> None:
        strings = list(option_strings)
        if negative:
            strings += [f"--no-{s[2:]}" for s in option_strings if s.startswith("--")]
        self.also = tuple(also)
        kwargs.setdefault("metavar", "BOOL")
        super().__init__(strings, dest, nargs="?", const=True, type=triton_bool, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if option_string is not None and option_string.startswith("--no-"):
            if values is not True:  # `--no-flag=VALUE`: no meaning
                parser.error(f"{option_string} takes no value")
            setattr(namespace, self.dest, False)
            return
        setattr(namespace, self.dest, bool(values))
        for dest in self.also:
            setattr(namespace, dest, True)


class HelpFormatter(argparse.HelpFormatter):
    """`hubserve serve --help` (engine/cli/parser.py): each flag's default once, as "(default: X)" at the
    end of its help. None for a switch that is off unless given (store_true), one whose default is None,
    empty or an empty list (not given: nothing happens), or one whose help says its default in words already
    ("(default: off)"); booleans read as Triton writes them, true or false."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if "(default: %(default)s)" in text and isinstance(default, bool):  # BooleanOptionalAction's own
            return text.replace("%(default)s", str(default).lower())
        if ("(default:" in text or not action.option_strings or (action.nargs == 0 and default is False)
                or default is None or default is argparse.SUPPRESS or default == "" or default == []):
            return text
        return f"{text} (default: {str(default).lower() if isinstance(default, bool) else '%(default)s'})"
