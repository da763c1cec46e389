"""Building the load tester's requests from model metadata: generated data, --shape, -b, and
perf_analyzer's JSON data files."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from hubserve_perf.inputs import build_requests, parse_shape
from hubserve_perf.types import ModelInfo, PerfError, TensorSpec

SIMPLE = ModelInfo("simple", "", (TensorSpec("INPUT0", "INT32", (-1, 16)),
                                  TensorSpec("INPUT1", "INT32", (-1, 16))),
                   (TensorSpec("OUTPUT0", "INT32", (-1, 16)),), 8, {})
DYNAMIC = ModelInfo("dyn", "", (TensorSpec("X", "FP32", (-1, -1, 3)), TensorSpec("S", "BYTES", (-1, 2))),
                    (), 4, {})
FIXED = ModelInfo("fixed", "", (TensorSpec("X", "FP16", (2, 2)),), (), 0, {})


def test_zero_and_random_have_the_batched_shape() -> None:
    (zero,) = build_requests(SIMPLE, 3, "zero", {})
    assert [t.shape for t in zero] == [(3, 16), (3, 16)]
    assert zero[0].data == bytes(3 * 16 * 4)
    (rand,) = build_requests(SIMPLE, 1, "random", {})
    assert len(rand[1].data) == 64 and rand[1].data != bytes(64)
    assert build_requests(SIMPLE, 1, "random", {}) == [rand]  # seeded: runs repeat


def test_variable_dims_need_a_shape() -> None:
    with pytest.raises(PerfError, match="--shape X:N,3"):
        build_requests(DYNAMIC, 1, "zero", {})
    (req,) = build_requests(DYNAMIC, 2, "random", {"X": (5, 3)})
    x, s = req
    assert x.shape == (2, 5, 3) and len(x.data) == 2 * 5 * 3 * 4
    assert s.shape == (2, 2)
    length = struct.unpack_from("<I", s.data)[0]
    assert length == 128  # four length-prefixed random strings
    with pytest.raises(PerfError, match="does not fit"):
        build_requests(DYNAMIC, 1, "zero", {"X": (5, 4)})


def test_batch_size_limits() -> None:
    with pytest.raises(PerfError, match="max_batch_size 8"):
        build_requests(SIMPLE, 9, "zero", {})
    with pytest.raises(PerfError, match="does not batch"):
        build_requests(FIXED, 2, "zero", {})
    (req,) = build_requests(FIXED, 1, "zero", {})
    assert req[0].shape == (2, 2)


def test_parse_shape() -> None:
    assert parse_shape("INPUT0:3,224,224") == ("INPUT0", (3, 224, 224))
    for bad in ("INPUT0", "INPUT0:3,x", ":3", "A:-1"):
        with pytest.raises(PerfError):
            parse_shape(bad)


def test_json_data_file(tmp_path: Path) -> None:
    data = tmp_path / "data.json"
    raw = np.arange(16, dtype="<i4").tobytes()
    data.write_text(json.dumps({"data": [
        {"INPUT0": list(range(16)), "INPUT1": {"content": [[1] * 8, [2] * 8], "shape": [16]}},
        {"INPUT0": {"b64": base64.b64encode(raw).decode()}, "INPUT1": [0] * 16},
    ]}))
    first, second = build_requests(SIMPLE, 2, str(data), {})
    assert first[0].data == raw * 2  # repeated along the batch dim
    assert first[0].shape == (2, 16)
    assert np.frombuffer(first[1].data, "<i4")[:16].tolist() == [1] * 8 + [2] * 8
    assert second[0].data == raw * 2


def test_json_data_file_errors(tmp_path: Path) -> None:
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"data": [{"INPUT0": [1] * 16}]}))
    with pytest.raises(PerfError, match="lacks input"):
        build_requests(SIMPLE, 1, str(data), {})
    data.write_text(json.dumps({"data": [{"INPUT0": [1] * 15, "INPUT1": [1] * 16}]}))
    with pytest.raises(PerfError, match="has 15 elements"):
        build_requests(SIMPLE, 1, str(data), {})
    with pytest.raises(PerfError, match="no such file"):
        build_requests(SIMPLE, 1, str(tmp_path / "missing.json"), {})
