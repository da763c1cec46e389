"""Tests of engine/instances/devices.py's discovery: CUDA_VISIBLE_DEVICES and the driver's list (nvidia-smi
-L) turned into the CUDA device numbers placement uses, every form given as data, no GPU needed."""

from __future__ import annotations

import shutil

import pytest

from engine.instances.devices import (
    PRETEND_ENV,
    PhysicalGpu,
    VisibleGpu,
    discover_visible_gpus,
    parse_smi_list,
    parse_visible,
)

SMI = """GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1b2c3d4e-0000-0000-0000-000000000000)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-5f6a7b8c-1111-1111-1111-111111111111)
GPU 2: NVIDIA H100 80GB HBM3 (UUID: GPU-9d0e1f2a-2222-2222-2222-222222222222)
GPU 3: NVIDIA H100 80GB HBM3 (UUID: GPU-3b4c5d6e-3333-3333-3333-333333333333)
"""
FOUR = parse_smi_list(SMI)
UUIDS = [g.uuid for g in FOUR]


def test_the_driver_list_is_read_from_nvidia_smi() -> None:
    assert FOUR[1] == PhysicalGpu(1, "GPU-5f6a7b8c-1111-1111-1111-111111111111")
    assert len(FOUR) == 4
    assert parse_smi_list("No devices were found\n") == ()


def test_unset_means_every_gpu_the_driver_lists() -> None:
    assert parse_visible(None, FOUR) == tuple(VisibleGpu(i, i, UUIDS[i]) for i in range(4))


def test_unset_with_no_driver_means_none() -> None:
    assert parse_visible(None, ()) == ()
    assert parse_visible(None, None) == ()  # pretending, with nothing listed


@pytest.mark.parametrize("value", ["", "-1", "-1,0", " ", "none"])
def test_an_empty_or_invalid_first_entry_hides_every_gpu(value: str) -> None:
    assert parse_visible(value, FOUR) == ()


def test_listed_gpus_are_numbered_from_zero_in_the_listed_order() -> None:
    assert parse_visible("1,3", FOUR) == (VisibleGpu(0, 1, UUIDS[1]), VisibleGpu(1, 3, UUIDS[3]))
    assert parse_visible("2,0", FOUR) == (VisibleGpu(0, 2, UUIDS[2]), VisibleGpu(1, 0, UUIDS[0]))


def test_the_list_ends_at_the_first_entry_that_names_no_gpu() -> None:
    assert [g.index for g in parse_visible("0,1", FOUR)] == [0, 1]
    assert [g.index for g in parse_visible("3,7,1", FOUR)] == [3]  # there is no GPU 7
    assert [g.index for g in parse_visible("2,-1,0", FOUR)] == [2]


def test_uuids_and_unique_uuid_prefixes_name_gpus() -> None:
    assert parse_visible(f"{UUIDS[2]},{UUIDS[0]}", FOUR) == (VisibleGpu(0, 2, UUIDS[2]),
                                                             VisibleGpu(1, 0, UUIDS[0]))
    assert parse_visible("GPU-5f6a", FOUR) == (VisibleGpu(0, 1, UUIDS[1]),)
    assert parse_visible("GPU-, 0", FOUR) == ()  # a prefix of every UUID names none


def test_without_a_driver_list_every_well_formed_entry_is_taken_at_its_word() -> None:
    assert parse_visible("1,3", None) == (VisibleGpu(0, 1, None), VisibleGpu(1, 3, None))
    assert parse_visible("GPU-abc,5", None) == (VisibleGpu(0, None, "GPU-abc"), VisibleGpu(1, 5, None))
    assert parse_visible("0,-1,2", None) == (VisibleGpu(0, 0, None),)


def test_pretending_takes_cuda_visible_devices_without_asking_a_driver() -> None:
    assert discover_visible_gpus({PRETEND_ENV: "1", "CUDA_VISIBLE_DEVICES": "1,3"}) == (
        VisibleGpu(0, 1, None), VisibleGpu(1, 3, None))
    assert discover_visible_gpus({PRETEND_ENV: "1", "CUDA_VISIBLE_DEVICES": ""}) == ()
    assert discover_visible_gpus({PRETEND_ENV: "1"}) == ()


def test_pretend_off_asks_the_driver() -> None:
    """With PRETEND off (or "0") the entries must name GPUs the driver lists: on a machine without
    nvidia-smi, none does, whatever CUDA_VISIBLE_DEVICES says."""
    if shutil.which("nvidia-smi") is not None:
        pytest.skip("nvidia-smi is here: the driver's list is this machine's")
    assert discover_visible_gpus({PRETEND_ENV: "0", "CUDA_VISIBLE_DEVICES": "0,1"}) == ()
    assert discover_visible_gpus({}) == ()
