"""hubserve's API keys (`--api-keys FILE`): the YAML file read and checked once, at start, into frozen
`ApiKey`s that `AccessPolicy` (policy.py) holds. The form (these names are fixed; docs/security.md):

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

Each key's identity downstream is its `owner` id (`owner_id`), worked out once here: the access policy
admits a request as that owner (policy.py `Admission.owner`), and every part that keeps something per
key reads it from the request (caller.py): client shared-memory regions, a key's share of a sequence
backlog, its `tokens_per_minute`, its Batch API files and jobs (kept on disk with it). It follows the
secret, not the key's place in the file, so reordering or removing other keys changes no one's identity.

The file holds secrets, so who may read and change it is checked first, as SSH checks a private key
(`file_mode_problem`): a file other users can read (world-readable) or change (group- or world-writable), or
one owned by a user other than the server's (or root), is refused at start with the chmod that fixes it.
A group-readable file is served with a warning at start (`file_mode_warning`): that is how a Kubernetes
Secret reaches a server that runs as a non-root user (mode 0440 with the pod's fsGroup), and the group is
the operator's choice.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .groups import ApiGroup

_FIELDS = {"key", "groups", "requests_per_second", "max_concurrent", "tokens_per_minute"}


class ApiKeysError(ValueError):
    """The keys file cannot be used; the message says where and why."""


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One key: the SHA-256 of its secret (what requests are compared against, in constant time), its owner
    id (who it is to everything past the access policy), the API groups it may call and its quotas (None:
    unlimited)."""

    label: str  # "keys[0]": how logs and errors name it; its place in the file, so never an identity
    digest: bytes
    owner: str  # owner_id(digest)
    groups: frozenset[ApiGroup]
    requests_per_second: float | None = None
    max_concurrent: int | None = None
    tokens_per_minute: int | None = None


def digest(secret: bytes) -> bytes:
    return hashlib.sha256(secret).digest()


# Kept with the Batch API's files and jobs on disk, so these bytes never change: a key's id must stay what
# it was when its files were written (the Batch API named it first, hence the words).
_OWNER_LABEL = b"hubserve batch owner\0"


def owner_id(key_digest: bytes) -> str:
    """A key's owner id, `key-<hex>`: a SHA-256 of its digest under a label of its own, so it names the key
    without being the secret or the digest that requests are compared against (it is written to disk). The
    keyless server's one owner is ""."""
    return "key-" + hashlib.sha256(_OWNER_LABEL + key_digest).hexdigest()[:32]


def file_mode_problem(path: Path) -> str | None:
    """Why the keys file at `path` may not be used, given who may read and change it; None when it may (a
    file that cannot be read at all is `load_api_keys`'s to report)."""
    try:
        info = path.stat()
    except OSError:
        return None
    mode, name = stat.S_IMODE(info.st_mode), path.name
    if info.st_uid not in (os.geteuid(), 0):
        return (f"--api-keys: '{name}' is owned by another user (uid {info.st_uid}), who could change the "
                "keys: it must belong to the user the server runs as (or root)")
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "every user of this machine" if mode & stat.S_IWOTH else "its group"
        return (f"--api-keys: '{name}' can be changed by {who} (mode {mode:04o}), who could add a key of "
                f"their own: make it private with `chmod 600 {name}`")
    if mode & stat.S_IROTH:
        return (f"--api-keys: '{name}' is readable by every user of this machine (mode {mode:04o}) and holds "
                f"secrets: make it private with `chmod 600 {name}` (0640 for a group you trust)")
    return None


def file_mode_warning(path: Path) -> str | None:
    """What the server warns about at start: a keys file its group may read (allowed, see the docstring)."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return None
    if mode & stat.S_IRGRP and file_mode_problem(path) is None:
        return (f"--api-keys: '{path.name}' is readable by its group (mode {mode:04o}): every member can "
                f"read every key; `chmod 600 {path.name}` unless that group is meant to")
    return None


def load_api_keys(path: Path) -> tuple[ApiKey, ...]:
    problem = file_mode_problem(path)
    if problem is not None:
        raise ApiKeysError(problem)
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
    key_digest = digest(secret.encode())
    return ApiKey(label, key_digest, owner_id(key_digest), _groups(groups, where),
                  _positive(entry, "requests_per_second", where, float),
                  _positive(entry, "max_concurrent", where, int),
                  _positive(entry, "tokens_per_minute", where, int))


def per_replica(keys: tuple[ApiKey, ...], replicas: int) -> tuple[ApiKey, ...]:
    """The keys with the limits one of `replicas` replicas enforces (`--quota-replicas`, docs/replicas.md):
    each replica counts a key's requests on its own, so each holds 1/`replicas` of every limit (rounded
    down), and `replicas` of them together never let a key past what the file gives it. ApiKeysError for a
    limit too small to split: every replica must allow at least one request (or token) of it."""
    if replicas == 1:
        return keys
    out = []
    for key in keys:
        for name in ("requests_per_second", "max_concurrent", "tokens_per_minute"):
            value = getattr(key, name)
            if value is not None and value < replicas:
                raise ApiKeysError(f"--api-keys: {key.label}: {name} {value:g} cannot be split across "
                                   f"{replicas} replicas (--quota-replicas {replicas}): give it at least "
                                   f"{replicas}, or count over fewer replicas")
        rps, most, tpm = key.requests_per_second, key.max_concurrent, key.tokens_per_minute
        out.append(dataclasses.replace(
            key, requests_per_second=None if rps is None else rps / replicas,
            max_concurrent=None if most is None else most // replicas,
            tokens_per_minute=None if tpm is None else tpm // replicas))
    return tuple(out)


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


__all__ = ["ApiKey", "ApiKeysError", "digest", "load_api_keys", "owner_id", "parse_api_keys", "per_replica"]
