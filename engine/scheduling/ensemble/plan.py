"""The ensemble planner, pure: the DAG of an ensemble's steps, its validation, and which steps may run when.

Nothing here waits, reads a clock or touches a model: engine/scheduling/ensemble/driver.py drives it. Three
stages, in the order Triton checks them (core model_config_utils.cc ValidateEnsembleSchedulingConfig,
ensemble_utils.cc ValidateEnsembleConfig), and with its words, which clients and users match on:

1. `check_data_flow` (called by engine/config/ensemble.py with the config alone): every tensor written once,
   every ensemble input used, every output written (a cycle or an unconnected tensor says which), nothing
   computed and thrown away.
2. `EnsemblePlan.build` (when the ensemble loads, with each step's composing model config): each mapping
   names a real input or output, every required input is mapped, and the datatypes and shapes of each
   ensemble tensor agree wherever it is read or written.
3. `PlanProgress` (one per request): which steps are ready at the start, and which become ready as each
   step completes. A step runs once all the tensors it reads exist, so independent steps run together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...config.model_config import EnsembleStep, ModelConfig, TensorSpec
from ...errors import invalid
from ...types import DataType

# ----------------------------------------------------------------------------------- 1. data flow


def check_data_flow(name: str, inputs: Sequence[str], outputs: Sequence[str],
                    steps: Sequence[EnsembleStep]) -> None:
    """INVALID_ARG unless the steps form a DAG that computes every output from the inputs and uses all it
    computes."""
    writer: dict[str, int] = {}
    for index, step in enumerate(steps):
        for _, tensor in step.output_map:
            if tensor in writer:
                raise invalid(f"ensemble tensor '{tensor}' can appear in an output map only once for "
                              f"ensemble '{name}' step {index}")
            if tensor in inputs:
                raise invalid(f"ensemble tensor '{tensor}' is an input of ensemble '{name}'; step {index} "
                              f"(model '{step.model_name}') cannot write it too")
            writer[tensor] = index
    readers: dict[str, list[int]] = {}
    for index, step in enumerate(steps):
        for _, tensor in step.input_map:
            readers.setdefault(tensor, []).append(index)
    for tensor in inputs:
        if tensor not in readers:
            raise invalid(f"ensemble input '{tensor}' for ensemble '{name}' is not used")
    ready = _reachable(inputs, steps)
    for tensor in outputs:
        if tensor not in writer:
            raise invalid(f"ensemble output '{tensor}' for ensemble '{name}' is not used: no step writes it")
        if tensor not in ready:
            raise invalid(f"output '{tensor}' for ensemble '{name}' is not written: "
                          + _why_unready(tensor, inputs, steps, writer))
    for tensor in sorted(set(writer) | set(readers)):
        if tensor in outputs:
            continue
        if tensor not in ready or tensor not in readers:
            raise invalid(f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")


def _reachable(inputs: Sequence[str], steps: Sequence[EnsembleStep]) -> set[str]:
    """The tensors the steps can compute from the inputs (each step runs once all it reads is there)."""
    ready = set(inputs)
    pending = list(range(len(steps)))
    progress = True
    while progress:
        progress = False
        for index in list(pending):
            if all(t in ready for _, t in steps[index].input_map):
                ready.update(t for _, t in steps[index].output_map)
                pending.remove(index)
                progress = True
    return ready


def _why_unready(tensor: str, inputs: Sequence[str], steps: Sequence[EnsembleStep],
                 writer: Mapping[str, int]) -> str:
    """Why `tensor` can never be computed: a cycle of steps through it, or a tensor nothing writes."""
    path: list[str] = []  # tensors followed back from `tensor`, each read by the writer of the one before
    ready = _reachable(inputs, steps)
    current = tensor
    while current not in path:
        path.append(current)
        if current not in writer:
            return f"at least one of its depending tensors, '{current}', is not connected"
        step = steps[writer[current]]
        blocked = [t for _, t in step.input_map if t not in ready]
        current = blocked[0]
    loop = path[path.index(current):] + [current]
    hops = ", ".join(f"'{t}' is written by step {writer[t]} (model '{steps[writer[t]].model_name}')"
                     for t in loop[:-1])
    return f"its steps form a cycle: {' -> '.join(repr(t) for t in reversed(loop))} ({hops})"


# ----------------------------------------------------------------------------------- 2. the plan


@dataclass(frozen=True, slots=True)
class PlannedStep:
    """A step as it runs: the composing model, the ensemble tensors it reads under its own input names, and
    the outputs it is asked for, with the ensemble tensors they become."""

    index: int
    model_name: str
    model_version: str  # "" = the newest ready version
    inputs: tuple[tuple[str, str], ...]  # (the model's input, the ensemble tensor)
    outputs: tuple[tuple[str, str], ...]  # (the model's output, the ensemble tensor)


@dataclass(frozen=True, slots=True)
class _Node:
    """What an ensemble tensor is, as one model (the ensemble or a step's) declares it."""

    model: str
    datatype: DataType
    dims: tuple[int, ...]
    full_dims: tuple[int, ...]  # with the batch dimension (-1) of a batching model


def _node(model: str, batching: bool, spec: TensorSpec, use_reshape: bool = False) -> _Node:
    dims = spec.reshape if use_reshape and spec.reshape is not None else spec.dims
    return _Node(model, spec.datatype, dims, ((-1,) if batching else ()) + dims)


def _dims_agree(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))


def _dims_text(dims: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


class EnsemblePlan:
    """A validated ensemble: its steps in config order, and for the driver, which steps may start at once
    (`initial`), how many tensors each waits for (`needs`), and whom each step's outputs unblock (`after`).
    Built once per load; shared, never mutated, by every request's `PlanProgress`."""

    __slots__ = ("after", "initial", "name", "needs", "outputs", "steps")

    def __init__(self, name: str, steps: tuple[PlannedStep, ...], inputs: Sequence[str],
                 outputs: Sequence[str]) -> None:
        self.name = name
        self.steps = steps
        self.outputs = tuple(outputs)
        given = set(inputs)
        readers: dict[str, list[int]] = {}
        needs = []
        for step in steps:
            waited = {t for _, t in step.inputs if t not in given}
            needs.append(len(waited))
            for tensor in waited:
                readers.setdefault(tensor, []).append(step.index)
        self.needs = tuple(needs)
        self.initial = tuple(s.index for s in steps if needs[s.index] == 0)
        self.after = tuple(tuple(r for _, t in step.outputs for r in readers.get(t, ())) for step in steps)

    @classmethod
    def build(cls, config: ModelConfig, composing: Sequence[ModelConfig]) -> EnsemblePlan:
        """Check the ensemble `config` against `composing`, each step's model config in step order, and plan
        it. INVALID_ARG, in Triton's words, for the first mismatch."""
        assert config.ensemble is not None
        name = config.name
        batching = config.max_batch_size > 0
        tensors: dict[str, _Node] = {}
        for spec in config.inputs + config.outputs:
            tensors[spec.name] = _node(name, batching, spec, use_reshape=True)
        planned = []
        for index, (step, model) in enumerate(zip(config.ensemble.steps, composing, strict=True)):
            if 0 < model.max_batch_size < config.max_batch_size:
                raise invalid(f"ensemble {name} allows maximum batch size {config.max_batch_size}, but it "
                              f"contains model {model.name} which only allows maximum batch size to be "
                              f"{model.max_batch_size}")
            _check_mapping(name, step, model, tensors)
            planned.append(PlannedStep(index, step.model_name, step.version_str, step.input_map,
                                       step.output_map))
        return cls(name, tuple(planned), [s.name for s in config.inputs], [s.name for s in config.outputs])

    def progress(self) -> PlanProgress:
        return PlanProgress(self)


def _check_mapping(ensemble: str, step: EnsembleStep, model: ModelConfig, tensors: dict[str, _Node]) -> None:
    """One step's maps against its model's tensors (core ensemble_utils.cc ValidateTensorMapping)."""
    where = f"in ensemble {ensemble}, "
    batching = model.max_batch_size > 0
    mapped = dict(step.input_map)
    for model_input, tensor in step.input_map:
        if model.input(model_input) is None:
            raise invalid(f"{where}ensemble tensor {tensor} is mapping to non-existing input {model_input} "
                          f"in model {model.name}")
    for spec in model.inputs:
        read = mapped.get(spec.name)
        if read is None:
            if spec.optional:
                continue
            raise invalid(f"{where}input {spec.name} in model {model.name} is not mapped to any ensemble "
                          "tensors")
        _agree(where, read, tensors, _node(model.name, batching, spec))
    for model_output, written in step.output_map:
        out = model.output(model_output)
        if out is None:
            raise invalid(f"{where}ensemble tensor {written} is mapped from non-existing output "
                          f"{model_output} in model {model.name}")
        _agree(where, written, tensors, _node(model.name, batching, out))


def _agree(where: str, tensor: str, tensors: dict[str, _Node], node: _Node) -> None:
    """The first declaration of an ensemble tensor stands; each later one must agree with it."""
    known = tensors.setdefault(tensor, node)
    if known is node:
        return
    prefix = f"{where}ensemble tensor {tensor}: "
    if known.datatype is not node.datatype:
        raise invalid(f"{prefix}inconsistent data type: {known.datatype.config_name} is inferred from model "
                      f"{known.model} while {node.datatype.config_name} is inferred from model {node.model}")
    if not _dims_agree(known.dims, node.dims) and not _dims_agree(known.full_dims, node.full_dims):
        raise invalid(f"{prefix}inconsistent shape: {_dims_text(known.full_dims)} is inferred from model "
                      f"{known.model} while {_dims_text(node.full_dims)} is inferred from model {node.model}")


# ----------------------------------------------------------------------------------- 3. one request


class PlanProgress:
    """One request's way through a plan: `start()` gives the steps to run first, `completed(step)` the steps
    that step's outputs made ready; `finished` once every step has completed. Each step is handed out once."""

    __slots__ = ("_left", "_plan", "_waiting")

    def __init__(self, plan: EnsemblePlan) -> None:
        self._plan = plan
        self._waiting = list(plan.needs)
        self._left = len(plan.steps)

    def start(self) -> tuple[int, ...]:
        return self._plan.initial

    def completed(self, step: int) -> list[int]:
        self._left -= 1
        ready = []
        waiting = self._waiting
        for reader in self._plan.after[step]:
            waiting[reader] -= 1
            if waiting[reader] == 0:
                ready.append(reader)
        return ready

    @property
    def finished(self) -> bool:
        return self._left == 0
