"""Tests of engine/observability/gpu_metrics.py: NVML readings → Triton's GPU families, read back with
prometheus_client's own parser. NVML is an external C library; `FakeNvml` stands in for it with pynvml's
function names, units (milliwatts, millijoules, percent) and error class, so the sampling, the conversions and
the text are exercised without a GPU."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import wait_until
from engine.instances.devices import VisibleGpu
from engine.observability.gpu_metrics import GpuSampler, load_nvml, open_sampler
from engine.observability.metrics import render

UUID0 = "GPU-1b2c3d4e-0000-0000-0000-000000000000"
UUID1 = "GPU-5f6a7b8c-1111-1111-1111-111111111111"


class NVMLError(Exception):
    pass


@dataclass
class Board:
    uuid: str
    utilization_percent: int = 42
    memory_total: int = 80 << 30
    memory_used: int = 3 << 30
    power_mw: int | None = 123_456  # None: the board cannot say (NVMLError_NotSupported)
    limit_mw: int = 700_000
    energy_mj: int = 5_000_000


@dataclass
class FakeNvml:
    """pynvml's surface as the sampler uses it; `init_error`: what nvmlInit raises (no driver library)."""

    boards: list[Board]
    init_error: str = ""
    calls: list[str] = field(default_factory=list)
    NVMLError: type[Exception] = NVMLError

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Board:
        return self.boards[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Board:
        found = [b for b in self.boards if b.uuid == uuid]
        if not found:
            raise NVMLError("Not Found")
        return found[0]

    def nvmlDeviceGetUUID(self, board: Board) -> str:
        return board.uuid

    def nvmlDeviceGetUtilizationRates(self, board: Board) -> Any:
        return SimpleNamespace(gpu=board.utilization_percent, memory=0)

    def nvmlDeviceGetMemoryInfo(self, board: Board) -> Any:
        return SimpleNamespace(total=board.memory_total, used=board.memory_used,
                               free=board.memory_total - board.memory_used)

    def nvmlDeviceGetPowerUsage(self, board: Board) -> int:
        if board.power_mw is None:
            raise NVMLError("Not Supported")
        return board.power_mw

    def nvmlDeviceGetPowerManagementLimit(self, board: Board) -> int:
        return board.limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, board: Board) -> int:
        return board.energy_mj


VISIBLE = (VisibleGpu(0, 0, UUID0), VisibleGpu(1, 1, UUID1))


def parsed(lines: list[str]) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families("\n".join(lines) + "\n")}


def values(family: Any) -> dict[str, float]:
    return {s.labels["gpu_uuid"]: s.value for s in family.samples}


def sampler(nvml: FakeNvml, visible: tuple[VisibleGpu, ...] = VISIBLE) -> GpuSampler:
    opened = open_sampler(nvml, visible, interval_s=0.01)
    assert opened is not None
    return opened


def test_a_sample_is_written_under_tritons_names_units_and_labels() -> None:
    boards = [Board(UUID0), Board(UUID1, utilization_percent=7, memory_used=1 << 30, energy_mj=9_000_000)]
    gpus = sampler(FakeNvml(boards))
    boards[0].energy_mj += 2_500  # 2.5 J since the sampler opened
    gpus.sample()
    families = parsed(gpus.lines())
    assert {name: (f.type, f.documentation) for name, f in families.items()} == {
        "nv_gpu_utilization": ("gauge", "GPU utilization rate [0.0 - 1.0)"),
        "nv_gpu_memory_total_bytes": ("gauge", "GPU total memory, in bytes"),
        "nv_gpu_memory_used_bytes": ("gauge", "GPU used memory, in bytes"),
        "nv_gpu_power_usage": ("gauge", "GPU power usage in watts"),
        "nv_gpu_power_limit": ("gauge", "GPU power management limit in watts"),
        "nv_energy_consumption": ("counter",
                                  "GPU energy consumption in joules since the Triton Server started"),
    }
    assert values(families["nv_gpu_utilization"]) == {UUID0: 0.42, UUID1: 0.07}
    assert values(families["nv_gpu_memory_total_bytes"]) == {UUID0: 80 << 30, UUID1: 80 << 30}
    assert values(families["nv_gpu_memory_used_bytes"]) == {UUID0: 3 << 30, UUID1: 1 << 30}
    assert values(families["nv_gpu_power_usage"]) == {UUID0: 123.456, UUID1: 123.456}
    assert values(families["nv_gpu_power_limit"]) == {UUID0: 700.0, UUID1: 700.0}
    assert values(families["nv_energy_consumption"]) == {UUID0: 2.5, UUID1: 0.0}


def test_the_families_sit_on_the_metrics_page_beside_the_model_families() -> None:
    gpus = sampler(FakeNvml([Board(UUID0)]), (VisibleGpu(0, 0, None),))  # found by index, no UUID known
    gpus.sample()
    page = render([], None, (), gpus.lines()).decode()
    families = parsed(page.splitlines())
    assert values(families["nv_gpu_utilization"]) == {UUID0: 0.42}
    assert "nv_inference_request_success" in families


def test_a_value_a_gpu_cannot_give_is_left_out_not_zero() -> None:
    gpus = sampler(FakeNvml([Board(UUID0, power_mw=None), Board(UUID1)]))
    gpus.sample()
    assert values(parsed(gpus.lines())["nv_gpu_power_usage"]) == {UUID1: 123.456}
    only = sampler(FakeNvml([Board(UUID0, power_mw=None)]), (VisibleGpu(0, 0, UUID0),))
    only.sample()
    assert "nv_gpu_power_usage" not in parsed(only.lines())  # no GPU has one: no family


def test_nothing_is_written_before_the_first_sample() -> None:
    assert sampler(FakeNvml([Board(UUID0)]), VISIBLE[:1]).lines() == []


def test_a_visible_gpu_nvml_cannot_find_means_no_sampler(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml([Board(UUID0)])
    with caplog.at_level(logging.INFO, logger="hubserve"):
        assert open_sampler(nvml, VISIBLE, 2.0) is None  # UUID1 is not there
    assert [r.getMessage() for r in caplog.records] == [
        "GPU metrics off: NVML cannot read the visible GPUs (Not Found)"]
    assert nvml.calls == ["init", "shutdown"]


def test_no_nvml_library_means_no_sampler_and_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml([Board(UUID0)], init_error="NVML Shared Library Not Found")
    with caplog.at_level(logging.INFO, logger="hubserve"):
        assert open_sampler(nvml, VISIBLE, 2.0) is None
    assert [r.getMessage() for r in caplog.records] == [
        "GPU metrics off: NVML did not start (NVML Shared Library Not Found)"]


def test_no_visible_gpu_means_no_sampler(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml([Board(UUID0)])
    with caplog.at_level(logging.INFO, logger="hubserve"):
        assert open_sampler(nvml, (), 2.0) is None
    assert [r.getMessage() for r in caplog.records] == ["GPU metrics off: no GPU visible"]
    assert nvml.calls == ["init", "shutdown"]


def test_the_thread_samples_on_its_interval_and_stops() -> None:
    board = Board(UUID0)
    nvml = FakeNvml([board])
    gpus = sampler(nvml, (VisibleGpu(0, 0, UUID0),))
    gpus.start()
    try:
        wait_until(gpus.lines, "a first sample", timeout_s=10)
        board.utilization_percent = 99  # a later sampling sees it
        wait_until(lambda: values(parsed(gpus.lines())["nv_gpu_utilization"]) == {UUID0: 0.99},
                   "a later sample", timeout_s=10)
    finally:
        gpus.stop()
    assert nvml.calls[-1] == "shutdown"
    assert not [t for t in threading.enumerate() if t.name == "gpu-metrics"]


def test_the_real_nvml_library_without_a_driver_means_no_sampler(caplog: pytest.LogCaptureFixture) -> None:
    """nvidia-ml-py itself (the `gpu` extra) on a machine without libnvidia-ml: nvmlInit fails, quietly."""
    nvml = load_nvml()
    if nvml is None:
        pytest.skip("nvidia-ml-py is not installed")
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        pass
    else:
        nvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver library is here")
    with caplog.at_level(logging.INFO, logger="hubserve"):
        assert open_sampler(nvml, VISIBLE, 2.0) is None
    assert [r.getMessage() for r in caplog.records] == [
        "GPU metrics off: NVML did not start (NVML Shared Library Not Found)"]
