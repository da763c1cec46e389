"""Runs one instance of a Triton Python model: load `model.py`, `initialize`, `execute`, `finalize`.

Used by the instance process (stub.py) and by in-process instances (backend.py), always from one thread:
the instance's. `execute` may be `async def`: it then runs on an event loop this runner owns (as Triton runs
it on the stub's loop), so `await request.async_exec()` works inside it; a plain `execute` may call the
blocking `exec()`.

What execute returns is converted here into plain answers (`Answer`); whether they fit the config (count,
requested outputs, datatypes, shapes) is checked by the engine (batcher.py), which knows the config and
which request asked for what. Errors are written as Triton writes them (`ValueError: msg`, then `At:` and
the frames in the model's files), with the model folder's path replaced by the model's name: messages reach
clients, and must not carry the server's paths.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from ...types import DataType
from . import pb_utils

# An answer for one request: ("ok", [(name, datatype, array)], parameters JSON) or ("error", code, message).
Answer = tuple[Any, ...]


class ModelError(Exception):
    """The model's code failed (import, initialize, execute); the message is ready for users."""


def describe_exception(error: BaseException, model_dir: Path, shown: str, frames: int = 6) -> str:
    """`Type: message` and the last frames of its traceback in the model's own files, as Triton shows them
    (`At:` then `  file(line): function`), with the model folder written as `shown` (e.g. `py/`)."""
    text = f"{type(error).__name__}: {error}"
    lines = []
    folder = str(model_dir)
    for frame in traceback.extract_tb(error.__traceback__):
        if frame.filename.startswith(folder):
            where = shown.rstrip("/") + frame.filename[len(folder):]
            lines.append(f"  {where}({frame.lineno}): {frame.name}")
    if lines:
        text += "\n\nAt:\n" + "\n".join(lines[-frames:])
    return text.replace(folder, shown.rstrip("/"))


def load_model_class(model_file: Path, model_dir: Path, shown: str) -> Any:
    """Import `model_file` and return its `TritonPythonModel` class. Its folder goes on sys.path first, as
    Triton puts it, so a model may import modules kept beside it."""
    folder = str(model_file.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    # The name models import is bound to pb_utils here, before any model imports it. A module on the path
    # that replaced itself in sys.modules on first import, as this tree had, raced: when two in-process
    # models imported it at once, CPython handed the second importer the module object it had found
    # before waiting for the first, the stand-in, which has none of the API (a CI run failed on that).
    sys.modules.setdefault("triton_python_backend_utils", pb_utils)
    name = f"hubserve_model_{abs(hash(folder))}"
    spec = importlib.util.spec_from_file_location(name, model_file)
    if spec is None or spec.loader is None:
        raise ModelError(f"{shown}{model_file.name} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pickle, dataclasses and the like look a module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException as e:
        sys.modules.pop(name, None)
        raise ModelError(describe_exception(e, model_dir, shown)) from None
    cls = getattr(module, "TritonPythonModel", None)
    if cls is None:
        raise ModelError(f"{shown}{model_file.parent.name}/{model_file.name} defines no class "
                         "'TritonPythonModel'")
    return cls


class ModelRunner:
    """One instance of the model: created (imported and initialized) and run on one thread."""

    def __init__(self, model_file: Path, args: dict[str, str], model_dir: Path, shown: str) -> None:
        self._model_dir = model_dir
        self._shown = shown
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._instance = args.get("model_instance_name", "")
        try:
            self.decoupled = pb_utils.using_decoupled_model_transaction_policy(
                json.loads(args.get("model_config", "{}")))
        except ValueError:
            self.decoupled = False
        cls = load_model_class(model_file, model_dir, shown)
        try:
            self.model = cls()
            initialize = getattr(self.model, "initialize", None)
            if initialize is not None:
                result = initialize(args)
                if inspect.isawaitable(result):
                    self._loop().run_until_complete(result)
        except BaseException as e:
            raise ModelError(describe_exception(e, model_dir, shown)) from None
        if not callable(getattr(self.model, "execute", None)):
            raise ModelError(f"{shown}: TritonPythonModel has no execute()")

    def _loop(self) -> asyncio.AbstractEventLoop:
        if self._event_loop is None:
            self._event_loop = asyncio.new_event_loop()
        return self._event_loop

    def execute(self, requests: list[pb_utils.InferenceRequest]) -> list[Answer]:
        """Run `execute` on one batch. Raises ModelError when it raises or returns no list; otherwise one
        answer per returned element (the engine checks that the count matches)."""
        try:
            result = self.model.execute(requests)
            if inspect.isawaitable(result):
                result = self._loop().run_until_complete(result)
        except BaseException as e:
            raise ModelError(describe_exception(e, self._model_dir, self._shown)) from None
        if self.decoupled:  # its answers go through the requests' senders (Triton's rule and words)
            if result is not None:
                raise ModelError(f"Python model '{self._instance}' is using the decoupled mode and the "
                                 "execute function must return None.")
            return []
        if not isinstance(result, (list, tuple)):
            raise ModelError(f"Expected a list in the execute return, found type '{type(result).__name__}'.")
        return [convert_response(r, i) for i, r in enumerate(result)]

    def finalize(self) -> str:
        """Call `finalize`; returns its failure as text ("" when none)."""
        try:
            finalize = getattr(self.model, "finalize", None)
            if finalize is not None:
                result = finalize()
                if inspect.isawaitable(result):
                    self._loop().run_until_complete(result)
        except BaseException as e:
            return describe_exception(e, self._model_dir, self._shown)
        finally:
            if self._event_loop is not None:
                self._event_loop.close()
        return ""


def convert_response(response: Any, index: int) -> Answer:
    """One element of execute's list as an answer: outputs (BYTES as object arrays) or the response's error.
    A tensor that cannot be sent fails that request alone."""
    if not isinstance(response, pb_utils.InferenceResponse):
        return ("error", "INTERNAL", f"execute returned {type(response).__name__} for request {index}; "
                                     "expected an InferenceResponse")
    error = response.error()
    if error is not None:
        return ("error", pb_utils.CODE_NAMES.get(error.code(), "INTERNAL"), error.message())
    outputs = []
    for tensor in response.output_tensors():
        if not isinstance(tensor, pb_utils.Tensor):
            return ("error", "INTERNAL", f"response {index} holds {type(tensor).__name__}; output tensors "
                                         "must be pb_utils.Tensor")
        array = tensor.as_numpy()
        name = tensor.datatype()
        # A dict lookup, not DataType.from_v2 nor DataType.BYTES (each a ~1 µs descriptor or classmethod
        # call on Python 3.11, per output tensor); from_v2 still raises for a name that is not a datatype.
        datatype = _DATATYPES.get(name) or DataType.from_v2(name)
        if datatype is _BYTES:
            if array.dtype != object:
                array = array.astype(object)
        elif not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        outputs.append((tensor.name(), datatype, array))
    return ("ok", outputs, response.parameters())


_DATATYPES = {datatype._value_: datatype for datatype in DataType}  # by v2 name
_BYTES = DataType.BYTES
