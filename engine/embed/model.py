"""`EmbeddingModel`: an embedding model's version, an ONNX instance model whose folder is read while it
loads, so a folder that cannot embed fails its load (UNAVAILABLE with the reason, in the repository index,
its ready endpoint and the log) rather than a client's request."""

from __future__ import annotations

import asyncio

from ..model import InstanceModel
from .folder import EmbeddingFolder, load_folder


class EmbeddingModel(InstanceModel):
    """Served like any instance model (its batcher, its instances, KV2 infer on `last_hidden_state`); adds
    `folder`, read once by `start()`, before the instances, and fixed for the version's life."""

    folder: EmbeddingFolder

    async def start(self) -> None:
        self.folder = await asyncio.to_thread(load_folder, self.config, self.model_dir)
        await super().start()


__all__ = ["EmbeddingModel"]
