"""Who owns a Batch API file or job: the API key that created it (README "Security"). Another key's files and
jobs answer 404, as if they did not exist, on every endpoint; a listing shows the caller's own only. A
server without `--api-keys` has one owner, KEYLESS.

What is kept on disk beside each file and job is the owner's id, `key-<hex>`: a SHA-256 of the key's
digest under a label of its own (never the secret, nor the digest that requests are compared against). It
follows the secret, not the key's place in the keys file, so reordering or removing other keys never hands
one key's jobs to another; a key whose secret changes is a new owner (its old files and jobs stay on disk,
reachable by nobody, until the operator removes them). In memory an owner also carries its key's digest,
whose `tokens_per_minute` its jobs' requests draw from (engine/openai/token_quotas.py).

Called on the loop by the routes (engine/frontend/openai_batch_routes.py) with the request's
`Authorization` header, which the frontend's access policy (engine/access.py) has already checked in
constant time; with `--workers N` this runs in the engine process, where /v1 requests are forwarded with
their headers.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ...api_keys import ApiKey, digest
from ..errors import OpenAIError

_LABEL = b"hubserve batch owner\0"


@dataclass(frozen=True, slots=True)
class Owner:
    id: str                   # kept with the owner's files and jobs; "" for the keyless server's one owner
    key_digest: bytes | None  # the key's digest (whose tokens_per_minute its jobs use); None: keyless


KEYLESS = Owner("", None)


def owner_id(key: ApiKey) -> str:
    return "key-" + hashlib.sha256(_LABEL + key.digest).hexdigest()[:32]


class Owners:
    """The configured keys as owners: by a request's header (`of_request`) or by a stored id (`by_id`, for
    the jobs resumed at start)."""

    def __init__(self, keys: tuple[ApiKey, ...]) -> None:
        owners = [Owner(owner_id(k), k.digest) for k in keys]
        self._by_digest = {o.key_digest: o for o in owners}
        self._by_id = {o.id: o for o in owners} if owners else {KEYLESS.id: KEYLESS}

    def of_request(self, authorization: bytes | None) -> Owner:
        """The owner a request acts for. OpenAIError 401 when the server has keys and the request names none
        of them (the access policy refuses such requests before they get here)."""
        if not self._by_digest:
            return KEYLESS
        if authorization is not None and authorization[:7].lower() == b"bearer ":
            owner = self._by_digest.get(digest(authorization[7:].strip()))
            if owner is not None:
                return owner
        raise OpenAIError(401, "Missing or unknown API key: send the header 'Authorization: Bearer <key>'.",
                          "invalid_request_error", None, "invalid_api_key")

    def by_id(self, stored: str) -> Owner | None:
        """The owner of a stored file or job, or None when no configured key is it any more."""
        return self._by_id.get(stored)
