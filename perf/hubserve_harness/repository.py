"""The model repositories the tests and benchmarks serve: the test repository (the example models with their
committed configs, plus test-only models: an identity model per datatype, and one that never loads), and the
ensemble benchmarks' pipeline (perf/bench_ensemble.py, perf/bench_pipelines.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from .checkout import EXAMPLES


def build_test_repository(root: Path) -> Path:
    """The example models with their committed configs, plus test-only models."""
    from hubserve_models import examples

    for name in ("simple", "mlp", "strings"):
        src = EXAMPLES / name
        dst = root / name
        dst.mkdir(parents=True, exist_ok=True)
        for cfg in src.glob("config.*"):
            shutil.copy(cfg, dst / cfg.name)
    examples.build_repository(root, ["simple", "mlp", "strings"])
    for datatype in ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                     "FP16", "FP32", "FP64", "BYTES"):
        examples.write_model(examples.identity_model(datatype, (-1, 4)),
                             root / f"identity_{datatype.lower()}" / "1" / "model.onnx")
    # A model that never loads: the rest must serve regardless.
    broken = root / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.onnx").write_bytes(b"this is not an ONNX file")
    return root


# The ensemble benchmarks' repository: `prep`, a cheap ONNX step (Identity on FP32 [1024], dynamic batching),
# `mlp_large` (the example repository's compute-bound MLP, its config as committed) and `pipeline`, the
# ensemble prep -> mlp_large.
PIPELINE_PREP = ('name: "prep"\nbackend: "onnxruntime"\nmax_batch_size: 64\n'
                 'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1024 ] } ]\n'
                 'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1024 ] } ]\n'
                 "dynamic_batching { max_queue_delay_microseconds: 2000 }\n")
PIPELINE = """name: "pipeline"
platform: "ensemble"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1024 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1024 ] } ]
ensemble_scheduling {
  step [
    { model_name: "prep" model_version: -1
      input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "prepared" } },
    { model_name: "mlp_large" model_version: -1
      input_map { key: "INPUT0" value: "prepared" } output_map { key: "OUTPUT0" value: "OUTPUT0" } }
  ]
}
"""


def build_pipeline_repository(root: Path) -> Path:
    """`prep`, `mlp_large` and the ensemble `pipeline` of the two, in `root`."""
    from hubserve_models import examples

    examples.write_model(examples.identity_model("FP32", (-1, 1024)), root / "prep" / "1" / "model.onnx")
    (root / "prep" / "config.pbtxt").write_text(PIPELINE_PREP)
    examples.build_repository(root, ["mlp_large"])
    (root / "mlp_large" / "config.pbtxt").write_bytes((EXAMPLES / "mlp_large" / "config.pbtxt").read_bytes())
    (root / "pipeline" / "1").mkdir(parents=True)
    (root / "pipeline" / "config.pbtxt").write_text(PIPELINE)
    return root
