"""What a model name may be: one folder name of the model repository.

Why a rule of our own: the name arrives from clients (an HTTP path segment, where `%2F` decodes to `/`, or any
gRPC string) and becomes a path under the repository root. A `/`, a `..` or an absolute name would reach
folders outside the repository; a NUL byte or a name longer than a file name can be (NAME_MAX, 255 bytes)
makes the operating system fail with errors that carry our paths. The data plane checks every name a client
sends (dataplane.py); the repository and the watcher skip folders whose names break the rule.

The messages name the rule broken but never echo the name: a name holding `/` may be one of our paths.
"""

from __future__ import annotations

import unicodedata

from .errors import invalid

NAME_MAX_BYTES = 255  # the usual NAME_MAX of Linux and macOS file systems


def name_problem(name: str) -> str | None:
    """Which rule `name` breaks, in words, or None for a usable model name."""
    if not name:
        return "a model name must not be empty"
    if name in (".", ".."):
        return f"'{name}' is not a model name; a model name is the name of a folder in the model repository"
    if "/" in name or "\\" in name:
        return ("a model name is one folder name of the model repository and must not contain "
                + ("'/'" if "/" in name else "'\\'"))
    for char in name:
        if unicodedata.category(char) == "Cc":
            return f"a model name must not contain control characters (found U+{ord(char):04X})"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return "a model name must be valid UTF-8"
    if size > NAME_MAX_BYTES:
        return f"a model name is at most {NAME_MAX_BYTES} bytes of UTF-8, this one has {size}"
    return None


def check_model_name(name: str) -> None:
    """Raise INVALID_ARG saying which rule `name` breaks; return for a usable model name."""
    problem = name_problem(name)
    if problem is not None:
        raise invalid(f"invalid model name: {problem}")


__all__ = ["NAME_MAX_BYTES", "check_model_name", "name_problem"]
