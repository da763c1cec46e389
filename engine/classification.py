"""The classification extension: a requested output with a class count is answered as its top-k classes.

A client asks with the output parameter `classification` (HTTP `parameters.classification`, gRPC
`parameters["classification"]`, what tritonclient's `class_count` sends). The answer is a BYTES tensor of
`[batch, k]` (`[k]` for a model that does not batch) whose entries are "score:index:label", highest score
first, as Triton writes them (server src/classification.cc): the score as C's `%f` for floating types (six
decimals) and as a plain integer for integer types, the index in the flattened non-batch dims, and the label
from line `index` of the output's `label_filename` in the model folder; without a label the entry is
"score:index". A count above the number of classes returns them all. Equal scores keep index order; NaN
ranks last.

`Model.prepare` checks the requests (`check`), `start()` reads the label files (`read_labels`), and the
request's completion replaces the raw output by its classes (`classifying`) before the frontend answers, so
both protocols, the ensemble driver and any in-process caller get the same tensor.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from .config.model_config import ModelConfig, TensorSpec
from .errors import invalid
from .types import Completion, DataType, InferenceResponse, RequestedOutput, Tensor

log = logging.getLogger("hubserve.classification")

PARAMETER = "classification"
# The datatypes Triton classifies; others (BOOL, FP16, BF16, BYTES) are refused as Triton refuses them.
CLASSIFIABLE = frozenset({DataType.UINT8, DataType.UINT16, DataType.UINT32, DataType.UINT64, DataType.INT8,
                          DataType.INT16, DataType.INT32, DataType.INT64, DataType.FP32, DataType.FP64})

Labels = Mapping[str, Sequence[str]]  # output name -> its labels, by class index


def counts(outputs: list[RequestedOutput] | None) -> dict[str, int] | None:
    """The class count of each requested output that asks for one, or None when none does. Called on
    every request, so the common case (no parameters, or only `binary_data`) costs a lookup per output.
    The values were checked by `check` before."""
    if outputs is None:
        return None
    found = None
    for out in outputs:
        params = out.parameters
        if params and PARAMETER in params:
            value = params[PARAMETER]
            if value:
                if found is None:
                    found = {}
                found[out.name] = int(value)
    return found


def check(spec: TensorSpec, value: object) -> None:
    """INVALID_ARG unless `value` is a class count this output can be classified with (0 asks for nothing,
    as tritonclient sends no parameter for class_count 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or int(value) != value:
        raise invalid(f"output '{spec.name}': parameter 'classification' must be a non-negative integer "
                      f"(the class count), got {value!r}")
    if value and spec.datatype not in CLASSIFIABLE:
        raise invalid(f"class result not available for output '{spec.name}' due to unsupported type "
                      f"'{spec.datatype.value}'")


def read_labels(config: ModelConfig, model_dir: Path) -> dict[str, tuple[str, ...]]:
    """Each output's labels, read from its `label_filename` in the model folder. INVALID_ARG (the version
    fails to load, as in Triton) for a file that is missing, unreadable or outside the folder; messages name
    it inside the model folder, never by an absolute path. Runs on a worker thread."""
    labels: dict[str, tuple[str, ...]] = {}
    for spec in config.outputs:
        if not spec.label_filename:
            continue
        shown = f"{config.name}/{spec.label_filename}"
        path = model_dir / spec.label_filename
        try:
            inside = path.resolve().is_relative_to(model_dir.resolve())
        except (OSError, RuntimeError, ValueError):
            inside = False
        if not inside:
            raise invalid(f"model '{config.name}': label_filename '{shown}' of output '{spec.name}' resolves "
                          "outside the model folder")
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise invalid(f"model '{config.name}': cannot read label_filename '{shown}' of output "
                          f"'{spec.name}': {e.strerror or type(e).__name__}") from None
        labels[spec.name] = tuple(text.splitlines())
    return labels


def top_k(values: np.ndarray, k: int, batched: bool, labels: Sequence[str] = ()) -> np.ndarray:
    """The `k` best classes of each batch element of `values` as "score:index[:label]" bytes, best first: an
    object array of `[batch, k]` when `batched`, else `[k]` (k capped at the number of classes)."""
    rows = values.reshape(values.shape[0] if batched else 1, -1)
    classes = rows.shape[1]
    k = min(k, classes)
    floating = rows.dtype.kind == "f"
    if floating:  # NaN last, then descending by score, equal scores in index order
        nan = np.isnan(rows)
        index = np.broadcast_to(np.arange(classes), rows.shape)
        order = np.lexsort((index, -np.where(nan, 0, rows), nan), axis=-1)[:, :k]
    else:  # no negation (unsigned, INT64_MIN): a stable sort of the reversed row, read backwards
        order = (classes - 1) - np.argsort(rows[:, ::-1], axis=1, kind="stable")[:, ::-1][:, :k]
    out = np.empty((rows.shape[0], k), dtype=object)
    n_labels = len(labels)
    for r in range(rows.shape[0]):
        row = rows[r]
        for j, index in enumerate(order[r].tolist()):
            value = row[index]
            text = f"{float(value):f}:{index}" if floating else f"{int(value)}:{index}"
            label = labels[index] if index < n_labels else ""
            out[r, j] = (f"{text}:{label}" if label else text).encode("utf-8")
    return out if batched else out.reshape(k)


def classify(response: InferenceResponse, wanted: Mapping[str, int], batched: bool, labels: Labels) -> None:
    """Replace each output of `response` named in `wanted` by its top classes, in place."""
    outputs = response.outputs
    for i, tensor in enumerate(outputs):
        k = wanted.get(tensor.name)
        if k:
            classes = top_k(tensor.data, k, batched, labels.get(tensor.name, ()))
            outputs[i] = Tensor(tensor.name, DataType.BYTES, classes.shape, classes)


def classifying(on_done: Completion | None, wanted: Mapping[str, int], batched: bool, labels: Labels
                ) -> Completion:
    """A completion that classifies a successful response, then calls `on_done` (always, so a frontend
    answers even should classifying fail: it then gets the raw output, and the failure is logged)."""
    def done(future: asyncio.Future[InferenceResponse]) -> None:
        try:
            if not future.cancelled() and future.exception() is None:
                classify(future.result(), wanted, batched, labels)
        except Exception:
            log.exception("classifying a response failed")
        finally:
            if on_done is not None:
                on_done(future)

    return done
