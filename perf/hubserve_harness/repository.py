"""The model repository the tests serve: the example models with their committed configs, plus test-only
models (an identity model per datatype, and one that never loads)."""

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
