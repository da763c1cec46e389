"""The body of /v1/embeddings (engine/openai/embeddings.py): OpenAI's four input forms, the encodings, and
the 400s naming their field; the answer's shape. Pure: no server (the same over HTTP against real models:
tests/functional/openai/test_openai_embeddings.py)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from engine.openai.embedding_service import padded_length
from engine.openai.embeddings import MAX_INPUTS, embedding_answer, parse_embedding
from engine.openai.errors import OpenAIError


@pytest.mark.parametrize("given, inputs", [
    ("hi", ("hi",)),
    (["hi", "there"], ("hi", "there")),
    ([1, 2, 3], ((1, 2, 3),)),
    ([[1, 2], [3]], ((1, 2), (3,))),
])
def test_the_four_input_forms(given: object, inputs: tuple):
    request = parse_embedding({"model": "m", "input": given, "user": "u"})
    assert request.inputs == inputs and not request.base64 and request.dimensions is None


def test_encoding_and_dimensions():
    request = parse_embedding({"model": "m", "input": "x", "encoding_format": "base64", "dimensions": 16})
    assert request.base64 and request.dimensions == 16
    assert not parse_embedding({"model": "m", "input": "x", "encoding_format": "float"}).base64


@pytest.mark.parametrize("doc, param", [
    ({"input": "x"}, "model"),
    ({"model": "", "input": "x"}, "model"),
    ({"model": "m"}, "input"),
    ({"model": "m", "input": ""}, "input"),
    ({"model": "m", "input": []}, "input"),
    ({"model": "m", "input": [[]]}, "input"),
    ({"model": "m", "input": [[1], "x"]}, "input"),
    ({"model": "m", "input": [-1]}, "input"),
    ({"model": "m", "input": [True]}, "input"),
    ({"model": "m", "input": {"text": "x"}}, "input"),
    ({"model": "m", "input": ["x"] * (MAX_INPUTS + 1)}, "input"),
    ({"model": "m", "input": "x", "encoding_format": "binary"}, "encoding_format"),
    ({"model": "m", "input": "x", "dimensions": -3}, "dimensions"),
    ({"model": "m", "input": "x", "dimensions": 1.5}, "dimensions"),
    ({"model": "m", "input": "x", "user": 3}, "user"),
    ({"model": "m", "input": "x", "normalize": True}, "normalize"),
])
def test_refusals_name_the_field(doc: dict, param: str):
    with pytest.raises(OpenAIError) as e:
        parse_embedding(doc)
    assert e.value.status == 400 and e.value.param == param


def test_the_answer_in_both_encodings():
    vectors = np.array([[0.5, -1.25], [2.0, 0.0]], dtype=np.float32)
    floats = embedding_answer("m", vectors, False, 7)
    assert floats == {"object": "list", "model": "m", "usage": {"prompt_tokens": 7, "total_tokens": 7},
                      "data": [{"object": "embedding", "index": 0, "embedding": [0.5, -1.25]},
                               {"object": "embedding", "index": 1, "embedding": [2.0, 0.0]}]}
    packed = embedding_answer("m", vectors, True, 7)["data"][1]["embedding"]
    assert np.frombuffer(base64.b64decode(packed), dtype="<f4").tolist() == [2.0, 0.0]


def test_inputs_pad_to_power_of_two_buckets_within_the_context():
    assert [padded_length(n, 512) for n in (1, 16, 17, 33, 300, 512)] == [16, 16, 32, 64, 512, 512]
    assert [padded_length(n, 40) for n in (3, 20, 33, 40)] == [16, 32, 40, 40]
