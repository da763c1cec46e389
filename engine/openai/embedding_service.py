"""`EmbeddingService`: an /v1/embeddings request's texts → token ids → padded batches through the model's
dynamic batcher → one pooled vector per input.

Called on the loop by the OpenAI routes (frontend/openai/routes.py), in the process that holds the
repository (the engine process under `--workers N`). The graph runs where any v2 request of the model runs:
each batch is an `InferenceRequest` handed to the engine seam (frontend/engine.py `Engine.submit`, the
DataPlane), so the model's dynamic batcher joins it with other requests of the same padded length, and its
statistics count it. Padding: each input is padded on the right to a length bucket (`padded_length`: powers
of two from 16 up to the context), so requests of similar lengths meet in one batch; the attention mask keeps
the padding out of every real token's state, and the pooling (pooling.py) reads real tokens only.

An input longer than the context is refused (400, as OpenAI's API refuses it), not cut.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from typing import Any

import numpy as np

from ..embed.folder import HIDDEN, IDS, MASK, TYPE_IDS, EmbeddingFolder
from ..embed.model import EmbeddingModel
from ..embed.pooling import finish, pool
from ..errors import EngineError
from ..frontend.engine import Engine
from ..model import Model
from ..repository.routing import RoutingTable
from ..types import DataType, InferenceRequest, Tensor
from . import responses
from .embeddings import EmbeddingRequest, embedding_answer
from .errors import SERVER, OpenAIError, bad_request, from_engine

MIN_BUCKET = 16
TOKENIZE_ON_LOOP_CHARS = 16_384  # more text than this is tokenized on a worker thread


def padded_length(tokens: int, max_tokens: int) -> int:
    """The length an input of `tokens` is padded to: the next power of two from MIN_BUCKET, at most the
    context."""
    bucket = MIN_BUCKET
    while bucket < tokens:
        bucket *= 2
    return min(bucket, max_tokens)


class EmbeddingService:
    """One per server, beside the OpenAI service. `engine`: where batches are submitted (the DataPlane)."""

    def __init__(self, repository: RoutingTable, engine: Engine) -> None:
        self.repository = repository
        self.engine = engine
        self._created: dict[str, int] = {}

    def models(self) -> list[EmbeddingModel]:
        """The embedding models that serve now (the version routing picks for each), by name."""
        out = []
        names = {m.name for m in self.repository.loaded_models() if isinstance(m, EmbeddingModel)}
        for name in sorted(names):
            try:
                model = self.repository.get(name)
            except EngineError:
                continue  # loaded but not ready
            if isinstance(model, EmbeddingModel):
                out.append(model)
        return out

    def model_object(self, model: EmbeddingModel) -> dict[str, Any]:
        """/v1/models' entry, with vLLM's `max_model_len`: the context in tokens."""
        created = self._created.setdefault(model.name, int(time.time()))
        return responses.model_object(model.name, created, model.name, max_model_len=model.folder.max_tokens)

    async def embed(self, request: EmbeddingRequest, request_id: str, owner: str = "") -> dict[str, Any]:
        """The answer to `request`; OpenAIError for what the client must change, or the model's refusals in
        OpenAI's words. `owner`: the request's key owner (InferenceRequest.owner)."""
        model = self._model(request.model)
        folder = model.folder
        dims = request.dimensions
        if dims is not None and not folder.allows(dims):
            allowed = ("any size up to " if folder.any_dimensions else ", ".join(map(str, folder.dimensions))
                       + (" or " if folder.dimensions else "")) + str(folder.hidden_size)
            raise bad_request(f"Model '{request.model}' does not serve dimensions={dims}: "
                              + ("it is not a Matryoshka model; leave 'dimensions' out or ask for "
                                 f"{folder.hidden_size}." if not (folder.any_dimensions or folder.dimensions)
                                 else f"it serves {allowed}."), "dimensions")
        ids = await self._token_ids(request, folder)
        pooled = await self._run(model, folder, ids, request_id, owner)
        vectors = finish(pooled, None if dims == folder.hidden_size else dims, folder.normalize)
        return embedding_answer(request.model, vectors, request.base64, sum(len(i) for i in ids))

    def _model(self, name: str) -> EmbeddingModel:
        try:
            model = self.repository.get(name)
        except EngineError as e:
            raise from_engine(e) from None
        if not isinstance(model, EmbeddingModel):
            raise bad_request(f"Model '{name}' does not serve embeddings (its config has no 'embedding' "
                              "parameter); GET /v1/models lists the models of this server.", "model",
                              "model_not_supported")
        return model

    async def _token_ids(self, request: EmbeddingRequest, folder: EmbeddingFolder) -> list[list[int]]:
        texts = [i for i in request.inputs if isinstance(i, str)]
        if texts:
            # a text's characters bound its tokens from below for every tokenizer we take
            if sum(len(t) for t in texts) > TOKENIZE_ON_LOOP_CHARS:
                encoded = await asyncio.to_thread(folder.tokenizer.encode_batch, texts)
            else:
                encoded = folder.tokenizer.encode_batch(texts)
            ids = [list(e.ids) for e in encoded]
        else:
            vocab = folder.tokenizer.get_vocab_size()
            ids = [list(i) for i in request.inputs if not isinstance(i, str)]
            for n, row in enumerate(ids):
                if max(row) >= vocab:
                    raise bad_request(f"'input[{n}]' has token id {max(row)}, past the model's vocabulary of "
                                      f"{vocab}.", "input")
        for n, row in enumerate(ids):
            if len(row) > folder.max_tokens:
                raise bad_request(f"This model's maximum context length is {folder.max_tokens} tokens. "
                                  f"However, input[{n}] has {len(row)} tokens. Please reduce the length of "
                                  "the input.", "input", "context_length_exceeded")
            if not row:
                raise bad_request(f"'input[{n}]' has no tokens.", "input")
        return ids

    async def _run(self, model: Model, folder: EmbeddingFolder, ids: list[list[int]], request_id: str,
                   owner: str) -> np.ndarray:
        """[inputs, hidden] pooled, in the inputs' order: inputs grouped by padded length, each group sent in
        requests of at most max_batch_size rows, all at once, so the batcher may join them."""
        groups: dict[int, list[int]] = defaultdict(list)
        for n, row in enumerate(ids):
            groups[padded_length(len(row), folder.max_tokens)].append(n)
        chunks = [(length, members[i:i + folder.max_batch_size])
                  for length, members in sorted(groups.items())
                  for i in range(0, len(members), folder.max_batch_size)]
        futures = []
        for k, (length, members) in enumerate(chunks):
            tensors, _ = _batch(folder, [ids[n] for n in members], length)
            submitted = InferenceRequest(model.name, model.version_str, tensors, id=f"{request_id}-{k}",
                                         owner=owner)
            try:
                futures.append(self.engine.submit(submitted))
            except EngineError as e:
                for f in futures:
                    f.cancel()
                raise from_engine(e) from None
        try:
            answers = await asyncio.gather(*futures)
        except EngineError as e:
            raise from_engine(e) from None
        out = np.empty((len(ids), folder.hidden_size), dtype=np.float32)
        for (length, members), answer in zip(chunks, answers, strict=True):
            hidden = next((t.data for t in answer.outputs if t.name == HIDDEN), None)
            if hidden is None or hidden.ndim != 3 or hidden.shape[0] != len(members):
                raise OpenAIError(500, f"The model answered without {HIDDEN} [batch, seq, hidden].", SERVER)
            _, mask = _batch(folder, [ids[n] for n in members], length, masks_only=True)
            out[members] = pool(hidden, mask, folder.pooling)
        return out


def _batch(folder: EmbeddingFolder, rows: list[list[int]], length: int, masks_only: bool = False
           ) -> tuple[list[Tensor], np.ndarray]:
    """The graph's inputs for `rows` padded on the right to `length`, and their attention mask."""
    mask = np.zeros((len(rows), length), dtype=np.int64)
    for i, row in enumerate(rows):
        mask[i, :len(row)] = 1
    if masks_only:
        return [], mask
    input_ids = np.full((len(rows), length), folder.pad_id, dtype=np.int64)
    for i, row in enumerate(rows):
        input_ids[i, :len(row)] = row
    shape = (len(rows), length)
    tensors = [Tensor(IDS, DataType.INT64, shape, input_ids), Tensor(MASK, DataType.INT64, shape, mask)]
    if folder.type_ids:
        tensors.append(Tensor(TYPE_IDS, DataType.INT64, shape, np.zeros(shape, dtype=np.int64)))
    return tensors, mask


__all__ = ["EmbeddingService", "padded_length"]
