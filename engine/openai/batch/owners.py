"""Who owns a Batch API file or job: the API key that created it (docs/security.md). Another key's files and
jobs answer 404, as if they did not exist, on every endpoint; a listing shows the caller's own only. A
server without `--api-keys` has one owner, KEYLESS ("").

An owner is the key's owner id (engine/access/api_keys.py `owner_id`, `key-<hex>`): what the access policy
admitted the request as (engine/access/policy.py `Admission.owner`, read here as `HttpRequest.owner`), and
what is kept on disk beside each file and job. It follows the secret, not the key's place in the keys file, so
reordering or removing other keys never hands one key's jobs to another; a key whose secret changes is a new
owner (its old files and jobs stay on disk, reachable by nobody, until the operator removes them). A job's
requests draw from the `tokens_per_minute` of the key with its owner id (engine/openai/token_quotas.py).

Called on the loop by the routes (engine/frontend/openai/batch_routes.py) and by the runner for the jobs
resumed at start; with `--workers N` in the engine process, where /v1 requests are forwarded with their
owner.
"""

from __future__ import annotations

from ...access.api_keys import ApiKey
from ..errors import OpenAIError

KEYLESS = ""  # the keyless server's one owner


class Owners:
    """The owners the server knows: the configured keys' owner ids (the keyless owner alone on a server
    without keys)."""

    def __init__(self, keys: tuple[ApiKey, ...]) -> None:
        self._ids = frozenset(k.owner for k in keys) if keys else frozenset({KEYLESS})

    def of_request(self, owner: str) -> str:
        """The owner a request acts for: its own (HttpRequest.owner). OpenAIError 401 when it is none of the
        configured keys' (a keyless request to a server with keys, which the access policy refuses before it
        gets here)."""
        if owner in self._ids:
            return owner
        raise OpenAIError(401, "Missing or unknown API key: send the header 'Authorization: Bearer <key>'.",
                          "invalid_request_error", None, "invalid_api_key")

    def known(self, stored: str) -> bool:
        """Whether the owner of a stored file or job is still one the server knows (a job resumed at start
        whose key is gone fails)."""
        return stored in self._ids
