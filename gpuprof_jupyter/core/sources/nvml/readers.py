"""The NVML source's readers: one function per NVML call, and the one table of them.

Runs in the sampler process, and in the Jupyter server for its device list; never in the kernel.

Each reader fills ``out`` (metric -> value in the contract's unit) from one call to one of
nvidia-ml-py's public functions (through :func:`.query.query`), raises
:class:`.query.NvmlFailure` when the call fails, and returns the failed items of a
batched call that partly failed (FieldValues, GPM MetricsGet) for the fallbacks. All calls
are non-blocking; PCIe throughput (blocking) is the slow lane's (:mod:`.pcie`).
"""

from __future__ import annotations

import pynvml

from gpuprof_jupyter.core.sources.nvml import query as q
from gpuprof_jupyter.core.sources.nvml.device import NvmlDevice, Reader

FI_POWER = pynvml.NVML_FI_DEV_POWER_INSTANT
FI_ENERGY = pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
_TEMP_GPU = pynvml.NVML_TEMPERATURE_GPU
_CLOCK_SM = pynvml.NVML_CLOCK_SM
_CLOCK_MEM = pynvml.NVML_CLOCK_MEM
#: The member of a FieldValue's ``c_nvmlValue_t`` union that its ``valueType`` names.
_VALUE_MEMBER = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal", pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


def read_util(dev: NvmlDevice, out: dict) -> None:
    rates = q.query(pynvml.nvmlDeviceGetUtilizationRates, dev.handle)
    gpu = float(rates.gpu)
    out["gpu_busy"] = gpu
    if dev.util_sm:
        out["sm_util"] = gpu
    if dev.util_mem:
        out["mem_bw_util"] = float(rates.memory)


def read_memory(dev: NvmlDevice, out: dict) -> None:
    memory = q.query(pynvml.nvmlDeviceGetMemoryInfo, dev.handle)
    out["gpu_mem_used_bytes"] = float(memory.used)
    out["gpu_mem_total_bytes"] = float(memory.total)


def read_fields(dev: NvmlDevice, out: dict) -> list | None:
    failed = None
    for value in q.query(pynvml.nvmlDeviceGetFieldValues, dev.parent, dev.fields):
        field_id, ret = value.fieldId, value.nvmlReturn
        if ret:
            failed = (failed or []) + [(field_id, ret)]
            continue
        number = float(getattr(value.value, _VALUE_MEMBER.get(value.valueType, "uiVal")))
        if field_id == FI_POWER:
            out["power_w"] = number / 1000.0
        else:
            out["energy_j"] = dev.energy.from_counter(number)
    return failed


def read_power_usage(dev: NvmlDevice, out: dict) -> None:
    out["power_w"] = q.query(pynvml.nvmlDeviceGetPowerUsage, dev.parent) / 1000.0


def read_energy(dev: NvmlDevice, out: dict) -> None:
    out["energy_j"] = dev.energy.from_counter(float(q.query(pynvml.nvmlDeviceGetTotalEnergyConsumption, dev.parent)))


def read_temp(dev: NvmlDevice, out: dict) -> None:
    out["gpu_temp_c"] = float(q.query(pynvml.nvmlDeviceGetTemperature, dev.parent, _TEMP_GPU))


def read_temp_v(dev: NvmlDevice, out: dict) -> None:
    out["gpu_temp_c"] = float(q.query(pynvml.nvmlDeviceGetTemperatureV, dev.parent, _TEMP_GPU))


def read_sm_clock(dev: NvmlDevice, out: dict) -> None:
    out["sm_clock_mhz"] = float(q.query(pynvml.nvmlDeviceGetClockInfo, dev.parent, _CLOCK_SM))


def read_mem_clock(dev: NvmlDevice, out: dict) -> None:
    out["mem_clock_mhz"] = float(q.query(pynvml.nvmlDeviceGetClockInfo, dev.parent, _CLOCK_MEM))


def read_event_reasons(dev: NvmlDevice, out: dict) -> None:
    out["throttle_reasons"] = float(q.query(pynvml.nvmlDeviceGetCurrentClocksEventReasons, dev.parent))


def read_throttle_reasons(dev: NvmlDevice, out: dict) -> None:
    out["throttle_reasons"] = float(q.query(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, dev.parent))


def read_gpm(dev: NvmlDevice, out: dict) -> list | None:
    """GPM metrics between the previous sample and a new one (none on the first read)."""
    gpm = dev.gpm
    n = gpm.next
    if dev.is_mig:
        q.query(pynvml.nvmlGpmMigSampleGet, dev.parent, dev.gi_id, gpm.samples[n])
    else:
        q.query(pynvml.nvmlGpmSampleGet, dev.handle, gpm.samples[n])
    gpm.next = 1 - n
    if not gpm.primed:
        gpm.primed = True
        return None
    request = gpm.get[n]
    q.query(pynvml.nvmlGpmMetricsGet, request)
    raw = gpm.results.unpack_from(request)  # (ret0, value0, ret1, value1, ...)
    failed = None
    for (metric, scale), ret, value in zip(gpm.metrics, raw[0::2], raw[1::2]):
        if ret:
            failed = (failed or []) + [(metric, ret)]
        else:
            out[metric] = value * scale
    return failed


#: Every reader, by name: the one table of which reader feeds which metrics.
READERS: dict[str, Reader] = {r.name: r for r in (
    Reader("gpm", read_gpm, ()),  # the GPM metrics the device asks for
    Reader("util", read_util, ("gpu_busy",)),  # and sm_util, mem_bw_util without GPM
    Reader("memory", read_memory, ("gpu_mem_used_bytes", "gpu_mem_total_bytes")),
    Reader("fields", read_fields, ("power_w", "energy_j")),
    Reader("power_usage", read_power_usage, ("power_w",)),
    Reader("energy", read_energy, ("energy_j",)),
    Reader("temp", read_temp, ("gpu_temp_c",)),
    Reader("temp_v", read_temp_v, ("gpu_temp_c",)),
    Reader("sm_clock", read_sm_clock, ("sm_clock_mhz",)),
    Reader("mem_clock", read_mem_clock, ("mem_clock_mhz",)),
    Reader("throttle", read_event_reasons, ("throttle_reasons",)),
    Reader("throttle_old", read_throttle_reasons, ("throttle_reasons",)),
)}
