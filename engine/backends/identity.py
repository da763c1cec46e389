"""A backend with no runtime: OUTPUTn = INPUTn (by position). It exists so the batcher and instance pool can
be tested with real timing and failures without an ML runtime in the way.

Parameters (config `parameters`): `execute_delay_ms` sleeps per execution (a stand-in for compute; from the
`execute_delay_from_run`-th execution on, default the first),
`execute_delay_ms_per_item` sleeps that much more per batch element (so a bigger batch finishes later),
`fail_on_value` makes an execution fail when any element of the first input equals that number, and
`cpu_bound: "true"` claims (falsely, when it sleeps) that execution time is CPU time, so the instance pool may
run it inline on the event loop. `threads` records the thread of each execution, for the tests of that rule.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..config.model_config import ModelConfig
from ..errors import EngineError, ErrorCode

if TYPE_CHECKING:
    from ..instances.devices import Device


def create(config: ModelConfig, model_path: Path, device: Device, instance_name: str) -> IdentityBackend:
    """The registry's factory (engine/backends/__init__.py): no model file, no device."""
    return IdentityBackend(config)


class IdentityBackend:
    def __init__(self, config: ModelConfig) -> None:
        self._pairs = {o.name: i.name for i, o in zip(config.inputs, config.outputs, strict=False)}
        self._delay_s = float(config.parameters.get("execute_delay_ms", "0")) / 1000.0
        self._delay_from_run = int(config.parameters.get("execute_delay_from_run", "1"))
        self._delay_per_item_s = float(config.parameters.get("execute_delay_ms_per_item", "0")) / 1000.0
        self._batching = config.max_batch_size > 0
        fail = config.parameters.get("fail_on_value")
        self._fail_on = float(fail) if fail is not None else None
        self._first_input = config.inputs[0].name
        self.cpu_bound = config.parameters.get("cpu_bound", "false") == "true"
        self.threads: list[int] = []

    def execute(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        self.threads.append(threading.get_ident())
        delay_s = self._delay_s if len(self.threads) >= self._delay_from_run else 0.0
        if self._delay_per_item_s:
            first = inputs[self._first_input]
            items = first.shape[0] if self._batching and first.ndim else 1
            delay_s += self._delay_per_item_s * items
        if delay_s:
            time.sleep(delay_s)
        if self._fail_on is not None:
            first = inputs[self._first_input]
            if first.dtype != object and np.any(first == self._fail_on):
                raise EngineError(ErrorCode.INTERNAL, f"identity backend: input contains {self._fail_on:g}")
        return {name: inputs[self._pairs[name]] for name in output_names}

    def close(self) -> None:
        pass
