"""Model repositories for the ensemble and classification tests: configs written as Triton users write them,
ONNX models from perf/hubserve_models/examples.py, and the example image pipeline's committed files (its
Python step). Not a test file; test_ensemble.py and test_classification.py build their
repositories with it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx

from hubserve_models import examples

LABELS = ("cat", "dog", "parrot", "fish")
EXAMPLES = Path(__file__).resolve().parents[1] / "model_repository"
IMAGE_PIPELINE = ["image_preprocess", "image_classifier", "image_pipeline"]


def step(model: str, inputs: dict[str, str], outputs: dict[str, str], version: int = -1) -> str:
    """One `ensemble_scheduling.step` in config.pbtxt form."""
    maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: {version}{maps} }}'


def tensors(kind: str, specs: list[tuple[str, str, list[int]]], extra: str = "") -> str:
    items = ", ".join(f'{{ name: "{n}" data_type: {t} dims: {d}{extra if kind == "output" else ""} }}'
                      for n, t, d in specs)
    return f"{kind} [ {items} ]\n"


def ensemble(name: str, inputs: list, outputs: list, steps: list[str], max_batch_size: int = 8,
             output_extra: str = "", max_inflight: int = 0) -> str:
    inflight = f" max_inflight_requests: {max_inflight}" if max_inflight else ""
    return (f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
            + tensors("input", inputs) + tensors("output", outputs, output_extra)
            + f"ensemble_scheduling {{ step [ {', '.join(steps)} ]{inflight} }}\n")


def write_ensemble(root: Path, name: str, config: str, files: dict[str, str] | None = None) -> None:
    """An ensemble folder: its config and an empty version folder `1/`, as Triton requires."""
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    (root / name / "config.pbtxt").write_text(config)
    for filename, text in (files or {}).items():
        (root / name / filename).write_text(text)


def write_onnx(root: Path, name: str, model: onnx.ModelProto, config: str,
               files: dict[str, str] | None = None) -> None:
    examples.write_model(model, root / name / "1" / "model.onnx")
    (root / name / "config.pbtxt").write_text(config)
    for filename, text in (files or {}).items():
        (root / name / filename).write_text(text)


def write_identity(root: Path, name: str, delay_ms: int, extra: str = "") -> None:
    """An identity-backend model FP32 [-1, 4] that sleeps `delay_ms` per execution: a stand-in for compute."""
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    (root / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "identity"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        f'parameters {{ key: "execute_delay_ms" value: {{ string_value: "{delay_ms}" }} }}\n{extra}')


INT16 = [("IN_A", "TYPE_INT32", [16]), ("IN_B", "TYPE_INT32", [16])]
SIMPLE = 'name: "simple"\nbackend: "onnxruntime"\nmax_batch_size: 8\ndynamic_batching { }\n'
SCORES = ('name: "scores"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
          'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
          'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" } ]\n')

# The diamond: step 0 feeds steps 1 and 2, which are independent of each other.
DOUBLES = [("DOUBLE_SUM", "TYPE_INT32", [16]), ("DOUBLE_DIFF", "TYPE_INT32", [16])]
DIAMOND = ensemble("diamond", INT16, DOUBLES, [
    step("simple", {"INPUT0": "IN_A", "INPUT1": "IN_B"}, {"OUTPUT0": "sum", "OUTPUT1": "diff"}),
    step("simple", {"INPUT0": "sum", "INPUT1": "sum"}, {"OUTPUT0": "DOUBLE_SUM"}),
    step("simple", {"INPUT0": "diff", "INPUT1": "diff"}, {"OUTPUT0": "DOUBLE_DIFF"}),
])
FP4 = [("IN", "TYPE_FP32", [4])]
PARALLEL = ensemble("parallel", FP4, [("A", "TYPE_FP32", [4]), ("B", "TYPE_FP32", [4])], [
    step("slow_a", {"INPUT0": "IN"}, {"OUTPUT0": "A"}), step("slow_b", {"INPUT0": "IN"}, {"OUTPUT0": "B"})])
GATED = ensemble("gated", FP4, [("OUT", "TYPE_FP32", [4])],
                 [step("batchy", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})], max_inflight=1)
CLASSIFY = ensemble("classify", FP4, [("PROBS", "TYPE_FP32", [4])],
                    [step("scores", {"INPUT0": "IN"}, {"OUTPUT0": "PROBS"})],
                    output_extra=' label_filename: "l.txt"')

# Each bad ensemble, and the words its load fails with (Triton's, where Triton has them), which the index
# gives as its reason.
BAD = {
    "bad_missing": (ensemble("bad_missing", INT16, [("OUT", "TYPE_INT32", [16])], [
        step("nope", {"INPUT0": "IN_A", "INPUT1": "IN_B"}, {"OUTPUT0": "OUT"})]),
        "ensemble bad_missing contains models that are not available or ambiguous: nope"),
    "bad_dtype": (ensemble("bad_dtype", [("IN_A", "TYPE_FP32", [16]), ("IN_B", "TYPE_INT32", [16])],
                           [("OUT", "TYPE_INT32", [16])],
                           [step("simple", {"INPUT0": "IN_A", "INPUT1": "IN_B"}, {"OUTPUT0": "OUT"})]),
                  "in ensemble bad_dtype, ensemble tensor IN_A: inconsistent data type: TYPE_FP32 is "
                  "inferred from model bad_dtype while TYPE_INT32 is inferred from model simple"),
    "bad_shape": (ensemble("bad_shape", [("IN_A", "TYPE_INT32", [8]), ("IN_B", "TYPE_INT32", [16])],
                           [("OUT", "TYPE_INT32", [16])],
                           [step("simple", {"INPUT0": "IN_A", "INPUT1": "IN_B"}, {"OUTPUT0": "OUT"})]),
                  "inconsistent shape: [-1,8] is inferred from model bad_shape while [-1,16] is inferred "
                  "from model simple"),
    "bad_unmapped": (ensemble("bad_unmapped", [("IN_A", "TYPE_INT32", [16])], [("OUT", "TYPE_INT32", [16])],
                              [step("simple", {"INPUT0": "IN_A"}, {"OUTPUT0": "OUT"})]),
                     "in ensemble bad_unmapped, input INPUT1 in model simple is not mapped to any ensemble "
                     "tensors"),
    "bad_batch": (ensemble("bad_batch", INT16, [("OUT", "TYPE_INT32", [16])],
                           [step("simple", {"INPUT0": "IN_A", "INPUT1": "IN_B"}, {"OUTPUT0": "OUT"})],
                           max_batch_size=16),
                  "ensemble bad_batch allows maximum batch size 16, but it contains model simple which only "
                  "allows maximum batch size to be 8"),
    "bad_cycle": (ensemble("bad_cycle", INT16, [("OUT", "TYPE_INT32", [16])], [
        step("simple", {"INPUT0": "IN_A", "INPUT1": "loop"}, {"OUTPUT0": "t1", "OUTPUT1": "OUT"}),
        step("simple", {"INPUT0": "t1", "INPUT1": "IN_B"}, {"OUTPUT0": "loop"})]),
        "output 'OUT' for ensemble 'bad_cycle' is not written: its steps form a cycle"),
    "bad_double": (ensemble("bad_double", INT16, [("OUT", "TYPE_INT32", [16])], [
        step("simple", {"INPUT0": "IN_A", "INPUT1": "IN_B"}, {"OUTPUT0": "OUT"}),
        step("simple", {"INPUT0": "IN_B", "INPUT1": "IN_A"}, {"OUTPUT0": "OUT"})]),
        "ensemble tensor 'OUT' can appear in an output map only once for ensemble 'bad_double' step 1"),
    "bad_self": (ensemble("bad_self", INT16, [("OUT", "TYPE_INT32", [16])], [
        step("bad_self", {"IN_A": "IN_A", "IN_B": "IN_B"}, {"OUT": "OUT"})]),
        "circular dependency between ensembles: bad_self -> ... -> bad_self -> bad_self"),
}


def build(root: Path) -> Path:
    """Every model the ensemble tests use; nothing is loaded until a test asks (explicit mode)."""
    write_onnx(root, "simple", examples.simple_model(), SIMPLE)
    write_onnx(root, "scores", examples.identity_model("FP32", (-1, 4)), SCORES,
               {"labels.txt": "\n".join(LABELS) + "\n"})
    write_identity(root, "slow_a", 300)
    write_identity(root, "slow_b", 300)
    write_identity(root, "batchy", 40, "dynamic_batching { max_queue_delay_microseconds: 200000 }\n")
    write_ensemble(root, "diamond", DIAMOND)
    write_ensemble(root, "parallel", PARALLEL)
    write_ensemble(root, "gated", GATED)
    write_ensemble(root, "classify", CLASSIFY, {"l.txt": "zero\none\ntwo\nthree\n"})
    for name, (config, _) in BAD.items():
        write_ensemble(root, name, config)
    # The example repository's image pipeline, its committed files as they are (image_preprocess's
    # 1/model.py among them), and the classifier's ONNX model built.
    for name in IMAGE_PIPELINE:
        shutil.copytree(EXAMPLES / name, root / name,
                        ignore=shutil.ignore_patterns("model.onnx", "__pycache__"))
    examples.build_repository(root, ["image_classifier", "image_pipeline"])
    return root
