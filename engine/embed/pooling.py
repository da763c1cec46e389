"""From an encoder's `last_hidden_state` [batch, seq, hidden] to one vector per row, the way
sentence-transformers' Pooling and Normalize modules make it: mean over the real tokens, the first token
(CLS) or the last real token; then, for `dimensions` (Matryoshka), the first `dimensions` values; then the
L2 normalization when the folder has it. Pure numpy, called on the loop after a batch's answer."""

from __future__ import annotations

import enum

import numpy as np


class Pooling(enum.Enum):
    """sentence-transformers' `pooling_mode_*` flags of 1_Pooling/config.json that we serve."""

    MEAN = "mean_tokens"
    CLS = "cls_token"
    LAST = "lasttoken"


def pool(hidden: np.ndarray, mask: np.ndarray, mode: Pooling) -> np.ndarray:
    """`hidden` [rows, seq, hidden] and `mask` [rows, seq] (1 for a real token, 0 for padding, which is
    always on the right): [rows, hidden] float32."""
    if mode is Pooling.CLS:
        return np.ascontiguousarray(hidden[:, 0, :], dtype=np.float32)
    if mode is Pooling.LAST:
        last = mask.sum(axis=1).astype(np.int64) - 1
        return np.ascontiguousarray(hidden[np.arange(hidden.shape[0]), last, :], dtype=np.float32)
    weights = mask.astype(np.float32)[:, :, None]
    summed = (hidden.astype(np.float32) * weights).sum(axis=1)
    return summed / np.maximum(weights.sum(axis=1), 1e-9)


def finish(vectors: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """Cut each row to its first `dimensions` values (None: all), then L2-normalize them when `normalize`
    (cut first, so a shortened Matryoshka vector is a unit vector too, as OpenAI's and vLLM's are)."""
    if dimensions is not None:
        vectors = vectors[:, :dimensions]
    if normalize:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.maximum(norms, 1e-12)
    return np.ascontiguousarray(vectors, dtype=np.float32)


__all__ = ["Pooling", "finish", "pool"]
