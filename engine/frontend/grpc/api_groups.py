"""Which API group (engine/access/groups.py) each gRPC method is in, read from the endpoint table
(frontend/endpoints.py), where each method's row fixes it with its handler; the access check (call.py, through
app.py) asks here by `:path`.
"""

from __future__ import annotations

from ...access.groups import ApiGroup
from ..endpoints import GRPC_BY_PATH, GRPC_METHODS

# method name → group (the method names of both services are distinct)
GRPC_GROUPS: dict[str, ApiGroup] = {row.method: row.group for row in GRPC_METHODS}


def grpc_group(path: bytes) -> ApiGroup | None:
    """The group of a gRPC method by its `:path` (`/inference.GRPCInferenceService/ModelInfer`); None for a
    method that is not served."""
    row = GRPC_BY_PATH.get(path)
    return row.group if row is not None else None


__all__ = ["GRPC_GROUPS", "grpc_group"]
