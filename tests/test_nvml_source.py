"""NvmlSource against a fake NVML library placed below nvidia-ml-py (see fake_nvml.py).

pynvml's real wrappers, structs and NVMLError classes run in every test here.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import pynvml
import pytest

from tests.fake_nvml import (
    GIB,
    GPM_DRAM_BW_UTIL,
    GPM_PCIE_TX,
    GPM_SM_UTIL,
    FakeMig,
    FakeNvml,
    a100,
    h100,
)
from gpuprof_jupyter.core.metrics import METRICS, PROVENANCE, decode_throttle_reasons, describe_provenance
from gpuprof_jupyter.core.sources.nvml import query as q
from gpuprof_jupyter.core.sources.base import SourceUnavailable
from gpuprof_jupyter.core.sources.nvml import NvmlSource

MIB = 1024 * 1024
ALL_GPM = {
    "sm_util", "gpu_busy", "mem_bw_util", "sm_occupancy", "tensor_util", "power_w", "energy_j",
    "gpu_mem_used_bytes", "gpu_mem_total_bytes", "gpu_temp_c", "sm_clock_mhz", "mem_clock_mhz",
    "throttle_reasons", "pcie_tx_bytes_s", "pcie_rx_bytes_s",
}
SLOW_LANE = "gpuprof-nvml-slow-lane"


class FakeClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    yield
    leaked = [t for t in threading.enumerate() if t.name == SLOW_LANE]
    assert not leaked, "a test left the NVML slow-lane thread running"


@pytest.fixture
def start():
    """start(fake, **source_kwargs) -> opened NvmlSource; closes and uninstalls after."""
    opened: list[tuple[FakeNvml, NvmlSource]] = []

    def _start(fake: FakeNvml, **kwargs) -> NvmlSource:
        fake.install()
        src = NvmlSource(**kwargs)
        opened.append((fake, src))
        src.opened_infos = src.open()  # what open() returned, for the tests
        return src

    yield _start
    for fake, src in reversed(opened):
        src.close()
        fake.uninstall()


def _notes_with(src: NvmlSource, *words: str) -> list[str]:
    return [n for n in src.notes() if all(w in n for w in words)]


# ----------------------------------------------------------------------------- normal reads
def test_two_gpus_every_metric_with_units_and_provenance(start):
    fake = FakeNvml([h100(0), h100(1, power_instant_mw=123_456, throttle_reasons=0x4 | 0x40)])
    clock = FakeClock()
    src = start(fake, clock=clock)
    infos = {d.key: d for d in src.opened_infos}
    assert list(infos) == ["gpu0", "gpu1"]
    info = infos["gpu1"]
    assert info.name == "NVIDIA H100 80GB HBM3"
    assert info.uuid == fake.gpus[1].uuid
    assert info.index == 1 and info.kind == "gpu" and info.simulated is False
    assert info.power_limit_w == 700.0  # mW -> W
    assert info.memory_total_bytes == 80 * GIB
    assert info.mig_parent_uuid is None

    fake.gpus[0].energy_mj += 7_500  # mJ since open()
    fake.gpus[0].memory_used = 30 * GIB
    clock.t += 1.0
    r = src.read()
    assert set(r) == {"gpu0", "gpu1"}
    for key in r:
        assert set(r[key]) == ALL_GPM
        assert all(isinstance(v, float) for v in r[key].values())
    g0, g1 = r["gpu0"], r["gpu1"]
    assert g0["sm_util"] == 62.5 and g0["sm_occupancy"] == 31.25 and g0["tensor_util"] == 40.0
    assert g0["mem_bw_util"] == 55.0
    assert g0["gpu_busy"] == 90.0
    assert g0["power_w"] == pytest.approx(275.5)
    assert g1["power_w"] == pytest.approx(123.456)
    assert g0["energy_j"] == pytest.approx(7.5)
    assert g1["energy_j"] == 0.0  # counter did not move: a real zero
    assert g0["gpu_mem_used_bytes"] == 30 * GIB and g0["gpu_mem_total_bytes"] == 80 * GIB
    assert g0["gpu_temp_c"] == 61.0
    assert g0["sm_clock_mhz"] == 1410.0 and g0["mem_clock_mhz"] == 1215.0
    assert decode_throttle_reasons(g1["throttle_reasons"]) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert g0["pcie_tx_bytes_s"] == 100 * MIB and g0["pcie_rx_bytes_s"] == 300 * MIB  # MiB/s -> B/s

    prov = src.provenance()
    assert prov["gpu0"]["sm_util"] == "gpm.sm_util"
    assert prov["gpu0"]["gpu_busy"] == "nvml.utilization.gpu"
    assert prov["gpu0"]["mem_bw_util"] == "gpm.dram_bw_util"
    assert prov["gpu0"]["power_w"] == "nvml.field.power_instant"
    assert prov["gpu0"]["energy_j"] == "nvml.field.total_energy"
    assert prov["gpu0"]["pcie_tx_bytes_s"] == "gpm.pcie"
    for tags in prov.values():
        assert set(tags) == ALL_GPM
        assert all(tag in PROVENANCE for tag in tags.values())
        assert all(metric in METRICS for metric in tags)
    assert src.notes() == []
    ctx = src.context()
    assert ctx["driver_version"] == "550.54.15"
    assert ctx["cuda_driver_version"] == "12.4"
    assert ctx["nvml_version"] == "12.550.54.15"
    # GPM gives PCIe: no slow lane, no blocking PCIe call at all
    assert fake.count("nvmlDeviceGetPcieThroughput") == 0
    assert not [t for t in threading.enumerate() if t.name == SLOW_LANE]


def test_open_returns_device_infos(start):
    fake = FakeNvml([a100(0)])
    fake.install()
    src = NvmlSource()
    try:
        (info,) = src.open()
        assert info.key == "gpu0" and info.name == "NVIDIA A100-SXM4-40GB"
        assert info.memory_total_bytes == 40 * GIB and info.power_limit_w == 400.0
        assert info.extra["gpm"] is False and info.extra["nvml_index"] == 0
    finally:
        src.close()
        fake.uninstall()


def test_a100_without_gpm_vs_h100_with_gpm(start):
    fake = FakeNvml(
        [a100(0, util_gpu=88, util_mem=33), h100(1, util_gpu=97)],
    )
    fake.gpus[1].gpm_values[GPM_SM_UTIL] = 41.0
    src = start(fake, slow_interval_s=60)
    r = src.read()
    g0, g1 = r["gpu0"], r["gpu1"]
    # A100: sm_util is utilization.gpu, labelled kernel-active time
    assert g0["sm_util"] == 88.0 == g0["gpu_busy"]
    assert g0["mem_bw_util"] == 33.0
    assert "sm_occupancy" not in g0 and "tensor_util" not in g0
    prov = src.provenance()
    assert prov["gpu0"]["sm_util"] == "nvml.utilization.gpu"
    assert "kernel-active" in describe_provenance(prov["gpu0"]["sm_util"])
    assert prov["gpu0"]["mem_bw_util"] == "nvml.utilization.memory"
    assert "sm_occupancy" not in prov["gpu0"]
    assert len(_notes_with(src, "gpu0:", "tensor_util not supported by this GPU (no GPM)")) == 1
    # H100: sm_util from GPM, gpu_busy still from utilization.gpu
    assert g1["sm_util"] == 41.0
    assert g1["gpu_busy"] == 97.0
    assert prov["gpu1"]["sm_util"] == "gpm.sm_util"
    assert prov["gpu1"]["gpu_busy"] == "nvml.utilization.gpu"
    assert not _notes_with(src, "gpu1:")
    # GPM values follow the device between reads
    fake.gpus[1].gpm_values[GPM_SM_UTIL] = 12.5
    assert src.read()["gpu1"]["sm_util"] == 12.5


# ------------------------------------------------------------------------ failing metrics
def test_not_supported_metric_dropped_with_one_note_and_not_retried(start):
    fake = FakeNvml([h100(0), h100(1, errors={"nvmlDeviceGetTemperature": pynvml.NVML_ERROR_NOT_SUPPORTED})])
    src = start(fake)
    for _ in range(3):
        r = src.read()
        assert r["gpu0"]["gpu_temp_c"] == 61.0
        assert "gpu_temp_c" not in r["gpu1"]  # absent, never 0
        assert r["gpu1"]["power_w"] > 0  # the rest of gpu1 goes on
    notes = _notes_with(src, "gpu_temp_c")
    assert notes == [notes[0]] and notes[0].startswith("gpu1: gpu_temp_c not supported by this GPU")
    assert fake.count("nvmlDeviceGetTemperature") == 4 + 1  # gpu0: open + 3 reads; gpu1: once
    assert "gpu_temp_c" not in src.provenance()["gpu1"]
    assert src.provenance()["gpu0"]["gpu_temp_c"] == "nvml.temperature"


def test_missing_function_dropped_with_one_note(start):
    fake = FakeNvml(
        [a100(0), a100(1)],
        missing_functions={"nvmlDeviceGetTemperature", "nvmlDeviceGetTemperatureV"},
    )
    src = start(fake, slow_interval_s=60)
    for _ in range(3):
        r = src.read()
        assert "gpu_temp_c" not in r["gpu0"] and "gpu_temp_c" not in r["gpu1"]
    notes = _notes_with(src, "gpu_temp_c")
    assert len(notes) == 1, src.notes()  # one note for every GPU, not one per GPU or per read
    assert "Function Not Found" in notes[0] and "nvmlDeviceGetTemperatureV" in notes[0]
    assert {"nvmlDeviceGetTemperature", "nvmlDeviceGetTemperatureV"} <= q.missing_functions()


def test_missing_function_with_a_fallback_uses_it(start):
    fake = FakeNvml(
        [a100(0, throttle_reasons=0x1)],
        missing_functions={"nvmlDeviceGetTemperature", "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetFieldValues"},
    )
    src = start(fake, slow_interval_s=60)
    fake.gpus[0].energy_mj += 1_250
    r = src.read()["gpu0"]
    assert r["gpu_temp_c"] == 61.0  # nvmlDeviceGetTemperatureV
    assert r["throttle_reasons"] == 1.0  # nvmlDeviceGetCurrentClocksThrottleReasons
    assert r["power_w"] == 250.0  # nvmlDeviceGetPowerUsage (1 s average), mW -> W
    assert r["energy_j"] == pytest.approx(1.25)  # nvmlDeviceGetTotalEnergyConsumption
    prov = src.provenance()["gpu0"]
    assert prov["throttle_reasons"] == "nvml.clocks_throttle_reasons"
    assert prov["power_w"] == "nvml.power_usage"
    assert prov["energy_j"] == "nvml.total_energy"
    assert len(_notes_with(src, "gpu0: instant power not available")) == 1


def test_no_permission_dropped_with_note(start):
    fake = FakeNvml([h100(0, errors={"nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_NO_PERMISSION})])
    src = start(fake)
    r = src.read()["gpu0"]
    assert "gpu_mem_used_bytes" not in r and "gpu_mem_total_bytes" not in r
    assert r["sm_util"] == 62.5
    (note,) = _notes_with(src, "gpu_mem_used_bytes")
    assert note.startswith("gpu0:") and "not permitted" in note and "Insufficient Permissions" in note
    assert fake.count("nvmlDeviceGetMemoryInfo") == 1


def test_instant_power_field_unsupported_falls_back_to_average(start):
    fake = FakeNvml([h100(0, field_errors={pynvml.NVML_FI_DEV_POWER_INSTANT: pynvml.NVML_ERROR_NOT_SUPPORTED})])
    src = start(fake)
    fake.gpus[0].energy_mj += 2_000
    r = src.read()["gpu0"]
    assert r["power_w"] == 250.0
    assert r["energy_j"] == pytest.approx(2.0)  # energy still from the field batch
    assert src.provenance()["gpu0"]["power_w"] == "nvml.power_usage"
    assert src.provenance()["gpu0"]["energy_j"] == "nvml.field.total_energy"


def test_gpm_metric_unsupported_falls_back_to_nvml(start):
    fake = FakeNvml([h100(0, gpm_errors={GPM_DRAM_BW_UTIL: pynvml.NVML_ERROR_NOT_SUPPORTED,
                                         GPM_PCIE_TX: pynvml.NVML_ERROR_NOT_SUPPORTED})])
    src = start(fake, slow_interval_s=60)
    r = src.read()["gpu0"]  # GPM tells per-metric support only once it has two samples
    assert r["mem_bw_util"] == 45.0  # utilization.memory, from this very sample on
    assert r["sm_util"] == 62.5  # still GPM
    # RX is not left on GPM while TX moves to the slow lane (whose first pass may land now)
    assert r.get("pcie_rx_bytes_s") in (None, 50_000 * 1024)
    assert src.wait_slow_lane(1, timeout=5)
    r = src.read()["gpu0"]
    assert r["pcie_tx_bytes_s"] == 2_000 * 1024  # slow lane, KB/s -> B/s
    assert r["pcie_rx_bytes_s"] == 50_000 * 1024
    prov = src.provenance()["gpu0"]
    assert prov["mem_bw_util"] == "nvml.utilization.memory"
    assert prov["sm_util"] == "gpm.sm_util"
    assert prov["pcie_tx_bytes_s"] == "nvml.pcie_throughput"
    assert len(_notes_with(src, "gpu0: GPM mem_bw_util")) == 1


def test_gpm_sampling_refused_falls_back_for_the_whole_device(start):
    fake = FakeNvml([h100(0, errors={"nvmlGpmSampleGet": pynvml.NVML_ERROR_NO_PERMISSION})])
    src = start(fake, slow_interval_s=60)
    r = src.read()["gpu0"]
    assert r["sm_util"] == 90.0 and src.provenance()["gpu0"]["sm_util"] == "nvml.utilization.gpu"
    assert "tensor_util" not in r and "sm_occupancy" not in r
    assert len(_notes_with(src, "gpu0: GPM unavailable")) == 1


# ------------------------------------------------------------------------------ lost GPUs
def test_gpu_lost_mid_run_ends_its_series_only(start):
    clock = FakeClock(50.0)
    fake = FakeNvml([a100(0), a100(1)])
    src = start(fake, clock=clock, slow_interval_s=60)
    for _ in range(2):
        clock.t += 1
        assert set(src.read()) == {"gpu0", "gpu1"}
    fake.lose(0)
    clock.t += 1
    r = src.read()
    assert set(r) == {"gpu1"}
    assert r["gpu1"]["power_w"] == pytest.approx(275.5)
    (note,) = _notes_with(src, "gpu0: GPU lost")
    assert "3.0 s after start" in note and "GPU is lost" in note
    calls_before = len(fake.calls)
    for _ in range(3):
        assert set(src.read()) == {"gpu1"}
    assert len(fake.calls) > calls_before
    assert "gpu0" in src.provenance()  # its recorded series keeps its provenance


def test_gpu_lost_after_n_reads(start):
    fake = FakeNvml([a100(0, lost_after_reads=3), h100(1)])  # open's baseline + 2 reads
    src = start(fake, slow_interval_s=60)
    assert set(src.read()) == {"gpu0", "gpu1"}
    assert set(src.read()) == {"gpu0", "gpu1"}
    assert set(src.read()) == {"gpu1"}
    assert len(_notes_with(src, "gpu0: GPU lost")) == 1


def test_unknown_error_on_every_call_counts_as_lost(start):
    fake = FakeNvml([h100(0), h100(1)])
    src = start(fake)
    src.read()
    fake.gpus[1].unknown = True
    assert set(src.read()) == {"gpu0"}
    assert len(_notes_with(src, "gpu1: GPU lost", "Unknown")) == 1


def test_every_gpu_lost_at_open_is_unavailable():
    fake = FakeNvml([a100(0, lost=True)])
    with fake:
        with pytest.raises(SourceUnavailable, match="lost"):
            NvmlSource().open()
        assert not fake.initialised


# ------------------------------------------------------------------------ no NVML at all
def test_no_nvml_library_is_unavailable():
    with FakeNvml(library_present=False):
        src = NvmlSource()
        with pytest.raises(SourceUnavailable, match="libnvidia-ml.so.1"):
            src.open()
        src.close()


def test_driver_not_loaded_is_unavailable():
    with FakeNvml([a100(0)], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED):
        with pytest.raises(SourceUnavailable, match="driver not loaded"):
            NvmlSource().open()


def test_no_gpu_is_unavailable_and_nvml_is_shut_down():
    fake = FakeNvml([])
    with fake:
        with pytest.raises(SourceUnavailable, match="sees no GPU"):
            NvmlSource().open()
        assert fake.init_count == 1 and fake.shutdown_count == 1


@pytest.mark.parametrize("value", ["", "-1", "7"])
def test_cuda_visible_devices_hiding_everything_is_unavailable(monkeypatch, value):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    fake = FakeNvml([a100(0), a100(1)])
    with fake:
        with pytest.raises(SourceUnavailable, match="CUDA_VISIBLE_DEVICES"):
            NvmlSource().open()
        assert not fake.initialised


# ---------------------------------------------------------------------------------- energy
def test_energy_is_the_counter_delta_since_open(start):
    fake = FakeNvml([h100(0, energy_mj=5_000_000_000)])
    src = start(fake)
    assert src.read()["gpu0"]["energy_j"] == 0.0
    fake.gpus[0].energy_mj += 2_500
    assert src.read()["gpu0"]["energy_j"] == pytest.approx(2.5)
    fake.gpus[0].energy_mj += 1_000_000
    assert src.read()["gpu0"]["energy_j"] == pytest.approx(1002.5)
    assert src.provenance()["gpu0"]["energy_j"] == "nvml.field.total_energy"
    assert not _notes_with(src, "energy")


def test_energy_without_counter_integrates_power(start):
    clock = FakeClock(10.0)
    gpu = a100(0, errors={"nvmlDeviceGetTotalEnergyConsumption": pynvml.NVML_ERROR_NOT_SUPPORTED})
    fake = FakeNvml([gpu])
    src = start(fake, clock=clock, slow_interval_s=60)
    assert src.provenance()["gpu0"]["energy_j"] == "integral.power_w"
    assert len(_notes_with(src, "gpu0: no energy counter")) == 1
    clock.t = 12.0
    r = src.read()["gpu0"]
    assert r["power_w"] == pytest.approx(275.5)
    assert r["energy_j"] == pytest.approx(2 * 275.5)  # since open() at t=10
    gpu.power_instant_mw = 100_000
    clock.t = 13.0
    assert src.read()["gpu0"]["energy_j"] == pytest.approx(551.0 + (275.5 + 100.0) / 2)
    # a gap in power (transient error) is not integrated, and energy is then absent
    gpu.field_errors[pynvml.NVML_FI_DEV_POWER_INSTANT] = pynvml.NVML_ERROR_TIMEOUT
    clock.t = 20.0
    r = src.read()["gpu0"]
    assert "power_w" not in r and "energy_j" not in r
    del gpu.field_errors[pynvml.NVML_FI_DEV_POWER_INSTANT]
    clock.t = 21.0
    assert src.read()["gpu0"]["energy_j"] == pytest.approx(738.75)
    clock.t = 22.0
    assert src.read()["gpu0"]["energy_j"] == pytest.approx(838.75)


def test_energy_counter_across_a_gap_counts_and_is_flagged(start):
    clock = FakeClock(100.0)
    gpu = h100(0, energy_mj=1_000_000)
    src = start(FakeNvml([gpu]), clock=clock)
    src.set_session_interval(0.1)
    for t, mj in ((100.1, 300), (100.2, 300)):
        clock.t, gpu.energy_mj = t, gpu.energy_mj + mj
        src.read()
    assert "energy_gaps" not in src.final_context()
    clock.t = 101.0  # 0.8 s after the previous read: more than two intervals, a gap
    gpu.energy_mj += 40_000  # used during the gap: the counter saw it
    r = src.read()["gpu0"]
    assert r["energy_j"] == pytest.approx(0.6 + 40.0)
    assert src.final_context()["energy_gaps"] == [
        {"device": "gpu0", "start_mono": 100.2, "end_mono": 101.0, "energy": "counted"}]
    assert len(_notes_with(src, "gpu0: energy_j after a sampler gap", "counter's difference")) == 1
    clock.t = 101.15  # 1.5 intervals late: not a gap
    gpu.energy_mj += 100
    assert src.read()["gpu0"]["energy_j"] == pytest.approx(40.7)
    assert len(src.final_context()["energy_gaps"]) == 1


def test_power_integral_restarts_after_a_gap(start):
    clock = FakeClock(10.0)
    gpu = a100(0, errors={"nvmlDeviceGetTotalEnergyConsumption": pynvml.NVML_ERROR_NOT_SUPPORTED})
    src = start(FakeNvml([gpu]), clock=clock, slow_interval_s=60)
    src.set_session_interval(1.0)
    clock.t = 11.0
    assert src.read()["gpu0"]["energy_j"] == pytest.approx(275.5)
    gpu.power_instant_mw = 100_000
    clock.t = 20.0  # 9 s after the previous read: a gap; its power is unknown, not integrated
    r = src.read()["gpu0"]
    assert r["power_w"] == pytest.approx(100.0)  # the reading itself, never interpolated
    assert r["energy_j"] == pytest.approx(275.5)
    clock.t = 21.0  # a new segment starts at the read after the gap
    assert src.read()["gpu0"]["energy_j"] == pytest.approx(375.5)
    assert src.final_context()["energy_gaps"] == [
        {"device": "gpu0", "start_mono": 11.0, "end_mono": 20.0, "energy": "not integrated"}]
    assert len(_notes_with(src, "gpu0: energy_j leaves out sampler gaps")) == 1


def test_without_the_session_interval_no_gap_is_seen(start):
    clock = FakeClock(10.0)
    gpu = a100(0, errors={"nvmlDeviceGetTotalEnergyConsumption": pynvml.NVML_ERROR_NOT_SUPPORTED})
    src = start(FakeNvml([gpu]), clock=clock, slow_interval_s=60)
    clock.t = 20.0
    assert src.read()["gpu0"]["energy_j"] == pytest.approx(2755.0)
    assert "energy_gaps" not in src.final_context()
    with pytest.raises(ValueError):
        src.set_session_interval(0)


def test_native_intervals_are_declared():
    assert NvmlSource.interval_s is None  # the fast lane: the session's interval
    assert NvmlSource().slow_lane_interval_s == 1.0
    assert NvmlSource(slow_interval_s=2.5).slow_lane_interval_s == 2.5


# ------------------------------------------------------------------------- PCIe slow lane
def test_pcie_slow_lane_never_called_from_read(start):
    fake = FakeNvml([a100(0, pcie_tx_kbs=2_000, pcie_rx_kbs=50_000), a100(1)],
                    latency={"nvmlDeviceGetPcieThroughput": 0.02})
    src = start(fake, slow_interval_s=0.05)
    assert src.wait_slow_lane(1, timeout=5)
    me = threading.get_ident()
    r = src.read()
    assert fake.count("nvmlDeviceGetPcieThroughput", thread=me) == 0  # the 20 ms call never blocks read()
    assert fake.count("nvmlDeviceGetPcieThroughput") >= 4  # 2 GPUs x (TX, RX), other thread
    assert r["gpu0"]["pcie_tx_bytes_s"] == 2_000 * 1024.0  # KB/s -> B/s
    assert r["gpu0"]["pcie_rx_bytes_s"] == 50_000 * 1024.0
    assert src.provenance()["gpu0"]["pcie_tx_bytes_s"] == "nvml.pcie_throughput"
    fake.gpus[0].pcie_tx_kbs = 7
    passes = src._slow_lane.passes
    assert src.wait_slow_lane(passes + 2, timeout=5)
    for _ in range(5):
        assert src.read()["gpu0"]["pcie_tx_bytes_s"] == 7 * 1024.0
    assert fake.count("nvmlDeviceGetPcieThroughput", thread=me) == 0
    src.close()  # joins the slow lane (a lane that never ended would fail the next line)
    assert not [t for t in threading.enumerate() if t.name == SLOW_LANE]


def test_pcie_slow_lane_records_its_own_gaps(start):
    clock = FakeClock(50.0)
    src = start(FakeNvml([a100(0)]), clock=clock, slow_interval_s=0.05)
    assert src.wait_slow_lane(2, timeout=5)
    assert src.take_gaps() == []  # passes on time (the fake clock stands still)
    passes = src._slow_lane.passes
    clock.t = 60.0  # the next pass starts 10 s after the previous one: 200 of its intervals
    assert src.wait_slow_lane(passes + 2, timeout=5)
    gaps = src.take_gaps()
    assert [(g.source, g.start, g.end) for g in gaps] == [("nvml.pcie", 50.0, 60.0)]
    assert src.take_gaps() == []


def test_pcie_cache_too_old_is_not_reported(start):
    clock = FakeClock(0.0)
    fake = FakeNvml([a100(0)])
    src = start(fake, clock=clock, slow_interval_s=60)
    assert src.wait_slow_lane(1, timeout=5)
    assert "pcie_rx_bytes_s" in src.read()["gpu0"]
    clock.t = 1000.0  # the slow lane has not run since: its value is stale
    r = src.read()["gpu0"]
    assert "pcie_rx_bytes_s" not in r and "pcie_tx_bytes_s" not in r


def test_pcie_unsupported_dropped_by_slow_lane(start):
    fake = FakeNvml([a100(0, errors={"nvmlDeviceGetPcieThroughput": pynvml.NVML_ERROR_NOT_SUPPORTED})])
    src = start(fake, slow_interval_s=0.01)
    assert src.wait_slow_lane(3, timeout=5)
    assert "pcie_tx_bytes_s" not in src.read()["gpu0"]
    assert fake.count("nvmlDeviceGetPcieThroughput") == 1
    assert len(_notes_with(src, "gpu0: pcie_tx_bytes_s, pcie_rx_bytes_s not supported")) == 1


# ------------------------------------------------------------------------ device selection
def test_devices_selects_among_visible_ones(monkeypatch, start):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    fake = FakeNvml([a100(0), a100(1), a100(2)])
    src = start(fake, devices=[1], slow_interval_s=60)
    (info,) = src.opened_infos
    assert info.key == "gpu1" and info.index == 1
    assert info.uuid == fake.gpus[0].uuid and info.extra["nvml_index"] == 0
    fake.gpus[0].memory_used = 1 * GIB
    fake.gpus[2].memory_used = 2 * GIB
    r = src.read()
    assert set(r) == {"gpu1"}
    assert r["gpu1"]["gpu_mem_used_bytes"] == 1 * GIB


def test_devices_not_visible_is_an_error(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with FakeNvml([a100(0), a100(1)]) as fake:
        with pytest.raises(ValueError, match=r"devices \[1\]"):
            NvmlSource(devices=[1]).open()
        assert not fake.initialised


def test_cuda_visible_devices_uuid_prefix_and_order(monkeypatch, start):
    fake = FakeNvml([a100(0), h100(1), a100(2)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{fake.gpus[2].uuid[:12]},GPU-h100")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    src = start(fake, slow_interval_s=60)
    assert [(d.key, d.uuid) for d in src.opened_infos] == [("gpu0", fake.gpus[2].uuid), ("gpu1", fake.gpus[1].uuid)]
    r = src.read()
    assert "tensor_util" in r["gpu1"] and "tensor_util" not in r["gpu0"]


def test_invalid_entry_stops_the_list(monkeypatch, start):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,-1,0")
    fake = FakeNvml([a100(0), a100(1)])
    src = start(fake, slow_interval_s=60)
    assert [d.uuid for d in src.opened_infos] == [fake.gpus[1].uuid]
    assert _notes_with(src, "'-1'")


# ------------------------------------------------------------------------------------ MIG
def _mig_parent(gpm: bool = True):
    make = h100 if gpm else a100
    return make(
        0,
        mig_mode=True,
        power_instant_mw=333_000,
        migs=[
            FakeMig("MIG-0f0f0f0f-1111-2222-3333-000000000001", gpu_instance_id=1, memory_used=3 * GIB),
            FakeMig("MIG-0f0f0f0f-1111-2222-3333-000000000002", gpu_instance_id=2,
                    memory_total=20 * GIB, memory_used=5 * GIB,
                    gpm_values={GPM_SM_UTIL: 12.0, GPM_DRAM_BW_UTIL: 7.0,
                                pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 9.0,
                                pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 3.0}),
        ],
    )


def test_mig_slice_memory_own_utilization_gpm_power_whole_gpu(monkeypatch, start):
    parent = _mig_parent(gpm=True)
    fake = FakeNvml([parent, a100(1)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", parent.migs[1].uuid)
    src = start(fake, slow_interval_s=60)
    (info,) = src.opened_infos
    assert info.key == "gpu0" and info.uuid == parent.migs[1].uuid
    assert info.mig_parent_uuid == parent.uuid
    assert info.memory_total_bytes == 20 * GIB
    assert "MIG" in info.name
    parent.energy_mj += 4_000
    r = src.read()["gpu0"]
    assert r["gpu_mem_used_bytes"] == 5 * GIB and r["gpu_mem_total_bytes"] == 20 * GIB
    assert r["sm_util"] == 12.0 and r["mem_bw_util"] == 7.0
    assert r["sm_occupancy"] == 9.0 and r["tensor_util"] == 3.0
    assert r["power_w"] == pytest.approx(333.0)  # the parent GPU's
    assert r["energy_j"] == pytest.approx(4.0)
    assert "gpu_busy" not in r and "pcie_tx_bytes_s" not in r
    prov = src.provenance()["gpu0"]
    assert prov["sm_util"] == "gpm.mig"
    assert prov["power_w"] == "nvml.field.power_instant.whole_gpu"
    assert prov["energy_j"] == "nvml.field.total_energy.whole_gpu"
    assert all(tag in PROVENANCE for tag in prov.values())
    assert len(_notes_with(src, "gpu0: MIG slice", "whole GPU")) == 1
    assert fake.count("nvmlGpmMigSampleGet") == 2  # open's baseline + one read


def test_mig_slice_without_gpm_has_no_utilization(monkeypatch, start):
    parent = _mig_parent(gpm=False)
    fake = FakeNvml([parent])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", parent.migs[0].uuid)
    src = start(fake, slow_interval_s=60)
    r = src.read()["gpu0"]
    assert r["gpu_mem_used_bytes"] == 3 * GIB
    assert not {"sm_util", "mem_bw_util", "gpu_busy", "sm_occupancy", "tensor_util"} & set(r)
    assert r["power_w"] == pytest.approx(333.0)
    assert src.provenance()["gpu0"]["power_w"].endswith(".whole_gpu")
    assert len(_notes_with(src, "gpu0:", "no GPM")) == 1


# ------------------------------------------------------------------------------ lifecycle
def test_close_stops_slow_lane_and_shuts_nvml_down():
    fake = FakeNvml([a100(0)])
    with fake:
        src = NvmlSource(slow_interval_s=0.01)
        src.open()
        assert src.wait_slow_lane(1)
        assert fake.initialised
        src.close()
        assert not fake.initialised and fake.shutdown_count == 1
        assert not [t for t in threading.enumerate() if t.name == SLOW_LANE]
        assert src.read() == {}
        src.close()  # idempotent
        src.open()  # and it can open again
        assert set(src.read()) == {"gpu0"}
        src.close()
        assert not fake.initialised


@pytest.mark.process
def test_importing_the_source_does_not_touch_cuda():
    code = "import sys, gpuprof_jupyter.core.sources.nvml; assert not [m for m in sys.modules if m.startswith('torch')]"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_nvml_call_goes_through_a_public_nvidia_ml_py_function(monkeypatch):
    """No private entry point into NVML: the C functions are reached only from inside
    nvidia-ml-py's public ``nvml*`` functions (a whole GPU with GPM, and a GPU without)."""
    fake = FakeNvml([h100(0), a100(1)])
    fake.install()
    inside, outside = [0], []
    real_pointer = pynvml._nvmlGetFunctionPointer

    def pointer(name):
        if not inside[0]:
            outside.append(name)
        return real_pointer(name)

    def public(fn):
        def call(*args, **kwargs):
            inside[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                inside[0] -= 1
        return call

    for name in dir(pynvml):
        fn = getattr(pynvml, name)
        if name.startswith("nvml") and callable(fn) and not isinstance(fn, type):
            monkeypatch.setattr(pynvml, name, public(fn))
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", pointer)
    src = NvmlSource(slow_interval_s=3600)
    try:
        src.open()
        readings = [src.read() for _ in range(3)]
    finally:
        src.close()
        monkeypatch.undo()
        fake.uninstall()
    assert {"sm_util", "power_w", "energy_j", "gpu_mem_used_bytes"} <= set(readings[-1]["gpu0"])
    assert {"gpu_busy", "power_w", "energy_j", "gpu_mem_used_bytes"} <= set(readings[-1]["gpu1"])
    assert not outside, f"NVML reached outside nvidia-ml-py's public functions: {sorted(set(outside))}"
