"""Which API group (engine/access_groups.py) each endpoint and RPC is in, as Triton groups them (server
src/http_server.cc: each Handle* checks one category; src/grpc/grpc_server.cc: each RPC's CallData gets
one). Model readiness is in `health`, as in Triton; endpoints hubserve does not serve (trace, logging,
shared memory) keep their group, so a restriction on them answers before the 501.
"""

from __future__ import annotations

from ..access_groups import ApiGroup

G = ApiGroup

GRPC_GROUPS: dict[str, ApiGroup] = {
    "ServerLive": G.HEALTH, "ServerReady": G.HEALTH, "ModelReady": G.HEALTH, "Check": G.HEALTH,
    "Watch": G.HEALTH,
    "ServerMetadata": G.METADATA, "ModelMetadata": G.METADATA,
    "ModelConfig": G.MODEL_CONFIG,
    "ModelStatistics": G.STATISTICS,
    "ModelInfer": G.INFERENCE, "ModelStreamInfer": G.INFERENCE,
    "RepositoryIndex": G.MODEL_REPOSITORY, "RepositoryModelLoad": G.MODEL_REPOSITORY,
    "RepositoryModelUnload": G.MODEL_REPOSITORY,
    "SystemSharedMemoryStatus": G.SHARED_MEMORY, "SystemSharedMemoryRegister": G.SHARED_MEMORY,
    "SystemSharedMemoryUnregister": G.SHARED_MEMORY, "CudaSharedMemoryStatus": G.SHARED_MEMORY,
    "CudaSharedMemoryRegister": G.SHARED_MEMORY, "CudaSharedMemoryUnregister": G.SHARED_MEMORY,
    "TraceSetting": G.TRACE, "LogSettings": G.LOGGING,
}

_FIRST = {"repository": G.MODEL_REPOSITORY, "systemsharedmemory": G.SHARED_MEMORY,
          "cudasharedmemory": G.SHARED_MEMORY, "trace": G.TRACE, "logging": G.LOGGING}
_MODEL_ACTIONS = {"": G.METADATA, "ready": G.HEALTH, "config": G.MODEL_CONFIG, "stats": G.STATISTICS,
                  "infer": G.INFERENCE, "generate": G.INFERENCE, "generate_stream": G.INFERENCE,
                  "trace": G.TRACE}


def grpc_group(path: bytes) -> ApiGroup | None:
    """The group of a gRPC method by its `:path` (`/inference.GRPCInferenceService/ModelInfer`)."""
    return GRPC_GROUPS.get(path.rsplit(b"/", 1)[-1].decode("latin-1"))


def http_group(url: bytes) -> ApiGroup | None:
    """The group of an HTTP request by its URL (the query ignored); None for a path in no group."""
    path = url.split(b"?", 1)[0]
    if path.endswith(b"/infer"):  # the hot path: one test
        return G.INFERENCE
    parts = path.decode("utf-8", "replace").strip("/").split("/")
    if parts[0] == "v1":  # the OpenAI-compatible API: generation is inference
        return G.INFERENCE
    if parts[0] != "v2":
        return None
    rest = parts[1:]
    if not rest or rest == [""]:
        return G.METADATA
    if rest[0] == "health":
        return G.HEALTH
    if rest[0] in _FIRST:
        return _FIRST[rest[0]]
    if rest[0] != "models" or len(rest) < 2:
        return None
    if rest[1] == "stats" and len(rest) == 2:
        return G.STATISTICS
    tail = rest[2:]
    if len(tail) >= 2 and tail[0] == "versions":
        tail = tail[2:]
    return _MODEL_ACTIONS.get(tail[0] if tail else "")


__all__ = ["GRPC_GROUPS", "grpc_group", "http_group"]
