"""Which API group (engine/access/groups.py) each gRPC method is in, as Triton groups them (server
src/grpc/grpc_server.cc: each RPC's CallData gets one); model readiness is in `health`, as in Triton. An HTTP
endpoint's group is fixed with the endpoint itself, by the one parse of its path (http/path.py `Endpoint`).
"""

from __future__ import annotations

from ...access.groups import ApiGroup

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

def grpc_group(path: bytes) -> ApiGroup | None:
    """The group of a gRPC method by its `:path` (`/inference.GRPCInferenceService/ModelInfer`)."""
    return GRPC_GROUPS.get(path.rsplit(b"/", 1)[-1].decode("latin-1"))


__all__ = ["GRPC_GROUPS", "grpc_group"]
