"""The tensors a generative model shows Triton's clients, and how its config gets them (auto-complete).

A generative model folder (its config's `generation` parameter, serving/model_folder.py) is served to KServe
v2 / Triton clients the way Triton's vLLM backend serves an LLM: as a decoupled model whose inputs are text
and flags, not the ONNX decoder's own tensors (those are the generation engine's business):

    input  text_input               TYPE_STRING [1]  the prompt
    input  stream                   TYPE_BOOL   [1]  optional: a response per text piece (default false: one)
    input  sampling_parameters      TYPE_STRING [1]  optional: JSON, e.g. {"temperature": 0, "max_tokens": 8}
    input  exclude_input_in_output  TYPE_BOOL   [1]  optional: leave the prompt out of a whole-text answer
    input  max_tokens               TYPE_INT32  [1]  optional: TensorRT-LLM ensemble's spelling
    output text_output              TYPE_STRING [-1]

`max_batch_size: 0` and `model_transaction_policy { decoupled: true }`, as vLLM's backend completes its
config: the engine batches by itself, token by token, so no request batching is asked of the server. The
config may list these tensors (the example does, so it reads as documentation) or leave them out; any
other tensor in `input`/`output` is refused. Called by the repository's parse → auto-complete → validate
instead of the ONNX auto-complete (the ONNX file's tensors are checked by the engine's runner when built).
"""

from __future__ import annotations

from typing import Any

from ...errors import invalid
from ...proto import model_config_pb2 as pb

TEXT_INPUT = "text_input"
STREAM = "stream"
SAMPLING_PARAMETERS = "sampling_parameters"
EXCLUDE_INPUT = "exclude_input_in_output"
MAX_TOKENS = "max_tokens"
TEXT_OUTPUT = "text_output"

# name → (data type, dims, optional)
INPUTS: dict[str, tuple[int, list[int], bool]] = {
    TEXT_INPUT: (pb.TYPE_STRING, [1], False),
    STREAM: (pb.TYPE_BOOL, [1], True),
    SAMPLING_PARAMETERS: (pb.TYPE_STRING, [1], True),
    EXCLUDE_INPUT: (pb.TYPE_BOOL, [1], True),
    MAX_TOKENS: (pb.TYPE_INT32, [1], True),
}
OUTPUTS: dict[str, tuple[int, list[int], bool]] = {TEXT_OUTPUT: (pb.TYPE_STRING, [-1], False)}


def is_generative_config(msg: pb.ModelConfig) -> bool:
    return "generation" in msg.parameters


def complete_generative(msg: pb.ModelConfig, where: str) -> None:
    """Give a generative model's config its Triton signature, in place (module docstring)."""
    if msg.max_batch_size != 0:
        raise invalid(f"{where}: a generative model batches token by token in its engine; set "
                      f"max_batch_size: 0 (got {msg.max_batch_size})")
    if msg.WhichOneof("scheduling_choice") is not None:
        raise invalid(f"{where}: a generative model takes no {msg.WhichOneof('scheduling_choice')} (its "
                      "engine schedules the requests)")
    _complete(msg.input, INPUTS, "input", where)
    _complete(msg.output, OUTPUTS, "output", where)
    msg.model_transaction_policy.decoupled = True


def _complete(configured: Any, known: dict[str, tuple[int, list[int], bool]], kind: str, where: str) -> None:
    names = [t.name for t in configured]
    for name in names:
        if name not in known:
            raise invalid(f"{where}: a generative model's {kind}s are {', '.join(known)}; '{name}' is not "
                          "one of them (the ONNX decoder's own tensors are the engine's, not the config's)")
    for name, (data_type, dims, optional) in known.items():
        entry = next((t for t in configured if t.name == name), None)
        if entry is None:
            entry = configured.add()
            entry.name = name
            if kind == "input":
                entry.optional = optional
        if entry.data_type == pb.TYPE_INVALID:
            entry.data_type = data_type
        if entry.data_type != data_type:
            raise invalid(f"{where}: {kind} '{name}' of a generative model is {pb.DataType.Name(data_type)}, "
                          f"not {pb.DataType.Name(entry.data_type)}")
        if not entry.dims:
            entry.dims.extend(dims)
