"""GPU metrics under Triton's names, read through NVML (`nvidia-ml-py`, the `gpu` extra), beside the model
families of metrics.py.

Triton's families, per GPU, labelled `gpu_uuid`: `nv_gpu_utilization` (0.0-1.0), `nv_gpu_memory_total_bytes`,
`nv_gpu_memory_used_bytes`, `nv_gpu_power_usage` and `nv_gpu_power_limit` (watts) and the counter
`nv_energy_consumption` (joules since the server started). Triton reads them from DCGM; NVML gives the same
numbers. The GPUs are the ones this process may use (devices.py's discovery: CUDA_VISIBLE_DEVICES), found in
NVML by UUID where known, else by index.

Where there is no GPU, no NVML library or no `nvidia-ml-py`, there is no GPU family at all, not a zero: the
server logs one info line saying why and goes on. A value NVML cannot give for a GPU (power on some boards)
is left out for that GPU.

NVML calls can take milliseconds, so none runs on the event loop: `GpuSampler`'s own thread reads every GPU
once per `--metrics-interval-ms` and keeps the last sample, which each scrape writes out.

Unverified on a GPU: no GPU here or in CI. What is tested is the sampling and the text with a stand-in NVML
library (an object with pynvml's functions), and the absence on a real server without NVML.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..instances.devices import VisibleGpu
from .exposition import escape

log = logging.getLogger("hubserve")


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU's numbers at one sampling; None where NVML could not say."""

    uuid: str
    utilization: float | None = None  # 0.0 - 1.0
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    power_usage_w: float | None = None
    power_limit_w: float | None = None
    energy_j: float | None = None  # since the sampler opened


# Triton's families: name, type, help, value from a sample
FAMILIES: list[tuple[str, str, str, Callable[[GpuSample], float | int | None]]] = [
    ("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)", lambda s: s.utilization),
    ("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes", lambda s: s.memory_total_bytes),
    ("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes", lambda s: s.memory_used_bytes),
    ("nv_gpu_power_usage", "gauge", "GPU power usage in watts", lambda s: s.power_usage_w),
    ("nv_gpu_power_limit", "gauge", "GPU power management limit in watts", lambda s: s.power_limit_w),
    ("nv_energy_consumption", "counter", "GPU energy consumption in joules since the Triton Server started",
     lambda s: s.energy_j),
]


def gpu_lines(samples: list[GpuSample]) -> list[str]:
    """The GPU families in the text format; a family no GPU has a value for is left out."""
    lines: list[str] = []
    for name, kind, help_text, value in FAMILIES:
        shown = [(s.uuid, v) for s in samples if (v := value(s)) is not None]
        if shown:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            lines.extend(f'{name}{{gpu_uuid="{escape(uuid)}"}} {v}' for uuid, v in shown)
    return lines


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GpuSampler:
    """Samples the visible GPUs through `nvml` (pynvml, or anything with its functions) on a thread of its
    own. Made by `open_sampler`; `start` and `stop` are called by the server (engine/server.py), `lines` at
    each scrape, from any thread."""

    def __init__(self, nvml: Any, handles: list[Any], interval_s: float) -> None:
        self._nvml = nvml
        self._handles = handles
        self._interval_s = interval_s
        energy = nvml.nvmlDeviceGetTotalEnergyConsumption
        self._energy_start_mj: list[int | None] = [self._read(energy, h) for h in handles]
        self._uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
        self._samples: list[GpuSample] = []  # replaced whole: a scrape reads one sampling's list
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self, call: Callable[[Any], Any], handle: Any) -> Any:
        """One NVML reading, or None where this GPU cannot give it (NVMLError_NotSupported and the like)."""
        try:
            return call(handle)
        except self._nvml.NVMLError:
            return None

    def sample(self) -> list[GpuSample]:
        """Read every GPU once and keep the result; called on the sampler's thread (and by tests)."""
        nvml, samples = self._nvml, []
        for i, handle in enumerate(self._handles):
            rates = self._read(nvml.nvmlDeviceGetUtilizationRates, handle)
            memory = self._read(nvml.nvmlDeviceGetMemoryInfo, handle)
            power_mw = self._read(nvml.nvmlDeviceGetPowerUsage, handle)
            limit_mw = self._read(nvml.nvmlDeviceGetPowerManagementLimit, handle)
            energy_mj = self._read(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
            start_mj = self._energy_start_mj[i]
            samples.append(GpuSample(
                self._uuids[i],
                None if rates is None else rates.gpu / 100,
                None if memory is None else int(memory.total),
                None if memory is None else int(memory.used),
                None if power_mw is None else power_mw / 1000,
                None if limit_mw is None else limit_mw / 1000,
                None if energy_mj is None or start_mj is None else (energy_mj - start_mj) / 1000))
        self._samples = samples
        return samples

    def lines(self) -> list[str]:
        return gpu_lines(self._samples)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpu-metrics", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self.sample()
            except Exception as e:  # a driver gone mid-run: keep the last sample, say so once
                log.warning("GPU metrics: sampling failed (%s); the last sample stays", e)
                return
            if self._stop.wait(self._interval_s):
                return

    def stop(self) -> None:
        """End the thread (at most one NVML reading later) and NVML; called once, at shutdown."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


def _handle(nvml: Any, gpu: VisibleGpu) -> Any:
    if gpu.uuid is not None:
        return nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
    return nvml.nvmlDeviceGetHandleByIndex(gpu.index if gpu.index is not None else gpu.ordinal)


def open_sampler(nvml: Any, visible: tuple[VisibleGpu, ...], interval_s: float) -> GpuSampler | None:
    """A sampler of the `visible` GPUs through `nvml`, or None (with one info line saying why) where there
    is nothing to sample: NVML does not start (no driver library) or no GPU is visible."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        log.info("GPU metrics off: NVML did not start (%s)", e)
        return None
    try:
        handles = [_handle(nvml, gpu) for gpu in visible]
        if not handles:
            log.info("GPU metrics off: no GPU visible")
            nvml.nvmlShutdown()
            return None
        return GpuSampler(nvml, handles, interval_s)
    except nvml.NVMLError as e:
        log.info("GPU metrics off: NVML cannot read the visible GPUs (%s)", e)
        nvml.nvmlShutdown()
        return None


def load_nvml() -> Any | None:
    """The pynvml module (`nvidia-ml-py`, the `gpu` extra), or None with one info line where it is not
    installed."""
    try:
        import pynvml
    except ImportError:
        log.info("GPU metrics off: nvidia-ml-py is not installed (pip install 'hubserve[gpu]')")
        return None
    return pynvml
