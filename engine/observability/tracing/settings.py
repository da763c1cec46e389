"""Triton's trace settings (server docs/protocol/extension_trace.md; src/http_server.cc HandleTrace,
src/grpc/grpc_server.cc TraceSetting, src/tracer.cc): the server-wide setting and per-model overrides, their
validation in Triton's words, and which requests are sampled.

`trace_rate` N samples one request in N; `trace_count` is how many more traces may be taken (-1: no limit),
counted down as they are; `trace_level` OFF, or TIMESTAMPS and/or TENSORS (hubserve records timestamps for
both: no tensors are exported); `log_frequency` is kept and echoed, as Triton's "triton" mode reads it (with
OpenTelemetry it means nothing, and Triton does not echo it there). A model's setting overrides the fields it
names; a field set to null (HTTP) or to no value (gRPC) falls back to the server-wide one.

`--trace-config` is parsed here too, in Triton's form: `<setting>=<value>` for the global settings (`level`,
`rate`, `count`, `mode`), `opentelemetry,<setting>=<value>` for the exporter (`url`, `resource`,
`bsp_max_queue_size`, `bsp_schedule_delay`, `bsp_max_export_batch_size`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ...errors import EngineError, ErrorCode, invalid

LEVELS = ("TIMESTAMPS", "TENSORS")
UINT32_MAX = 2**32 - 1
INT32_MAX = 2**31 - 1
MIN_TRACE_COUNT = -1
_INTEGER = re.compile(r"\s*([+-]?\d+)")


@dataclass(slots=True)
class TraceValues:
    """One setting's values; in a model's override, None is "as the server-wide setting"."""

    level: frozenset[str] | None = None  # empty = OFF
    rate: int | None = None
    count: int | None = None  # traces left; -1 = unlimited
    log_frequency: int | None = None


@dataclass(slots=True)
class ExporterConfig:
    """`--trace-config opentelemetry,...`: where and how spans are sent (OTLP/HTTP, JSON)."""

    url: str = "http://localhost:4318/v1/traces"
    resource: dict[str, str] = field(default_factory=lambda: {"service.name": "hubserve"})
    max_queue_size: int = 2048  # spans held while the collector is slow or down; beyond, dropped
    schedule_delay_ms: int = 5000  # the longest a span waits for its batch
    max_export_batch_size: int = 512

    def as_settings(self) -> dict[str, str]:
        return {"url": self.url, "bsp_max_queue_size": str(self.max_queue_size),
                "bsp_schedule_delay": str(self.schedule_delay_ms),
                "bsp_max_export_batch_size": str(self.max_export_batch_size)}


def _stoi(name: str, text: str) -> int:
    """std::stoi as Triton applies it: leading spaces, a sign and digits, the rest ignored."""
    m = _INTEGER.match(text)
    if m is None:
        raise invalid(f"Unable to parse '{name}', got: {text}")
    return int(m.group(1))


def parse_rate_like(name: str, text: str) -> int:
    """trace_rate and log_frequency: unsigned 32-bit."""
    value = _stoi(name, text)
    if not 0 <= value <= UINT32_MAX:
        raise invalid(f"Unable to parse '{name}', value is out of range [ 0, {UINT32_MAX} ], got: {text}")
    return value


def parse_count(text: str) -> int:
    value = _stoi("trace_count", text)
    if value > INT32_MAX:
        raise invalid(f"Unable to parse 'trace_count', value is out of range [ {MIN_TRACE_COUNT}, "
                      f"{INT32_MAX} ], got: {text}")
    if value < MIN_TRACE_COUNT:
        raise invalid(f"Unable to parse 'trace_count'. Expecting value >= {MIN_TRACE_COUNT}, got:{text}")
    return value


def parse_levels(levels: list[str]) -> frozenset[str] | None:
    """A trace_level list: OFF alone, or TIMESTAMPS / TENSORS (other words are ignored, as Triton ignores
    them; a list of only those changes nothing: None)."""
    chosen: set[str] = set()
    changed = False
    for word in levels:
        if word == "OFF":
            if len(levels) != 1:
                raise invalid("Expect only one trace level 'OFF' is specified")
            return frozenset()
        if word in LEVELS:
            chosen.add(word)
            changed = True
    return frozenset(chosen) if changed else None


class _Sampler:
    """A setting's sample counter: every `rate`-th request it is asked about is traced."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen = 0


class TraceSettings:
    """The live settings, owned by the engine process (with --workers N the trace endpoints are forwarded to
    it). `sample(model)` is the hot path's one question, asked only while some setting traces."""

    def __init__(self, initial: TraceValues, mode: str = "opentelemetry",
                 exporter: ExporterConfig | None = None) -> None:
        self.global_values = TraceValues(initial.level if initial.level is not None else frozenset(),
                                         initial.rate if initial.rate is not None else 1000,
                                         initial.count if initial.count is not None else -1,
                                         initial.log_frequency if initial.log_frequency is not None else 0)
        self.mode = mode
        self.exporter = exporter or ExporterConfig()
        self.models: dict[str, TraceValues] = {}
        self._samplers: dict[str, _Sampler] = {"": _Sampler()}
        self.active = False  # some setting traces: the hot path's one check
        self._refresh()

    def _refresh(self) -> None:
        self.active = any(self.effective(m).level for m in ["", *self.models])

    def effective(self, model: str) -> TraceValues:
        g = self.global_values
        o = self.models.get(model) if model else None
        if o is None:
            return g
        return TraceValues(o.level if o.level is not None else g.level,
                           o.rate if o.rate is not None else g.rate,
                           o.count if o.count is not None else g.count,
                           o.log_frequency if o.log_frequency is not None else g.log_frequency)

    def sample(self, model: str) -> bool:
        """Whether this request of `model` is traced; counts it, and counts a trace taken down."""
        override = self.models.get(model)
        values = self.global_values if override is None else self.effective(model)
        if not values.level or values.count == 0 or not values.rate:
            return False
        sampler = self._samplers.get(model if override is not None else "")
        if sampler is None:
            sampler = self._samplers[model] = _Sampler()
        sampler.seen += 1
        if sampler.seen % values.rate:
            return False
        if values.count is not None and values.count > 0:
            owner = override if override is not None and override.count is not None else self.global_values
            owner.count = (owner.count or 0) - 1
        return True

    def update(self, model: str, changes: dict[str, Any]) -> None:
        """Apply parsed changes: name → value, or None to clear (a model's field falls back to the global;
        the global's returns to its default). Keys: trace_level (frozenset), trace_rate, trace_count,
        log_frequency (int)."""
        target = self.models.setdefault(model, TraceValues()) if model else self.global_values
        defaults = TraceValues(frozenset(), 1000, -1, 0)
        for key, attr in (("trace_level", "level"), ("trace_rate", "rate"), ("trace_count", "count"),
                          ("log_frequency", "log_frequency")):
            if key in changes:
                value = changes[key]
                if value is None and not model:
                    value = getattr(defaults, attr)
                setattr(target, attr, value)
        if model and target == TraceValues():
            del self.models[model]
        if model:
            self._samplers.pop(model, None)
        self._refresh()

    def as_json(self, model: str) -> dict[str, Any]:
        """Triton's answer: every value as a string, trace_level as a list."""
        v = self.effective(model)
        level = sorted(v.level or (), key=LEVELS.index) or ["OFF"]
        answer: dict[str, Any] = {"trace_level": level, "trace_rate": str(v.rate),
                                  "trace_count": str(v.count)}
        if self.mode == "triton":
            answer["log_frequency"] = str(v.log_frequency)
            answer["trace_file"] = ""
        answer["trace_mode"] = self.mode
        answer.update(self.exporter.as_settings())
        return answer


def collector_url(value: str) -> str:
    """Triton's `url` names the traces endpoint itself (`localhost:4318/v1/traces`); one given without a path
    gets OTLP/HTTP's `/v1/traces`, and one without a scheme `http://`."""
    url = value if "://" in value else f"http://{value}"
    scheme, _, rest = url.partition("://")
    if "/" not in rest or rest.endswith("/") and rest.count("/") == 1:
        url = f"{scheme}://{rest.rstrip('/')}/v1/traces"
    return url


def unsupported_file() -> EngineError:
    return EngineError(ErrorCode.UNSUPPORTED,
                       "trace file location can not be updated through network protocol")


def parse_trace_config(items: list[str]) -> tuple[TraceValues, str, ExporterConfig]:
    """`--trace-config` values, in Triton's forms and words (server src/command_line_parser.cc)."""
    values = TraceValues()
    mode = "opentelemetry"
    exporter = ExporterConfig()
    for arg in items:
        head, comma, tail = arg.partition(",")
        scope = ""
        if comma and "=" not in head:
            scope, arg_setting = head, tail
        else:
            arg_setting = arg
        if comma and not head:
            raise invalid(f"No trace mode specified. --trace-config option format is <trace mode>,"
                          f"<setting>=<value> or <setting>=<value>. Got {arg}")
        setting, eq, value = arg_setting.partition("=")
        if not eq or not setting or not value:
            raise invalid(f"--trace-config option format is '<trace mode>,<setting>=<value>'. Got {arg}")
        if scope == "":
            if setting == "level":
                level = parse_levels([value])
                values.level = level if level is not None else frozenset()
            elif setting == "rate":
                values.rate = parse_rate_like("trace_rate", value)
            elif setting == "count":
                values.count = parse_count(value)
            elif setting == "mode":
                if value not in ("triton", "opentelemetry"):
                    raise invalid(f"invalid value for trace mode option: {value}. Available options are "
                                  "\"triton\" and \"opentelemetry\"")
                if value == "triton":
                    raise invalid("--trace-config mode=triton (trace files) is not served by hubserve; use "
                                  "mode=opentelemetry with opentelemetry,url=<collector>")
                mode = value
            else:
                raise invalid(f"Bad option: \"--trace-config {setting}\".")
        elif scope == "opentelemetry":
            if setting == "url":
                exporter.url = collector_url(value)
            elif setting == "resource":
                key, _, rvalue = value.partition("=")
                exporter.resource[key] = rvalue
            elif setting in ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size"):
                number = parse_rate_like(setting, value)
                if setting == "bsp_max_queue_size":
                    exporter.max_queue_size = number
                elif setting == "bsp_schedule_delay":
                    exporter.schedule_delay_ms = number
                else:
                    exporter.max_export_batch_size = max(number, 1)
            else:
                raise invalid(f"Bad option: \"--trace-config opentelemetry,{setting}\".")
        elif scope == "triton":
            raise invalid("--trace-config triton,... (trace files) is not served by hubserve; use "
                          "opentelemetry,url=<collector>")
        else:
            raise invalid(f"invalid value for trace mode option: {scope}. Available options are \"triton\" "
                          "and \"opentelemetry\"")
    return values, mode, exporter


_NUMBERS = {"trace_rate": lambda t: parse_rate_like("trace_rate", t), "trace_count": parse_count,
            "log_frequency": lambda t: parse_rate_like("log_frequency", t)}


def changes_from_json(doc: dict[str, Any]) -> dict[str, Any]:
    """An HTTP trace setting body, checked as Triton checks it: values are strings (trace_level a list of
    them), null clears, trace_file cannot be set. Checked for its JSON types here, then read as gRPC's
    lists are (a value is a list of one; null, no value; an empty trace_level list changes nothing)."""
    lists: dict[str, list[str]] = {}
    for name, value in doc.items():
        if name == "trace_level":
            if value is not None and (not isinstance(value, list) or
                                      not all(isinstance(w, str) for w in value)):
                raise invalid("'trace_level' must be an array of strings: OFF, TIMESTAMPS, TENSORS")
            if value != []:
                lists[name] = value or []
        elif name in _NUMBERS:
            if value is not None and not isinstance(value, str):
                raise invalid(f"'{name}' must be a string holding a number, got {value!r}")
            lists[name] = [] if value is None else [value]
        elif name == "trace_file":
            lists[name] = []
    return changes_from_lists(lists)


def changes_from_lists(settings: dict[str, list[str]]) -> dict[str, Any]:
    """A gRPC TraceSetting request's settings (name → values), as Triton checks them: no value clears, more
    than one (but for trace_level) is refused."""
    if "trace_file" in settings:
        raise unsupported_file()
    changes: dict[str, Any] = {}
    if "trace_level" in settings:
        levels = settings["trace_level"]
        if not levels:
            changes["trace_level"] = None
        else:
            level = parse_levels(levels)
            if level is not None:
                changes["trace_level"] = level
    for name, parse in _NUMBERS.items():
        if name in settings:
            values = settings[name]
            if len(values) > 1:
                raise invalid(f"expect only 1 value for '{name}'")
            changes[name] = parse(values[0]) if values else None
    return changes
