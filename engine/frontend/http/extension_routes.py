"""Triton's extension endpoints on the HTTP port, beside KServe v2's core (routes.py): the model repository
(index, load, unload), client shared memory (system and CUDA), logging and trace settings. Each handler
answers one row of the endpoint table (frontend/endpoints.py), called as handler(req, target, on_done) by
HttpRoutes.route; the rows name methods of HttpRoutes, so this class is mixed into it.

Only the engine process answers these (a frontend of --workers N forwards them: workers/forwarding.py), so
they read the DataPlane (`dp`) directly. Triton's own handlers are server src/http_server.cc
HandleRepository*, HandleSystemSharedMemory / HandleCudaSharedMemory, HandleLogging and HandleTrace.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from ...access.caller import Caller
from ...errors import invalid
from ...observability.tracing import settings as trace_settings
from ...shm import cuda as cuda_shm
from ..endpoints import Endpoint
from .answers import error_answer, json_answer
from .bodies import json_body
from .path import HttpTarget
from .types import Answer, HttpLimits, HttpRequest, OnDone, Pending

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from ...dataplane import DataPlane

_OK: Answer = (200, b"", b"application/json", b"")


class ExtensionRoutes:
    """The extension endpoints' handlers, mixed into HttpRoutes (routes.py), whose `dp` (the DataPlane),
    `limits` and `_spawn` (a task answered later) they use."""

    limits: HttpLimits

    if TYPE_CHECKING:
        @property
        def dp(self) -> DataPlane: ...

        def _spawn(self, coro: Coroutine[Any, Any, Answer], on_done: OnDone) -> Pending: ...

    def repository_index(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        return self._index(req)

    def repository_load(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Pending:
        doc = json_body(req, self.limits.max_body_bytes)  # parsed here, so its errors are answered here
        return self._spawn(self._load(doc, target.name), on_done)

    def repository_unload(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Pending:
        doc = json_body(req, self.limits.max_body_bytes)
        return self._spawn(self._unload(doc, target.name), on_done)

    def shared_memory(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        """/v2/{system,cuda}sharedmemory[/region/{name}]/{status,register,unregister} (Triton's endpoints,
        server src/http_server.cc HandleSystemSharedMemory / HandleCudaSharedMemory)."""
        cuda = target.endpoint is Endpoint.CUDA_SHM
        name, action = target.name, target.action
        if (req.method not in (b"GET", b"HEAD")) if action == "status" else req.method != b"POST":
            # the row lists no methods: they depend on the action
            return error_answer(405, "Method Not Allowed")
        caller = Caller(req.owner, *req.ends)
        if action == "status":
            return json_answer(self.dp.shm_status(cuda, name, caller))
        if action == "unregister":
            self.dp.shm_unregister(cuda, name, caller)
            return _OK
        kind = "cuda" if cuda else "system"
        self.dp.shm.require_allowed()  # the flag's message first, before the body is read, as Triton's
        if not name:
            raise invalid(f"'region name' is necessary to register {kind} shared memory region")
        doc = json_body(req, self.limits.max_body_bytes)
        if cuda:
            self.dp.cuda_shm_register(cuda_shm.from_json(name, doc), caller)
            return _OK
        if "key" not in doc:
            raise invalid("Shared memory register request has no 'key' field")
        if "byte_size" not in doc:
            raise invalid("Shared memory register request has no 'byte_size' field")
        self.dp.shm_register(name, doc["key"], doc.get("offset", 0), doc["byte_size"], caller)
        return _OK

    def log_settings(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        """Triton's logging extension: GET reads the settings, POST changes those it names (null: left as
        is), each checked for its JSON type first."""
        changes = None
        if req.method == b"POST":
            changes = _log_changes(json_body(req, self.limits.max_body_bytes))
        return json_answer(self.dp.log_settings(changes, http=True))

    def trace_setting(self, req: HttpRequest, target: HttpTarget, on_done: OnDone) -> Answer:
        """Triton's trace extension, server-wide (/v2/trace/setting: `target.name` "") or for one model."""
        changes = None
        if req.method == b"POST":
            changes = trace_settings.changes_from_json(json_body(req, self.limits.max_body_bytes))
        return json_answer(self.dp.trace_setting(target.name, changes))

    def _index(self, req: HttpRequest) -> Answer:
        doc = json_body(req, self.limits.max_body_bytes)
        ready = doc.get("ready", False)
        if not isinstance(ready, bool):
            raise invalid("'ready' must be true or false")
        return json_answer([{"name": e.name, "version": e.version, "state": e.state.value, "reason": e.reason}
                      for e in self.dp.repository_index(ready)])

    async def _load(self, doc: dict[str, Any], name: str) -> Answer:
        params = doc.get("parameters") or {}
        if not isinstance(params, dict):
            raise invalid("'parameters' must be a JSON object")
        files = {k[5:]: _base64(k, v) for k, v in params.items() if k.startswith("file:")}
        await self.dp.load(name, params.get("config"), files)  # the data plane parses the config override
        return _OK

    async def _unload(self, doc: dict[str, Any], name: str) -> Answer:
        """`{"parameters": {"unload_dependents": true}}` also unloads an ensemble's composing models that no
        other loaded ensemble uses (the data plane decides which)."""
        params = doc.get("parameters") or {}
        if not isinstance(params, dict):
            raise invalid("'parameters' must be a JSON object")
        unload_dependents = params.get("unload_dependents", False)
        if not isinstance(unload_dependents, bool):
            raise invalid("parameter 'unload_dependents' must be a boolean")
        await self.dp.unload(name, unload_dependents)
        return _OK


def _log_changes(doc: dict[str, Any]) -> dict[str, Any]:
    """A logging POST body's settings as Python values; a value of the wrong JSON type is refused."""
    changes: dict[str, Any] = {}
    for name, value in doc.items():
        if value is None:
            continue
        if name == "log_file":
            changes[name] = value
        elif name in ("log_info", "log_warning", "log_error"):
            if not isinstance(value, bool):
                raise invalid(f"expect boolean for '{name}'")
            changes[name] = value
        elif name == "log_verbose_level":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise invalid(f"expect unsigned integer for '{name}'")
            changes[name] = value
        elif name == "log_format":
            if not isinstance(value, str):
                raise invalid(f"expect string for '{name}'")
            changes[name] = value
    return changes


def _base64(key: str, value: Any) -> bytes:
    """A `file:` load parameter: the file's bytes, base64-encoded in the JSON (Triton's protocol)."""
    try:
        return base64.b64decode(value, validate=True)
    except (TypeError, ValueError):
        raise invalid(f"parameter '{key}' must be the file's content as a base64 string") from None


__all__ = ["ExtensionRoutes"]
