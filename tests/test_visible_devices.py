"""CUDA_VISIBLE_DEVICES parsing and matching to NVML devices by UUID."""

from __future__ import annotations

import pytest

from tests.fake_nvml import FakeMig, FakeNvml, a100, h100
from gpuprof_jupyter.core.sources.nvml import query as q
from gpuprof_jupyter.core.sources.nvml.visible_devices import (
    NvmlGpu,
    NvmlMig,
    enumerate_nvml_devices,
    parse_cuda_visible_devices,
    select_visible,
)

U0 = "GPU-8e2f0a11-1111-2222-3333-444444444444"
U1 = "GPU-8e2f0b22-5555-6666-7777-888888888888"
U2 = "GPU-12345678-9999-aaaa-bbbb-cccccccccccc"
M0 = "MIG-aaaa1111-0000-0000-0000-000000000001"
M1 = "MIG-aaaa2222-0000-0000-0000-000000000002"


def _gpus() -> list[NvmlGpu]:
    migs = (
        NvmlMig(M0, "h-mig0", parent_index=2, mig_index=0, gpu_instance_id=1, compute_instance_id=0),
        NvmlMig(M1, "h-mig1", parent_index=2, mig_index=1, gpu_instance_id=2, compute_instance_id=0),
    )
    return [
        NvmlGpu(0, U0, "h0", "NVIDIA A100-SXM4-40GB"),
        NvmlGpu(1, U1, "h1", "NVIDIA A100-SXM4-40GB"),
        NvmlGpu(2, U2, "h2", "NVIDIA A100-SXM4-40GB", mig_enabled=True, migs=migs),
    ]


def _uuids(value, gpus=None):
    return [d.uuid for d in select_visible(value, gpus or _gpus()).devices]


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, None),
        ("", []),
        ("-1", []),
        ("0,1", ["0", "1"]),
        (" 1 , 0 ", ["1", "0"]),
        ("0,-1,1", ["0"]),
        ("0,,1", ["0"]),
        ("1,foo,0", ["1"]),
        ("GPU-8e2f0a11,1", ["GPU-8e2f0a11", "1"]),
        (f"{M0}", [M0]),
        ("GPU-", []),
        ("007", ["7"]),
    ],
)
def test_parse(value, expected):
    assert parse_cuda_visible_devices(value) == expected


def test_unset_means_every_gpu_in_nvml_order():
    assert _uuids(None) == [U0, U1, U2]


def test_empty_and_minus_one_mean_none():
    assert _uuids("") == []
    sel = select_visible("-1", _gpus())
    assert sel.devices == []
    assert any("'-1'" in n for n in sel.notes)


def test_indices_keep_their_order():
    sel = select_visible("1,0", _gpus())
    assert [d.uuid for d in sel.devices] == [U1, U0]
    assert [d.visible_index for d in sel.devices] == [0, 1]
    assert [d.gpu.index for d in sel.devices] == [1, 0]


def test_out_of_range_index_stops_the_list():
    sel = select_visible("1,5,0", _gpus())
    assert [d.uuid for d in sel.devices] == [U1]
    assert any("'5'" in n and "out of range" in n for n in sel.notes)


def test_invalid_entry_stops_the_list():
    assert _uuids("2,abc,0") == [U2]
    assert _uuids("0,-1,1") == [U0]


def test_full_gpu_uuid_and_unique_prefix():
    assert _uuids(f"{U2},{U0}") == [U2, U0]
    assert _uuids("GPU-1234,GPU-8e2f0b") == [U2, U1]
    assert _uuids(U1.upper().replace("GPU-", "GPU-")) == [U1]  # case-insensitive hex


def test_ambiguous_prefix_is_invalid_and_stops():
    sel = select_visible("GPU-1234,GPU-8e2f,0", _gpus())
    assert [d.uuid for d in sel.devices] == [U2]
    assert any("ambiguous" in n for n in sel.notes)


def test_unknown_uuid_stops():
    assert _uuids("0,GPU-ffff,1") == [U0]


def test_mig_uuid_matches_mig_device_of_parent():
    sel = select_visible(f"{M1}", _gpus())
    (dev,) = sel.devices
    assert dev.uuid == M1
    assert dev.mig.gpu_instance_id == 2
    assert dev.gpu.uuid == U2  # parent
    assert dev.handle == "h-mig1"


def test_mig_uuid_prefix_and_legacy_form():
    assert _uuids("MIG-aaaa1") == [M0]
    assert _uuids(f"MIG-{U2}/2/0") == [M1]
    assert _uuids(f"MIG-{U2}/9/0,0") == []  # no such GPU instance: stops


def test_duplicate_device_stops():
    sel = select_visible(f"0,{U0},1", _gpus())
    assert [d.uuid for d in sel.devices] == [U0]
    assert any("twice" in n for n in sel.notes)


def test_index_of_gpu_in_mig_mode_is_noted():
    sel = select_visible("2", _gpus())
    assert [d.uuid for d in sel.devices] == [U2]
    assert any("MIG mode" in n for n in sel.notes)


def test_mixed_models_warn_about_cuda_device_order():
    gpus = [NvmlGpu(0, U0, "h0", "NVIDIA A100"), NvmlGpu(1, U1, "h1", "NVIDIA H100")]
    assert any("CUDA_DEVICE_ORDER" in n for n in select_visible("0,1", gpus).notes)
    assert not any("CUDA_DEVICE_ORDER" in n for n in select_visible("0,1", gpus, "PCI_BUS_ID").notes)
    assert not any("CUDA_DEVICE_ORDER" in n for n in select_visible(f"{U1}", gpus).notes)


def test_gpu_nvml_cannot_open_is_skipped_by_index():
    gpus = [NvmlGpu(0, None, None), NvmlGpu(1, U1, "h1")]
    assert _uuids(None, gpus) == [U1]
    assert _uuids("0,1", gpus) == []  # CUDA could not use GPU 0 either: stop


def test_enumerate_through_fake_nvml_with_mig():
    parent = h100(
        1,
        mig_mode=True,
        migs=[FakeMig("MIG-11111111-aaaa-bbbb-cccc-000000000001", gpu_instance_id=3),
              FakeMig("MIG-22222222-aaaa-bbbb-cccc-000000000002", gpu_instance_id=5, compute_instance_id=1)],
    )
    with FakeNvml([a100(0), parent]):
        q.acquire()
        try:
            gpus = enumerate_nvml_devices()
        finally:
            q.release()
    assert [g.uuid for g in gpus] == [a100(0).uuid, parent.uuid]
    assert gpus[0].mig_enabled is False and gpus[0].migs == ()
    assert gpus[1].mig_enabled is True
    assert [(m.uuid[:12], m.gpu_instance_id, m.compute_instance_id) for m in gpus[1].migs] == [
        ("MIG-11111111", 3, 0),
        ("MIG-22222222", 5, 1),
    ]
    sel = select_visible("MIG-2222", gpus)
    assert sel.devices[0].mig.gpu_instance_id == 5
    assert sel.devices[0].gpu.index == 1
