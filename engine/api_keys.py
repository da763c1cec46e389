"""hubserve's API keys (`--api-keys FILE`): the YAML file read and checked once, at start, into frozen
`ApiKey`s that `AccessPolicy` (access.py) holds. The form (these names are fixed; README "Security"):

    keys:
      - key: "s3cret-admin"
        groups: ["*"]                      # every API group
      - key: "s3cret-app"
        groups: [inference, metadata, health]
        requests_per_second: 50            # token bucket, burst = one second's worth
        max_concurrent: 4                  # requests in flight at once
        tokens_per_minute: 20000           # OpenAI API tokens (engine/openai/token_quotas.py)

A field we do not know is refused rather than ignored: a misspelt `max_concurent` must not leave a key
unlimited. Errors name the key by its position (`keys[1]`), never by its secret.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .access_groups import ApiGroup

_FIELDS = {"key", "groups", "requests_per_second", "max_concurrent", "tokens_per_minute"}


class ApiKeysError(ValueError):
    """The keys file cannot be used; the message says where and why."""


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One key: the SHA-256 of its secret (what requests are compared against, in constant time), the API
    groups it may call and its quotas (None: unlimited)."""

    label: str  # "keys[0]": how logs and errors name it
    digest: bytes
    groups: frozenset[ApiGroup]
    requests_per_second: float | None = None
    max_concurrent: int | None = None
    tokens_per_minute: int | None = None


def digest(secret: bytes) -> bytes:
    return hashlib.sha256(secret).digest()


def bearer_digest(authorization: bytes | None) -> bytes | None:
    """The digest of the key an `Authorization: Bearer <key>` header value names (what the access policy
    compares and a key's quotas are looked up by); None for no header or another scheme."""
    if authorization is None or authorization[:7].lower() != b"bearer ":
        return None
    return digest(authorization[7:].strip())


def load_api_keys(path: Path) -> tuple[ApiKey, ...]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ApiKeysError(f"--api-keys: cannot read '{path.name}': {e.strerror}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ApiKeysError(f"--api-keys: '{path.name}' is not valid YAML: {e}") from None
    return parse_api_keys(doc, path.name)


def parse_api_keys(doc: Any, source: str = "the keys file") -> tuple[ApiKey, ...]:
    if not isinstance(doc, dict) or set(doc) != {"keys"} or not isinstance(doc["keys"], list) \
            or not doc["keys"]:
        raise ApiKeysError(f"--api-keys: {source} must hold one field, 'keys', a non-empty list")
    keys: list[ApiKey] = []
    seen: set[bytes] = set()
    for i, entry in enumerate(doc["keys"]):
        key = _entry(entry, f"keys[{i}]", source)
        if key.digest in seen:
            raise ApiKeysError(f"--api-keys: {source}: keys[{i}] repeats an earlier key")
        seen.add(key.digest)
        keys.append(key)
    return tuple(keys)


def _entry(entry: Any, label: str, source: str) -> ApiKey:
    where = f"--api-keys: {source}: {label}"
    if not isinstance(entry, dict):
        raise ApiKeysError(f"{where} must be a mapping with 'key' and 'groups'")
    unknown = sorted(set(entry) - _FIELDS)
    if unknown:
        raise ApiKeysError(f"{where} has unknown field(s) {', '.join(map(repr, unknown))}; "
                           f"known: {', '.join(sorted(_FIELDS))}")
    secret = entry.get("key")
    if not isinstance(secret, str) or not secret or secret != secret.strip() or not secret.isprintable():
        raise ApiKeysError(f"{where}: 'key' must be a non-empty string of printable characters without "
                           "leading or trailing spaces")
    groups = entry.get("groups")
    if not isinstance(groups, list) or not groups or not all(isinstance(g, str) for g in groups):
        raise ApiKeysError(f"{where}: 'groups' must be a non-empty list of API groups (or [\"*\"])")
    return ApiKey(label, digest(secret.encode()), _groups(groups, where),
                  _positive(entry, "requests_per_second", where, float),
                  _positive(entry, "max_concurrent", where, int),
                  _positive(entry, "tokens_per_minute", where, int))


def _groups(names: list[str], where: str) -> frozenset[ApiGroup]:
    if "*" in names:
        return frozenset(ApiGroup)
    out = set()
    for name in names:
        try:
            out.add(ApiGroup(name))
        except ValueError:
            raise ApiKeysError(f"{where}: unknown API group '{name}'; groups: "
                               f"{', '.join(g.value for g in ApiGroup)}, or \"*\"") from None
    return frozenset(out)


def _positive(entry: dict[str, Any], name: str, where: str, kind: type) -> Any:
    value = entry.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 \
            or kind is int and not isinstance(value, int):
        raise ApiKeysError(f"{where}: '{name}' must be a positive {'whole ' if kind is int else ''}number")
    return kind(value)


__all__ = ["ApiKey", "ApiKeysError", "digest", "load_api_keys", "parse_api_keys"]
