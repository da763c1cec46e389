"""Warm-up samples from `model_warmup` (engine/instances/warmup.py), and a version's start with warm-up
(identity backend)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import numpy as np
import pytest

from engine.config import steps as cfg
from engine.config.model_config import ModelConfig
from engine.errors import EngineError, ErrorCode
from engine.instances.rate_limiter import RateLimiter
from engine.instances.warmup import build_samples
from engine.model import InstanceModel
from engine.proto import model_config_pb2 as pb

IO = ('input { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] }\n'
      'input { name: "TEXT" data_type: TYPE_STRING dims: [ 2 ] optional: true }\n'
      'output { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] }\n'
      'output { name: "ECHO" data_type: TYPE_STRING dims: [ 2 ] }\n')
ONE_INPUT = IO.splitlines()[0] + "\n" + IO.splitlines()[2] + "\n"


def config(warmup: str, max_batch_size: int = 8, params: str = "", io: str = IO) -> ModelConfig:
    msg = pb.ModelConfig()
    cfg.parse_pbtxt(f'backend: "identity"\nmax_batch_size: {max_batch_size}\n{io}{params}{warmup}', msg)
    cfg.autocomplete(msg, None, "warm")
    return cfg.validate(msg, "warm/config.pbtxt")


def sample(inputs: str, batch_size: int = 0, count: int = 0, name: str = "s") -> str:
    return f'model_warmup {{ name: "{name}" batch_size: {batch_size} count: {count} {inputs} }}\n'


ZEROS = 'inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 4 ] zero_data: true } }'


def test_zero_and_random_data_with_batch_and_count():
    text = sample(ZEROS, batch_size=3, count=2, name="zeros") + sample(
        'inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 4 ] random_data: true } } '
        'inputs { key: "TEXT" value: { data_type: TYPE_STRING dims: [ 2 ] random_data: true } }',
        name="random")
    zeros, random = build_samples(config(text), Path("unused"))
    assert (zeros.name, zeros.count, list(zeros.inputs)) == ("zeros", 2, ["INPUT0"])
    assert zeros.inputs["INPUT0"].shape == (3, 4) and not zeros.inputs["INPUT0"].any()
    assert random.count == 1  # count 0 means once
    assert random.inputs["INPUT0"].shape == (1, 4) and random.inputs["INPUT0"].dtype == np.int32
    texts = random.inputs["TEXT"]
    assert texts.shape == (1, 2) and all(isinstance(x, bytes) for x in texts.flat)


def test_input_data_file_is_read_from_the_warmup_folder(tmp_path: Path):
    (tmp_path / "warmup").mkdir()
    np.arange(8, dtype=np.int32).tofile(tmp_path / "warmup" / "ints")
    strings = b"".join(len(s).to_bytes(4, "little") + s for s in (b"ab", b"", b"xyz", b"q"))
    (tmp_path / "warmup" / "text").write_bytes(strings)
    text = sample('inputs { key: "INPUT0" value: '
                  '{ data_type: TYPE_INT32 dims: [ 4 ] input_data_file: "ints" } } '
                  'inputs { key: "TEXT" value: '
                  '{ data_type: TYPE_STRING dims: [ 2 ] input_data_file: "text" } }',
                  batch_size=2)
    (only,) = build_samples(config(text), tmp_path)
    np.testing.assert_array_equal(only.inputs["INPUT0"], np.arange(8, dtype=np.int32).reshape(2, 4))
    assert only.inputs["TEXT"].tolist() == [[b"ab", b""], [b"xyz", b"q"]]


@pytest.mark.parametrize("text, max_batch_size, message", [
    (sample(ZEROS, batch_size=9), 8, "batch_size 9 exceeds max_batch_size 8"),
    (sample(ZEROS, batch_size=2), 0, "must be 1 for a model that"),
    (sample(ZEROS.replace('"INPUT0"', '"NOPE"')), 8, "'NOPE' is not an input"),
    (sample(ZEROS.replace("TYPE_INT32", "TYPE_FP32")), 8, "FP32 here but INT32"),
    (sample(ZEROS.replace("[ 4 ]", "[ -1 ]")), 8, "must be fixed"),
    (sample('inputs { key: "TEXT" value: { data_type: TYPE_STRING dims: [ 2 ] zero_data: true } }'), 8,
     "no data for input 'INPUT0'"),
    (sample(ZEROS.replace("zero_data: true", 'input_data_file: "missing"')), 8,
     "cannot read input_data_file warmup/missing"),
    (sample(ZEROS.replace("zero_data: true", 'input_data_file: "../../outside"')), 8,
     "input_data_file must name a file in the model's warmup/ folder"),
    (sample(ZEROS.replace("zero_data: true", 'input_data_file: "/etc/hostname"')), 8,
     "input_data_file must name a file in the model's warmup/ folder"),
])
def test_mistakes_name_the_sample_and_the_input(tmp_path: Path, text: str, max_batch_size: int, message: str):
    (tmp_path / "outside").write_bytes(b"\0" * 16)  # a readable file beside the model folder
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    with pytest.raises(EngineError) as e:
        build_samples(config(text, max_batch_size), model_dir)
    assert e.value.code is ErrorCode.INVALID_ARG
    assert "warm-up 's'" in e.value.message and message in e.value.message, e.value.message
    assert str(tmp_path) not in e.value.message  # messages reach clients: never the server's paths


def test_short_data_file_is_rejected(tmp_path: Path):
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "ints").write_bytes(b"\0" * 12)
    text = sample(ZEROS.replace("zero_data: true", 'input_data_file: "ints"'))
    with pytest.raises(EngineError, match="holds 12 bytes, shape \\[1, 4\\] of INT32 needs 16"):
        build_samples(config(text), tmp_path)


def start(model_config: ModelConfig) -> InstanceModel:
    async def go() -> InstanceModel:
        model = InstanceModel(model_config, 1, Path("unused/1/model.txt"), (), RateLimiter())
        await model.start()
        await model.stop()
        return model

    return asyncio.run(go())


def test_a_version_warms_up_when_it_starts_and_warm_up_is_not_counted(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="hubserve.warmup")
    model = start(config(sample(ZEROS, batch_size=2, count=3, name="zeros"), io=ONE_INPUT))
    assert "model warm version 1 warm-up 'zeros': 3 run(s) on 1 instance(s)" in caplog.text
    assert model.stats.execution_count == 0 and model.stats.inference_count == 0  # as in Triton


def test_a_failing_warm_up_fails_the_start_with_the_reason():
    fails_on_zero = 'parameters { key: "fail_on_value" value: { string_value: "0" } }\n'
    with pytest.raises(EngineError) as e:
        start(config(sample(ZEROS, name="zeros"), params=fails_on_zero, io=ONE_INPUT))
    assert e.value.code is ErrorCode.UNAVAILABLE
    assert e.value.message == "warm-up 'zeros' failed: identity backend: input contains 0"

