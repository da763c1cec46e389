"""The server's logging: where lines go (`--log-file`, else standard error), how they read (`--log-format`
text or json), which levels pass (Triton's `--log-info/--log-warning/--log-error` and `--log-verbose N`),
the access line written once per inference at verbose level 1 and up, and request ids.

`SETTINGS` is the one live copy of the settings: `configure()` applies the command line at start, and
Triton's logging extension (`GET/POST /v2/logging`, gRPC `LogSettings`; the data plane's `log_settings`)
changes it while serving. The hot path reads one attribute, `SETTINGS.access`, to know whether it owes an
access line; nothing is formatted or generated for a request when it is False.

With `--workers N` the engine process writes the access lines (its batchers see queue and compute times);
each frontend logs its own lines with the settings it was started with.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

import orjson

from ..errors import EngineError, ErrorCode, invalid

ACCESS_LOGGER = "hubserve.access"
# The access line's fields, in order: also the exact keys of a JSON access line.
ACCESS_FIELDS = ("model", "version", "request_id", "status", "queue_us", "compute_us", "total_us",
                 "batch_size")
# --log-format: ours (text, json) and Triton's (default reads as text; ISO8601 is text with ISO timestamps).
LOG_FORMATS = ("text", "json", "default", "ISO8601")


@dataclass(slots=True)
class LogSettings:
    """What the logging extension reads and writes, in Triton's setting names."""

    log_file: str = ""  # "" = standard error
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "text"
    access: bool = False  # derived: an access line per inference (verbose >= 1 and INFO on)

    def as_json(self) -> dict[str, Any]:
        return {"log_file": self.log_file, "log_info": self.log_info, "log_warning": self.log_warning,
                "log_error": self.log_error, "log_verbose_level": self.log_verbose_level,
                "log_format": self.log_format}


SETTINGS = LogSettings()
_handler: logging.Handler | None = None


class _LevelGate(logging.Filter):
    """Drops records of the levels switched off (read live from SETTINGS)."""

    def filter(self, record: logging.LogRecord) -> bool:
        level = record.levelno
        if level >= logging.ERROR:
            return SETTINGS.log_error
        if level >= logging.WARNING:
            return SETTINGS.log_warning
        if level >= logging.INFO:
            return SETTINGS.log_info
        return SETTINGS.log_verbose_level > 0


class _TextFormatter(logging.Formatter):
    def __init__(self, iso: bool) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s",
                         datefmt="%Y-%m-%dT%H:%M:%S" if iso else None)


class _JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger and message (and `request_id` when the record names one).
    Access lines do not come through here (`_AccessWriter`): they are exactly their ACCESS_FIELDS."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                               + f".{int(record.msecs):03d}Z",
                               "level": record.levelname, "logger": record.name,
                               "message": record.getMessage()}
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            doc["request_id"] = request_id
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(doc).decode()


def _formatter(log_format: str) -> logging.Formatter:
    if log_format == "json":
        return _JsonFormatter()
    return _TextFormatter(iso=log_format == "ISO8601")


def configure(log_file: str = "", log_format: str = "text", log_verbose: int = 0, log_info: bool = True,
              log_warning: bool = True, log_error: bool = True) -> None:
    """Set up the root logger from the command line (called once per process, before anything logs). A log
    file is opened for appending, so several processes (--workers) can share it line by line."""
    global _handler
    if log_format not in LOG_FORMATS:
        raise invalid(f"invalid argument for --log-format, got: {log_format}")
    handler: logging.Handler
    if log_file:
        handler = logging.FileHandler(log_file, encoding="utf-8")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_LevelGate())
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
        _handler.close()
    for old in list(root.handlers):  # basicConfig's, if anything set one up before
        root.removeHandler(old)
    root.addHandler(handler)
    _handler = handler
    SETTINGS.log_file = log_file
    SETTINGS.log_info, SETTINGS.log_warning, SETTINGS.log_error = log_info, log_warning, log_error
    SETTINGS.log_format = log_format
    SETTINGS.log_verbose_level = log_verbose
    _apply()


# Libraries whose DEBUG lines carry what clients send verbatim: hpack logs every header block it decodes,
# `authorization: Bearer <key>` and Triton's restriction headers with it. Kept at INFO whatever the verbose
# level, so no secret a client sends reaches the log.
_QUIET_LOGGERS = ("hpack",)


def _apply() -> None:
    """Make the derived state follow SETTINGS: the root level, the formatter, the access flag."""
    logging.getLogger().setLevel(logging.DEBUG if SETTINGS.log_verbose_level > 0 else logging.INFO)
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)
    if _handler is not None:
        _handler.setFormatter(_formatter(SETTINGS.log_format))
    SETTINGS.access = SETTINGS.log_verbose_level >= 1 and SETTINGS.log_info


def update(changes: dict[str, Any], http: bool) -> dict[str, Any]:
    """The logging extension's update, with values already of Python types (the frontend checked each
    protocol's own types); None leaves a setting as it is. Triton's rules and words (server
    src/http_server.cc HandleLogging, src/grpc/grpc_server.cc LogSettings): the log file cannot change over
    the network (UNSUPPORTED), and a log format other than its two (and our text and json) is refused;
    HTTP says UNAVAILABLE there, gRPC INVALID_ARG. Nothing changes unless every setting is valid."""
    if changes.get("log_file") is not None:
        raise EngineError(ErrorCode.UNSUPPORTED,
                          "log file location can not be updated through network protocol")
    log_format = changes.get("log_format")
    if log_format is not None and log_format not in LOG_FORMATS:
        if http:
            raise EngineError(ErrorCode.UNAVAILABLE, f"invalid argument for --log_format, got: {log_format}")
        raise invalid(f"invalid argument for log_format, got: {log_format}")
    verbose = changes.get("log_verbose_level")
    if verbose is not None and verbose < 0:
        raise invalid("'log_verbose_level' must be a number >= 0")
    for name in ("log_info", "log_warning", "log_error", "log_verbose_level", "log_format"):
        value = changes.get(name)
        if value is not None:
            setattr(SETTINGS, name, value)
    _apply()
    return SETTINGS.as_json()


# ---------------------------------------------------------------------------------------------- request ids

_ID_PREFIX = os.urandom(4).hex()
_ID_COUNTER = itertools.count(1)


def new_request_id() -> str:
    """A request id for a request that came without one: this process's random prefix and a counter, unique
    across restarts and processes at the cost of a format (a uuid4 costs several times more). Generated only
    where a line or span will carry it."""
    return f"{_ID_PREFIX}-{next(_ID_COUNTER):x}"


class _AccessWriter:
    """Access lines leave once per loop round, as one write to the log's stream: formatting and queueing a
    line costs a few µs, where a record through `logging` (record, filter, lock, format, flush per line)
    costs 25-50. The lines read as the handler's other lines: text with the same time and level prefix, or
    JSON objects of exactly ACCESS_FIELDS."""

    def __init__(self) -> None:
        self._pending: list[str] = []
        self._second = -1
        self._stamp = ""

    def write(self, values: tuple[Any, ...]) -> None:
        if SETTINGS.log_format == "json":
            line = orjson.dumps(dict(zip(ACCESS_FIELDS, values, strict=True))).decode()
        else:
            line = (f"{self._time()} INFO {ACCESS_LOGGER}: model={_field(values[0])} "
                    f"version={_field(values[1])} request_id={_field(values[2])} status={values[3]} queue_us="
                    f"{values[4]} compute_us={values[5]} total_us={values[6]} batch_size={values[7]}")
        pending = self._pending
        pending.append(line)
        if len(pending) == 1:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop (a tool calling in): write at once
                self.flush()

    def _time(self) -> str:
        """logging's asctime (`2026-12-01 15:08:40,302`, or ISO8601's `T`), the second's part cached."""
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            pattern = "%Y-%m-%dT%H:%M:%S" if SETTINGS.log_format == "ISO8601" else "%Y-%m-%d %H:%M:%S"
            self._stamp = time.strftime(pattern, time.localtime(second))
        return f"{self._stamp},{int((now - second) * 1000):03d}"

    def flush(self) -> None:
        lines, self._pending = self._pending, []
        handler = _handler
        if not lines or not isinstance(handler, logging.StreamHandler):
            return
        handler.acquire()
        try:
            handler.stream.write("\n".join(lines) + "\n")
            handler.stream.flush()
        except (OSError, ValueError):  # a full disk or a closed stream: access lines are not worth a crash
            pass
        finally:
            handler.release()


_writer = _AccessWriter()

# A text access line is `key=value` pairs split at spaces: a value a client chose (a model name, an id) that
# holds a space, a quote or anything outside printable ASCII could fake a field or a line, so such a value is
# written as a JSON string ("a b", "\u2028"). The frontends already refuse ids with control characters;
# this is the writer's own guarantee, whatever reaches it.
_PLAIN = re.compile(r"[!#-~]*")


def _field(value: str) -> str:
    return value if _PLAIN.fullmatch(value) else json.dumps(value)  # ASCII-only: U+2028 escaped too


def access_line(model: str, version: str, request_id: str, status: str, queue_ns: int, compute_ns: int,
                total_ns: int, batch_size: int) -> None:
    """One inference's access line (called by the batcher's done-callback while SETTINGS.access)."""
    _writer.write((model, version, request_id, status, queue_ns // 1000, compute_ns // 1000, total_ns // 1000,
                   batch_size))
