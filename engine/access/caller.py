"""Who sent a request, as far as the server can tell: `Caller`, made by a frontend and read by the data plane
where it matters (client shared memory: engine/shm/client.py).

- `owner`: the owner id of the API key the request presented (`key-<hex>`, api_keys.py `owner_id`,
  as the access policy admitted it: policy.py `Admission.owner`), "" on a server without keys,
  which therefore has one owner. What one key registers, another key never sees, uses or drops. The same
  id is `HttpRequest.owner` and `InferenceRequest.owner`: the one notion of "who" past the access policy
  (the sequence backlog's share per key, tokens_per_minute and the Batch API's owners read it too).
- `peer` and `local`: the connection's two ends, (address, port) each, None where unknown. With them the
  server can ask the kernel which local user owns the client's socket (engine/shm/socket_owner.py), for a
  client on this machine.

A Caller crosses from a frontend process to the engine (--workers N) as three fields of the forwarded call
(engine/workers/messages.py `HttpCall`, `GrpcCall`), whose types the engine's decoder checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Caller:
    owner: str = ""
    peer: Address | None = None
    local: Address | None = None


NOBODY = Caller()  # a request with no connection (in-process callers, tests): the keyless owner


def _address(value: Any) -> Address | None:
    if isinstance(value, (tuple, list)) and len(value) >= 2:
        return str(value[0]), int(value[1])
    return None


def ends(transport: Any) -> tuple[Address | None, Address | None]:
    """A transport's (peer, local) ends, as (address, port) pairs; None for one it cannot name (a Unix
    socket, a transport already closed)."""
    if transport is None:
        return None, None
    return _address(transport.get_extra_info("peername")), _address(transport.get_extra_info("sockname"))


__all__ = ["NOBODY", "Address", "Caller", "ends"]
