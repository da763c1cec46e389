"""Triton's API groups and its restriction flags, `--http-restricted-api` and `--grpc-restricted-protocol`
(`<group>[,<group>...]:<header>=<value>`, repeatable), parsed as Triton parses them (server
src/command_line_parser.cc, src/restricted_features.h): the groups before the first ':', the header up to
the first '=' after it, the value after that (which may itself hold '=' or ':'); each group in at most one
flag. Errors carry Triton's words. Which endpoint or RPC is in which group is frontend/grpc/api_groups.py's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

GRPC_RESTRICTED_PREFIX = "triton-grpc-protocol-"  # Triton's gRPC metadata keys: src/grpc/grpc_server.h


class ApiGroup(enum.Enum):
    """Triton's restricted API categories, by their command-line names."""

    HEALTH = "health"
    METADATA = "metadata"
    INFERENCE = "inference"
    SHARED_MEMORY = "shared-memory"
    MODEL_CONFIG = "model-config"
    MODEL_REPOSITORY = "model-repository"
    STATISTICS = "statistics"
    TRACE = "trace"
    LOGGING = "logging"


@dataclass(frozen=True, slots=True)
class Restriction:
    """A group restricted to requests carrying `header` with exactly `value`. `header` is spelled as the
    flag gave it (plus, over gRPC, the `triton-grpc-protocol-` prefix), as Triton names it in its answer;
    it is matched case-insensitively (HTTP header and HTTP/2 field names are)."""

    header: str
    value: str
    field: bytes = b""  # the header's name as both frontends store request headers: lower-case bytes

    def __post_init__(self) -> None:
        object.__setattr__(self, "field", self.header.lower().encode("latin-1"))


class RestrictionError(ValueError):
    """A restriction flag Triton would refuse; the message is Triton's."""


def parse_restrictions(args: list[str], option: str, prefix: str = "") -> dict[ApiGroup, Restriction]:
    """Every `option` flag given (`option` without dashes: "http-restricted-api" or
    "grpc-restricted-protocol"), merged: group → restriction. `prefix` goes before each header name
    (`GRPC_RESTRICTED_PREFIX` for gRPC)."""
    feature = "api" if option.startswith("http") else "protocol"
    out: dict[ApiGroup, Restriction] = {}
    for arg in args:
        groups, header, value = _split(arg, option)
        for name in groups.split(","):
            try:
                group = ApiGroup(name)
            except ValueError:
                raise RestrictionError(f"unknown restricted {feature} '{name}'") from None
            if group in out:
                raise RestrictionError(f"restricted {feature} '{name}' can not be specified in multiple "
                                       "config groups")
            out[group] = Restriction(prefix + header, value)
    return out


def _split(arg: str, option: str) -> tuple[str, str, str]:
    """`<name>:<setting>=<value>`, as Triton's ParseGenericConfigOption splits it."""
    colon = arg.find(":")
    equals = arg.find("=", colon + 1) if colon >= 0 else -1
    if colon < 0 or equals < 0 or colon == 0 or equals == colon + 1 or equals == len(arg) - 1:
        raise RestrictionError(f"--{option} option format is '<config name>:<setting>=<value>'. Got {arg}")
    return arg[:colon], arg[colon + 1:equals], arg[equals + 1:]


__all__ = ["GRPC_RESTRICTED_PREFIX", "ApiGroup", "Restriction", "RestrictionError", "parse_restrictions"]
