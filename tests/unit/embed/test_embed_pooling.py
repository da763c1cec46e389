"""engine/embed/pooling.py: sentence-transformers' pooling modes over padded rows, the Matryoshka cut before
the normalization. Pure numpy."""

from __future__ import annotations

import numpy as np

from engine.embed.pooling import Pooling, finish, pool


def padded() -> tuple[np.ndarray, np.ndarray]:
    """Two rows of 3 and 1 real tokens, padded to 4 with garbage that no mode may read."""
    rng = np.random.default_rng(0)
    hidden = rng.standard_normal((2, 4, 5)).astype(np.float32)
    hidden[0, 3] = hidden[1, 1:] = 1e6
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0]])
    return hidden, mask


def test_mean_reads_real_tokens_only():
    hidden, mask = padded()
    got = pool(hidden, mask, Pooling.MEAN)
    np.testing.assert_allclose(got[0], hidden[0, :3].mean(0), rtol=1e-6)
    np.testing.assert_allclose(got[1], hidden[1, 0], rtol=1e-6)


def test_cls_is_the_first_token_and_lasttoken_the_last_real_one():
    hidden, mask = padded()
    np.testing.assert_array_equal(pool(hidden, mask, Pooling.CLS), hidden[:, 0])
    np.testing.assert_array_equal(pool(hidden, mask, Pooling.LAST), np.stack([hidden[0, 2], hidden[1, 0]]))


def test_dimensions_cut_before_the_normalization():
    vectors = np.array([[3.0, 4.0, 12.0]], dtype=np.float32)
    np.testing.assert_allclose(finish(vectors, 2, True), [[0.6, 0.8]], rtol=1e-6)
    np.testing.assert_allclose(finish(vectors, None, True), [[3 / 13, 4 / 13, 12 / 13]], rtol=1e-6)
    np.testing.assert_array_equal(finish(vectors, 2, False), [[3.0, 4.0]])
    assert finish(vectors, None, False).dtype == np.float32
