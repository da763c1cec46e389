"""The endpoint table: every HTTP endpoint and every gRPC method hubserve serves, one row each, and the one
matcher of a decoded HTTP path against the rows.

A row says what the endpoint is (its path pattern and methods, or its gRPC method), who answers it (the
`handler`: a method of the router its `api` names, HttpRoutes in frontend/http/routes.py or OpenAIRoutes or
BatchRoutes in frontend/openai/, or of GrpcHandlers, frontend/grpc/handlers.py),
which API group it is in (engine/access/groups.py, as Triton groups them: server src/http_server.cc, each
Handle* checks one category; src/grpc/grpc_server.cc, each RPC's CallData gets one), where it runs with
`--workers N` (`Where`) and whether its client leaving cancels it. Every reader reads the row:

- the access check (engine/access/policy.py, asked by http/connection.py and grpc/call.py) reads `group`;
- the HTTP router (HttpRoutes.route) calls `handler` after checking `methods`, and hands an OpenAI API row to
  the OpenAI router (OpenAIRoutes.handle), which does the same in the OpenAI API's words;
- the gRPC dispatch (grpc/rpcs.py `rpc_table`) builds its method table from GRPC_METHODS;
- the workers (engine/workers/forwarding.py, session.py, streams.py) read `where` and `cancellable`.

Why one table: the access check and the router reading one path differently is how an encoded path once
skipped every restriction (issue 27); four lists of gRPC methods could drift the same way. Adding an endpoint
is one row here and its handler; a unit test (tests/.../test_endpoints.py) checks that every row has a handler
and every handler a row.

An HTTP path is decoded by frontend/http/path.py (`parse_target`, the one parse) and matched here (`match`).
Patterns are segments: a literal, `{name}` or `{version}` (any one segment, kept in the target),
`{action:a|b}` (one of those, kept), `{rest*}` (any number of segments, the last thing in a pattern), and one
optional part in `[...]`. A literal is tried before a capture and a longer match before `{rest*}`, so
`/v2/models/stats` is every model's statistics while `/v2/models/stats/ready` is the readiness of a model
named `stats`, as Triton reads them.

The OpenAI API's endpoints (/v1/...) are rows of the same table, not a table of their own: one parse and one
matcher read every path, so the access check, the router and the workers' forwarding read the same row for
/v1/batches as for /v2/models/m/infer, and the drift test covers both APIs. What differs is said in the row:
its `api` (which router answers; the Batch API's rows answer 501 while it is off, before anything else) and
its wrong method (OpenAI's error object). A path under /v1 that no row names is still the OpenAI API's
(`OPENAI_UNKNOWN`, `{rest*}`): OpenAI's 404 "Unknown request URL", after the Batch API's 501 under /v1/files
and /v1/batches.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..access.groups import ApiGroup

G = ApiGroup


class Where(enum.Enum):
    """Where a request is answered when the server runs `--workers N` frontend processes."""

    LOCAL = "local"  # in the frontend process that holds the client (decoded there, submitted to the engine)
    FORWARDED = "forwarded"  # forwarded as it came and answered by the engine's own handler


class Api(enum.Enum):
    """Which router answers a row: its `handler` is a method of that router's class."""

    KSERVE = "KServe v2"  # HttpRoutes (frontend/http/routes.py): KServe v2 and Triton's extensions
    OPENAI = "OpenAI"  # OpenAIRoutes (frontend/openai/routes.py), handed the request by HttpRoutes
    # BatchRoutes (frontend/openai/batch_routes.py), through OpenAIRoutes: 501 while the Batch API is off,
    # then 401 for a request that acts for no key's owner, before the method is checked
    BATCH = "OpenAI Batch"


class WrongMethod(enum.Enum):
    """How the router answers a method the row does not list (Triton's answers)."""

    NO_ENDPOINT = "no endpoint"  # 404 "no endpoint GET /v2/repository/index"
    NEEDS = "needs"  # 405 "infer needs POST": the row's `action` and its first method
    NOT_ALLOWED = "not allowed"  # 405 "Method Not Allowed"
    # 405 as OpenAI's error object: "GET is not allowed on /v1/completions; use POST." (the row's `action`,
    # or the path, and its first method)
    OPENAI = "openai"


GET = (b"GET", b"HEAD")
POST = (b"POST",)
GET_POST = (b"GET", b"POST")
POST_GET = (b"POST", b"GET")  # GET lists; any other method is told to POST
GET_DELETE = (b"GET", b"DELETE")
GET_ONLY = (b"GET",)  # HEAD too is told to GET (the Batch API's jobs and file contents)


@dataclass(frozen=True, slots=True)
class HttpRow:
    """One HTTP endpoint. `methods`: those it answers (None: its handler decides, per action, or answers
    every method alike); any other is answered as `wrong_method` says. `handler`: the method of the router
    `api` names that answers it, called as `handler(req, target, on_done)` (a BatchRoutes one as
    `handler(req, target, owner)`). `action`: the endpoint's word in a 405."""

    pattern: str
    methods: tuple[bytes, ...] | None
    group: ApiGroup | None
    handler: str
    where: Where = Where.FORWARDED
    cancellable: bool = False
    wrong_method: WrongMethod = WrongMethod.NO_ENDPOINT
    action: str = ""
    api: Api = Api.KSERVE


_MODEL = "/v2/models/{name}[/versions/{version}]"
_SHM = "[/region/{name}]/{action:status|register|unregister}"
L, NEEDS, NOT_ALLOWED = Where.LOCAL, WrongMethod.NEEDS, WrongMethod.NOT_ALLOWED


def _v1(pattern: str, methods: tuple[bytes, ...] | None, handler: str, api: Api = Api.OPENAI,
        action: str = "") -> HttpRow:
    """An OpenAI API row: inference, as its generation is (the Batch API's files and jobs are its inputs and
    outputs); answered in the engine process (forwarded with --workers N), and cancelled there when its
    client leaves (a generation would run on for nobody, a download read on; and only a cancellable
    forwarded request streams back: workers/streams.py)."""
    return HttpRow(pattern, methods, G.INFERENCE, handler, Where.FORWARDED, True, WrongMethod.OPENAI, action,
                   api)


def _vllm(pattern: str, methods: tuple[bytes, ...], group: ApiGroup, handler: str,
          cancellable: bool = False) -> HttpRow:
    """One of vLLM's operational endpoints beside the OpenAI API (/health, /version, /tokenize, /detokenize,
    /metrics, outside /v1 as vLLM has them), answered by the OpenAI router in the engine process, each in
    the API group of its kind: /health keyless like Triton's health checks, /tokenize and /detokenize
    inference like a generation, /metrics statistics (keys and restrictions as /v2/models/stats)."""
    return HttpRow(pattern, methods, group, handler, Where.FORWARDED, cancellable, WrongMethod.OPENAI,
                   pattern, Api.OPENAI)


class Endpoint(enum.Enum):
    """Every HTTP endpoint, each member's value its row. NONE: no endpoint (404, in no group: it still needs a
    key). MALFORMED: a target refused before anything else (400)."""

    SERVER_METADATA = HttpRow("/v2", GET, G.METADATA, "server_metadata")
    HEALTH_LIVE = HttpRow("/v2/health/live", GET, G.HEALTH, "health_live")
    HEALTH_READY = HttpRow("/v2/health/ready", GET, G.HEALTH, "health_ready")
    MODELS_STATS = HttpRow("/v2/models/stats", GET, G.STATISTICS, "models_stats")  # every model's
    MODEL_METADATA = HttpRow(_MODEL, GET, G.METADATA, "model_metadata", wrong_method=NEEDS, action="metadata")
    # model readiness is in `health`, as in Triton
    MODEL_READY = HttpRow(_MODEL + "/ready", GET, G.HEALTH, "model_ready", wrong_method=NEEDS, action="ready")
    MODEL_CONFIG = HttpRow(_MODEL + "/config", GET, G.MODEL_CONFIG, "model_config", wrong_method=NEEDS,
                           action="config")
    MODEL_STATS = HttpRow(_MODEL + "/stats", GET, G.STATISTICS, "model_stats", wrong_method=NEEDS,
                          action="stats")
    MODEL_INFER = HttpRow(_MODEL + "/infer", POST, G.INFERENCE, "infer", L, True, NEEDS, "infer")
    MODEL_GENERATE = HttpRow(_MODEL + "/generate", POST, G.INFERENCE, "generate", L, True, NEEDS,
                             "generate")
    MODEL_GENERATE_STREAM = HttpRow(_MODEL + "/generate_stream", POST, G.INFERENCE, "generate", L, True,
                                    NEEDS, "generate_stream")
    MODEL_TRACE = HttpRow(_MODEL + "/trace/setting", GET_POST, G.TRACE, "trace_setting",
                          wrong_method=NOT_ALLOWED)
    TRACE = HttpRow("/v2/trace/setting", GET_POST, G.TRACE, "trace_setting", wrong_method=NOT_ALLOWED)
    LOGGING = HttpRow("/v2/logging", GET_POST, G.LOGGING, "log_settings", wrong_method=NOT_ALLOWED)
    REPOSITORY_INDEX = HttpRow("/v2/repository/index", POST, G.MODEL_REPOSITORY, "repository_index")
    REPOSITORY_LOAD = HttpRow("/v2/repository/models/{name}/load", POST, G.MODEL_REPOSITORY,
                              "repository_load")
    REPOSITORY_UNLOAD = HttpRow("/v2/repository/models/{name}/unload", POST, G.MODEL_REPOSITORY,
                                "repository_unload")
    # status needs GET, register and unregister POST: the handler checks, per action
    SYSTEM_SHM = HttpRow("/v2/systemsharedmemory" + _SHM, None, G.SHARED_MEMORY, "shared_memory")
    CUDA_SHM = HttpRow("/v2/cudasharedmemory" + _SHM, None, G.SHARED_MEMORY, "shared_memory")
    # the OpenAI-compatible API (frontend/openai/); `name` captures a model, file or batch id
    OPENAI_MODELS = _v1("/v1/models", GET, "list_models", action="/v1/models")
    OPENAI_MODEL = _v1("/v1/models/{name}", GET, "retrieve_model", action="/v1/models")
    OPENAI_COMPLETIONS = _v1("/v1/completions", POST, "completions")
    OPENAI_CHAT_COMPLETIONS = _v1("/v1/chat/completions", POST, "chat_completions")
    OPENAI_EMBEDDINGS = _v1("/v1/embeddings", POST, "embeddings")
    OPENAI_FILES = _v1("/v1/files", POST_GET, "files", Api.BATCH)  # upload, or list
    OPENAI_FILE = _v1("/v1/files/{name}", GET_DELETE, "file", Api.BATCH)  # its object, or delete it
    OPENAI_FILE_CONTENT = _v1("/v1/files/{name}/content", GET_ONLY, "file_content", Api.BATCH)
    OPENAI_BATCHES = _v1("/v1/batches", POST_GET, "batches", Api.BATCH)  # create, or list
    OPENAI_BATCH = _v1("/v1/batches/{name}", GET_ONLY, "batch", Api.BATCH)
    OPENAI_BATCH_CANCEL = _v1("/v1/batches/{name}/cancel", POST, "cancel_batch", Api.BATCH)
    # vLLM's operational endpoints, on the OpenAI API's port (frontend/openai/routes.py)
    VLLM_HEALTH = _vllm("/health", GET, G.HEALTH, "health")
    VLLM_VERSION = _vllm("/version", GET, G.METADATA, "version")
    VLLM_TOKENIZE = _vllm("/tokenize", POST, G.INFERENCE, "tokenize", cancellable=True)
    VLLM_DETOKENIZE = _vllm("/detokenize", POST, G.INFERENCE, "detokenize", cancellable=True)
    VLLM_METRICS = _vllm("/metrics", GET, G.STATISTICS, "metrics")
    # no endpoint, in OpenAI's words (404 "Unknown request URL"); under /v1/files and /v1/batches only once
    # the Batch API is on and the request's owner known
    OPENAI_UNKNOWN = _v1("/v1[/{rest*}]", None, "unknown_url")
    OPENAI_FILES_UNKNOWN = _v1("/v1/files/{rest*}", None, "unknown_url", Api.BATCH)
    OPENAI_BATCHES_UNKNOWN = _v1("/v1/batches/{rest*}", None, "unknown_url", Api.BATCH)
    NONE = HttpRow("", None, None, "no_endpoint")
    MALFORMED = HttpRow("", None, None, "malformed")

    def __init__(self, row: HttpRow) -> None:
        # plain attributes: read once per request, by the access check and the router
        self.row = row
        self.group = row.group

    # Members are singletons: identity hashing (C, not Enum's hash of the name) for the sets and dicts of
    # endpoints read on every request. Never hashed across processes (they cross by name).
    __hash__ = object.__hash__


class Kind(enum.Enum):
    """How a gRPC method is called (grpc/call.py)."""

    UNARY = "unary"  # one request, one response; the handler may return an awaitable
    INFER = "infer"  # ModelInfer: the message bytes to submit_infer_wire, answered from its future's callback
    # ModelStreamInfer: each request's bytes to stream_infer_wire, answered as it completes
    STREAM_INFER = "stream infer"
    # grpc.health.v1 Health/Watch: one request, then the status on every change, from the process's
    # HealthWatch (grpc/health_watch.py); the handler is the statuses it reads (`watch_statuses`)
    WATCH = "watch"


@dataclass(frozen=True, slots=True)
class GrpcRow:
    """One gRPC method. `handler`: the GrpcHandlers method that answers it; `caller`: a unary handler that
    takes the call's Caller too (client shared memory is scoped by API key, and registering needs the
    connection's ends)."""

    service: str
    method: str
    group: ApiGroup
    handler: str
    kind: Kind = Kind.UNARY
    where: Where = Where.FORWARDED
    cancellable: bool = False
    caller: bool = False

    @property
    def path(self) -> bytes:
        """The method's HTTP/2 `:path`."""
        return f"/{self.service}/{self.method}".encode()


def _rpc(method: str, group: ApiGroup, caller: bool = False) -> GrpcRow:
    """A unary method of inference.GRPCInferenceService, answered by the GrpcHandlers method of its name and
    forwarded to the engine with --workers N."""
    return GrpcRow(_INFERENCE, method, group, method, caller=caller)


_INFERENCE, _HEALTH = "inference.GRPCInferenceService", "grpc.health.v1.Health"

GRPC_METHODS: tuple[GrpcRow, ...] = (
    _rpc("ServerLive", G.HEALTH), _rpc("ServerReady", G.HEALTH), _rpc("ModelReady", G.HEALTH),
    _rpc("ServerMetadata", G.METADATA), _rpc("ModelMetadata", G.METADATA),
    GrpcRow(_INFERENCE, "ModelInfer", G.INFERENCE, "submit_infer_wire", Kind.INFER, Where.LOCAL, True),
    GrpcRow(_INFERENCE, "ModelStreamInfer", G.INFERENCE, "stream_infer_wire", Kind.STREAM_INFER, Where.LOCAL,
            True),
    _rpc("ModelConfig", G.MODEL_CONFIG), _rpc("ModelStatistics", G.STATISTICS),
    _rpc("RepositoryIndex", G.MODEL_REPOSITORY), _rpc("RepositoryModelLoad", G.MODEL_REPOSITORY),
    _rpc("RepositoryModelUnload", G.MODEL_REPOSITORY),
    _rpc("SystemSharedMemoryStatus", G.SHARED_MEMORY, caller=True),
    _rpc("SystemSharedMemoryRegister", G.SHARED_MEMORY, caller=True),
    _rpc("SystemSharedMemoryUnregister", G.SHARED_MEMORY, caller=True),
    _rpc("CudaSharedMemoryStatus", G.SHARED_MEMORY, caller=True),
    _rpc("CudaSharedMemoryRegister", G.SHARED_MEMORY, caller=True),
    _rpc("CudaSharedMemoryUnregister", G.SHARED_MEMORY, caller=True),
    _rpc("TraceSetting", G.TRACE), _rpc("LogSettings", G.LOGGING),
    GrpcRow(_HEALTH, "Check", G.HEALTH, "Check"),
    # served by each process's HealthWatch; the statuses it reads come from the engine (a HEALTH control)
    GrpcRow(_HEALTH, "Watch", G.HEALTH, "watch_statuses", Kind.WATCH, Where.LOCAL, True),
)
GRPC_BY_PATH: dict[bytes, GrpcRow] = {row.path: row for row in GRPC_METHODS}


# ---------------------------------------------------------------------------------------------- the matcher

class _Node:
    """A trie of pattern segments: `literals` by text, then `captures` in row order, then `tail`."""

    __slots__ = ("captures", "end", "literals", "tail")

    def __init__(self) -> None:
        self.literals: dict[str, _Node] = {}
        self.captures: list[tuple[str, frozenset[str] | None, _Node]] = []
        self.end: Endpoint | None = None
        self.tail: Endpoint | None = None


Captured = dict[str, str]  # "name", "version", "action": what a pattern's captures read


def _alternatives(pattern: str) -> list[str]:
    """The pattern without and with its optional part."""
    start = pattern.find("[")
    if start < 0:
        return [pattern]
    stop = pattern.index("]", start)
    before, optional, after = pattern[:start], pattern[start + 1:stop], pattern[stop + 1:]
    return [before + after, before + optional + after]


def _add(root: _Node, pattern: str, endpoint: Endpoint) -> None:
    node = root
    for segment in pattern.strip("/").split("/"):
        if segment == "{rest*}":
            node.tail = endpoint
            return
        if segment.startswith("{"):
            slot, _, allowed = segment[1:-1].partition(":")
            choices = frozenset(allowed.split("|")) if allowed else None
            for known_slot, known_choices, child in node.captures:
                if (known_slot, known_choices) == (slot, choices):
                    node = child
                    break
            else:
                child = _Node()
                node.captures.append((slot, choices, child))
                node = child
        else:
            node = node.literals.setdefault(segment, _Node())
    if node.end is not None:
        raise ValueError(f"{endpoint.name}: pattern {pattern!r} is {node.end.name}'s already")
    node.end = endpoint


def _compile() -> _Node:
    root = _Node()
    for endpoint in Endpoint:
        if endpoint.row.pattern:
            for pattern in _alternatives(endpoint.row.pattern):
                _add(root, pattern, endpoint)
    return root


_ROOT = _compile()


def match(segments: tuple[str, ...]) -> tuple[Endpoint, Captured]:
    """The endpoint decoded path segments name, and what its pattern captured; (NONE, {}) for none. Called
    by frontend/http/path.py's parse, the one reading of a request's path."""
    found = _walk(_ROOT, segments, 0)
    return found if found is not None else (Endpoint.NONE, {})


def _walk(node: _Node, segments: tuple[str, ...], i: int) -> tuple[Endpoint, Captured] | None:
    if i == len(segments):
        if node.end is not None:
            return node.end, {}
        return (node.tail, {}) if node.tail is not None else None
    segment = segments[i]
    child = node.literals.get(segment)
    if child is not None and (found := _walk(child, segments, i + 1)) is not None:
        return found
    for slot, choices, child in node.captures:
        if (choices is None or segment in choices) and (found := _walk(child, segments, i + 1)) is not None:
            found[1][slot] = segment
            return found
    return (node.tail, {}) if node.tail is not None else None


__all__ = ["GRPC_BY_PATH", "GRPC_METHODS", "Api", "Endpoint", "GrpcRow", "HttpRow", "Kind", "Where",
           "WrongMethod", "match"]
