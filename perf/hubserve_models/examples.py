"""Deterministic builders for the example and test ONNX models.

The example repository (`model_repository/`) and the test suite build their own small models from code
instead of committing binaries or downloading anything: the files are reproducible byte for byte, cheap to
rebuild, and their exact contents (names, shapes, weights) are documented right here. Only the config files
are committed; `python -m hubserve_models.examples model_repository` (run by `make models`) writes every
`<root>/<name>/1/model.onnx`, and rewrites none that is already identical.

This module needs the `onnx` package (the `examples` / `test` extras). Only tools and tests import it, so the
import sits at the top; the server itself never imports this module and serves without `onnx` installed.

Every model uses opset 17 with IR version 8 (onnx_build.py says why). The pipelines' models live in
pipelines.py; their Python steps (image_preprocess, text_tokenizer, text_postprocess) are committed model.py
files, which need no building.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .onnx_build import IR_VERSION as IR_VERSION
from .onnx_build import ONNX_TYPES as ONNX_TYPES
from .onnx_build import OPSET as OPSET
from .onnx_build import PRODUCER as PRODUCER
from .onnx_build import STRINGS_LOCALE as STRINGS_LOCALE
from .onnx_build import finish as _model
from .onnx_build import tensor as _tensor
from .pipelines import COLOURS as COLOURS
from .pipelines import IMAGE_MEAN as IMAGE_MEAN
from .pipelines import IMAGE_SIDE as IMAGE_SIDE
from .pipelines import IMAGE_STD as IMAGE_STD
from .pipelines import TEXT_LABELS as TEXT_LABELS
from .pipelines import TEXT_LENGTH as TEXT_LENGTH
from .pipelines import TEXT_VOCAB as TEXT_VOCAB
from .pipelines import image_classifier_model, text_classifier_model
from .pipelines import text_classifier_weights as text_classifier_weights
from .tiny_decoder import CHAT_TEMPLATE, tiny_decoder_model

# --------------------------------------------------------------------------------------------- models

def simple_model() -> onnx.ModelProto:
    """Triton's classic `simple`: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, INT32 [batch, 16]."""
    dims = (-1, 16)
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"], name="add"),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"], name="sub"),
        ],
        "simple",
        [_tensor("INPUT0", TensorProto.INT32, dims), _tensor("INPUT1", TensorProto.INT32, dims)],
        [_tensor("OUTPUT0", TensorProto.INT32, dims), _tensor("OUTPUT1", TensorProto.INT32, dims)],
    )
    return _model(graph)


def simple_string_model() -> onnx.ModelProto:
    """Triton's `simple_string`: `simple` over BYTES [batch, 16] holding decimal integers ("3" + "1" = "4").

    Each input is Cast to INT32, added and subtracted, and the results Cast back to their decimal strings, so
    Triton's string example clients get the numbers they check. An element that is not a decimal integer
    fails the request in onnxruntime's Cast.
    """
    dims = (-1, 16)
    to_int, to_str = TensorProto.INT32, TensorProto.STRING
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["INPUT0"], ["in0"], name="parse0", to=to_int),
            helper.make_node("Cast", ["INPUT1"], ["in1"], name="parse1", to=to_int),
            helper.make_node("Add", ["in0", "in1"], ["sum"], name="add"),
            helper.make_node("Sub", ["in0", "in1"], ["diff"], name="sub"),
            helper.make_node("Cast", ["sum"], ["OUTPUT0"], name="format0", to=to_str),
            helper.make_node("Cast", ["diff"], ["OUTPUT1"], name="format1", to=to_str),
        ],
        "simple_string",
        [_tensor("INPUT0", to_str, dims), _tensor("INPUT1", to_str, dims)],
        [_tensor("OUTPUT0", to_str, dims), _tensor("OUTPUT1", to_str, dims)],
    )
    return _model(graph)


def mlp_weights(in_features: int, hidden: Sequence[int], out_features: int,
                seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (weight [fan_in, fan_out], bias [fan_out]) of each layer, FP32, from `default_rng(seed)`.

    Weights are standard normal scaled by 1/sqrt(fan_in) and biases are small, so activations keep roughly
    unit scale through any depth and outputs stay finite.
    """
    rng = np.random.default_rng(seed)
    sizes = [in_features, *hidden, out_features]
    layers = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        scale = np.float32(1.0 / math.sqrt(fan_in))
        weight = rng.standard_normal((fan_in, fan_out), dtype=np.float32) * scale
        bias = rng.standard_normal(fan_out, dtype=np.float32) * np.float32(0.1)
        layers.append((weight.astype(np.float32), bias.astype(np.float32)))
    return layers


def mlp_model(in_features: int = 256, hidden: Sequence[int] = (1024,), out_features: int = 256,
              seed: int = 0) -> onnx.ModelProto:
    """FP32 INPUT0 [batch, in_features] -> (Gemm + Relu) per hidden layer -> Gemm -> OUTPUT0 [batch, out]."""
    for n in (in_features, *hidden, out_features):
        if n <= 0:
            raise ValueError(f"layer sizes must be positive, got {n}")
    layers = mlp_weights(in_features, hidden, out_features, seed)
    nodes, initializers = [], []
    current = "INPUT0"
    for i, (weight, bias) in enumerate(layers):
        last = i == len(layers) - 1
        w_name, b_name = f"layer{i}.weight", f"layer{i}.bias"
        initializers += [numpy_helper.from_array(weight, w_name), numpy_helper.from_array(bias, b_name)]
        gemm_out = "OUTPUT0" if last else f"layer{i}.gemm"
        nodes.append(helper.make_node("Gemm", [current, w_name, b_name], [gemm_out], name=f"layer{i}.gemm"))
        if not last:
            current = f"layer{i}.relu"
            nodes.append(helper.make_node("Relu", [gemm_out], [current], name=f"layer{i}.relu"))
    graph = helper.make_graph(
        nodes,
        "mlp",
        [_tensor("INPUT0", TensorProto.FLOAT, (-1, in_features))],
        [_tensor("OUTPUT0", TensorProto.FLOAT, (-1, out_features))],
        initializer=initializers,
    )
    return _model(graph)


def strings_model() -> onnx.ModelProto:
    """BYTES: TEXT [batch] (1-D string tensor) -> UPPER (upper-cased) and ECHO (unchanged).

    UPPER maps each code point on its own (`towupper`): "café" -> "CAFÉ", but "ß" stays "ß". onnxruntime
    rejects an empty batch (TEXT of shape [0]) for StringNormalizer.
    """
    graph = helper.make_graph(
        [
            helper.make_node("StringNormalizer", ["TEXT"], ["UPPER"], name="upper",
                             case_change_action="UPPER", locale=STRINGS_LOCALE),
            helper.make_node("Identity", ["TEXT"], ["ECHO"], name="echo"),
        ],
        "strings",
        [_tensor("TEXT", TensorProto.STRING, (-1,))],
        [_tensor("UPPER", TensorProto.STRING, (-1,)), _tensor("ECHO", TensorProto.STRING, (-1,))],
    )
    return _model(graph)


def identity_model(datatype: str, dims: Sequence[int] = (-1, 4)) -> onnx.ModelProto:
    """OUTPUT0 = Identity(INPUT0) for a protocol datatype name ("FP32", "BYTES", ...); -1 dims are dynamic."""
    elem_type = ONNX_TYPES.get(datatype)
    if elem_type is None:
        raise ValueError(f"unknown datatype {datatype!r}; expected one of {', '.join(ONNX_TYPES)}")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"], name="identity")],
        f"identity_{datatype.lower()}",
        [_tensor("INPUT0", elem_type, dims)],
        [_tensor("OUTPUT0", elem_type, dims)],
    )
    return _model(graph)


def image_model() -> onnx.ModelProto:
    """FP32 INPUT0 [batch, 3, 224, 224] -> per-channel mean -> OUTPUT0 [batch, 3]: heavy I/O, light math."""
    graph = helper.make_graph(
        # Opset 17's ReduceMean takes `axes` as an attribute (it became an input in opset 18).
        [helper.make_node("ReduceMean", ["INPUT0"], ["OUTPUT0"], name="mean", axes=[2, 3], keepdims=0)],
        "image",
        [_tensor("INPUT0", TensorProto.FLOAT, (-1, 3, 224, 224))],
        [_tensor("OUTPUT0", TensorProto.FLOAT, (-1, 3))],
    )
    return _model(graph)


# --------------------------------------------------------------------------------------------- writing

def model_bytes(model: onnx.ModelProto) -> bytes:
    """The file contents for a model: deterministic serialization, so the same model gives the same bytes."""
    return model.SerializeToString(deterministic=True)


def _write_bytes(data: bytes, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)  # a server polling the repository never sees a half-written file
    finally:
        tmp.unlink(missing_ok=True)


def accumulator_model() -> onnx.ModelProto:
    """A stateful accumulator for the sequence batcher's implicit state, INT32 [batch, 1]:
    ACC_OUT = INPUT + ACC_IN * (1 - START), OUTPUT = ACC_OUT. The server feeds START (a control input) and
    ACC_IN (the sequence's state: the last ACC_OUT); no If or Loop, so START resets by arithmetic."""
    dims = (-1, 1)
    graph = helper.make_graph(
        [
            helper.make_node("Sub", ["ONE", "START"], ["KEEP"], name="keep"),
            helper.make_node("Mul", ["ACC_IN", "KEEP"], ["CARRIED"], name="carry"),
            helper.make_node("Add", ["INPUT", "CARRIED"], ["ACC_OUT"], name="accumulate"),
            helper.make_node("Identity", ["ACC_OUT"], ["OUTPUT"], name="output"),
        ],
        "sequence_accumulator",
        [_tensor(n, TensorProto.INT32, dims) for n in ("INPUT", "START", "ACC_IN")],
        [_tensor(n, TensorProto.INT32, dims) for n in ("OUTPUT", "ACC_OUT")],
        [numpy_helper.from_array(np.ones((1, 1), dtype=np.int32), "ONE")],
    )
    return _model(graph)


def simple_sequence_model() -> onnx.ModelProto:
    """What Triton's sequence example clients (`simple_*_sequence_*_client.py`) expect of their
    `simple_sequence`, INT32 [batch, 1]: OUTPUT = INPUT + START (the START control input, 1 on a sequence's
    first request), so [0, 11, 7] answers [1, 11, 7]."""
    dims = (-1, 1)
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT", "START"], ["OUTPUT"], name="add_start")],
        "simple_sequence",
        [_tensor("INPUT", TensorProto.INT32, dims), _tensor("START", TensorProto.INT32, dims)],
        [_tensor("OUTPUT", TensorProto.INT32, dims)],
    )
    return _model(graph)


def simple_dyna_sequence_model() -> onnx.ModelProto:
    """What Triton's sequence example clients expect of `simple_dyna_sequence` (their `--dyna` option), INT32
    [batch, 1]: OUTPUT = INPUT + START + END * CORRID, from the START, END, READY and CORRID (UINT64) control
    inputs, so a sequence's last answer carries its correlation ID. READY is taken and unused."""
    dims = (-1, 1)
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["CORRID"], ["CORRID32"], to=TensorProto.INT32, name="corrid_int32"),
            helper.make_node("Mul", ["END", "CORRID32"], ["ENDED"], name="end_corrid"),
            helper.make_node("Add", ["INPUT", "START"], ["STARTED"], name="add_start"),
            helper.make_node("Add", ["STARTED", "ENDED"], ["OUTPUT"], name="add_end"),
            helper.make_node("Identity", ["READY"], ["READY_SEEN"], name="ready"),
        ],
        "simple_dyna_sequence",
        [_tensor(n, TensorProto.INT32, dims) for n in ("INPUT", "START", "END", "READY")]
        + [_tensor("CORRID", TensorProto.UINT64, dims)],
        [_tensor("OUTPUT", TensorProto.INT32, dims), _tensor("READY_SEEN", TensorProto.INT32, dims)],
    )
    return _model(graph)


def write_model(model: onnx.ModelProto, path: Path | str) -> None:
    """Save `model` at `path`, creating parent folders. The same model always gives the same bytes."""
    _write_bytes(model_bytes(model), Path(path))


# The example repository: model name -> builder. Order is the order they are built and reported.
EXAMPLES: dict[str, Callable[[], onnx.ModelProto]] = {
    "simple": simple_model,
    "mlp": mlp_model,
    "mlp_large": lambda: mlp_model(1024, (4096, 4096), 1024),  # compute-bound: ~25M parameters, ~100 MB
    "strings": strings_model,
    "image": image_model,
    # Triton's own example models of these names (its string example clients use both). Triton serves
    # simple_identity with its Python backend; here it is the same BYTES identity as an ONNX model.
    "simple_string": simple_string_model,
    "simple_identity": lambda: identity_model("BYTES", (-1, -1)),
    # The pipelines' ONNX steps; their Python steps (image_preprocess, text_tokenizer, text_postprocess)
    # are committed model.py files.
    "image_classifier": image_classifier_model,
    # Stateful models for the sequence batcher: an accumulator with implicit state, and the models Triton's
    # sequence example clients expect under the names simple_sequence and (with --dyna)
    # simple_dyna_sequence; their simple_string_dyna_sequence is a committed Python model.
    "sequence_accumulator": accumulator_model,
    "simple_sequence": simple_sequence_model,
    "simple_dyna_sequence": simple_dyna_sequence_model,
    # A generative model for the generation engine (engine/generate/): 2 layers, ~0.7 MB.
    "tiny_decoder": tiny_decoder_model,
    "text_classifier": text_classifier_model,
}
# Files an example's folder holds beside its config and model, as its exporter writes them (name -> file ->
# text): the decoder's chat template.
EXAMPLE_FILES: dict[str, dict[str, str]] = {"tiny_decoder": {"chat_template.jinja": CHAT_TEMPLATE}}
# Example ensembles: no model file, only the (empty) version folder build_repository creates.
EXAMPLE_ENSEMBLES = ("image_pipeline", "text_pipeline")
VERSION = "1"


class Built(NamedTuple):
    name: str
    path: Path
    written: bool  # False when the file already held exactly these bytes


def build_repository(root: Path | str, models: Iterable[str] | None = None) -> list[Built]:
    """Write `<root>/<name>/1/model.onnx` for the example models (all, or those named in `models`).

    Only model files (and EXAMPLE_FILES) are written; config files are committed beside them. A file that
    already holds the same bytes is left alone, so rebuilding is cheap and does not touch mtimes a polling
    server would notice.
    """
    root = Path(root)
    names = list(EXAMPLES) + list(EXAMPLE_ENSEMBLES) if models is None else list(dict.fromkeys(models))
    unknown = [n for n in names if n not in EXAMPLES and n not in EXAMPLE_ENSEMBLES]
    if unknown:
        raise ValueError(f"unknown example model(s) {', '.join(unknown)}; choose from "
                         f"{', '.join([*EXAMPLES, *EXAMPLE_ENSEMBLES])}")
    built = []
    for name in names:
        if name in EXAMPLE_ENSEMBLES:
            (root / name / VERSION).mkdir(parents=True, exist_ok=True)  # Triton wants the empty folder
            continue
        for file, text in EXAMPLE_FILES.get(name, {}).items():
            _write_if_changed(text.encode(), root / name / file)
        path = root / name / VERSION / "model.onnx"
        written = _write_if_changed(model_bytes(EXAMPLES[name]()), path)
        built.append(Built(name, path, written))
    return built


def _write_if_changed(data: bytes, path: Path) -> bool:
    try:
        same = path.stat().st_size == len(data) and path.read_bytes() == data
    except FileNotFoundError:
        same = False
    if not same:
        _write_bytes(data, path)
    return not same


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hubserve_models.examples",
        description="Build the example ONNX models into a Triton-layout model repository.",
    )
    parser.add_argument("root", type=Path, help="the model repository folder, e.g. model_repository")
    parser.add_argument("--models", default=None,
                        help=f"comma-separated subset of: {', '.join(EXAMPLES)} (default: all)")
    args = parser.parse_args(argv)
    models = None if args.models is None else [m.strip() for m in args.models.split(",") if m.strip()]
    try:
        built = build_repository(args.root, models)
    except ValueError as e:
        parser.error(str(e))
    for item in built:
        state = "wrote" if item.written else "up to date"
        print(f"{item.name}: {state} {item.path} ({item.path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
