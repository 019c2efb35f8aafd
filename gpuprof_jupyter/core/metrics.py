"""The metric contract: every metric's name, unit and what each provenance tag means.

Runs in any process (core).

One table, read by sources (to name what they produce), the store (units in metadata),
analysis (which metrics are shares of time) and views (axis labels). See docs/metrics.md.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    scope: str  # "gpu" or "host"
    label: str  # short human label for tables and axes


METRICS: dict[str, Metric] = {
    m.name: m
    for m in [
        Metric("sm_util", "%", "gpu", "SM activity"),
        Metric("gpu_busy", "%", "gpu", "GPU busy (kernel-active time)"),
        Metric("mem_bw_util", "%", "gpu", "Memory bandwidth"),
        Metric("sm_occupancy", "%", "gpu", "SM occupancy"),
        Metric("tensor_util", "%", "gpu", "Tensor core activity"),
        Metric("power_w", "W", "gpu", "Power"),
        Metric("energy_j", "J", "gpu", "Energy since start"),
        Metric("gpu_mem_used_bytes", "B", "gpu", "GPU memory used"),
        Metric("gpu_mem_total_bytes", "B", "gpu", "GPU memory total"),
        Metric("torch_mem_allocated_bytes", "B", "gpu", "torch allocated"),
        Metric("torch_mem_reserved_bytes", "B", "gpu", "torch reserved"),
        Metric("step_peak_memory_bytes", "B", "gpu", "step peak (torch)"),
        Metric("gpu_temp_c", "degC", "gpu", "Temperature"),
        Metric("sm_clock_mhz", "MHz", "gpu", "SM clock"),
        Metric("mem_clock_mhz", "MHz", "gpu", "Memory clock"),
        Metric("throttle_reasons", "bitmask", "gpu", "Clock event reasons"),
        Metric("pcie_tx_bytes_s", "B/s", "gpu", "PCIe TX"),
        Metric("pcie_rx_bytes_s", "B/s", "gpu", "PCIe RX"),
        Metric("own_sm_util", "%", "gpu", "SM share (this kernel)"),
        Metric("other_sm_util", "%", "gpu", "SM share (other processes)"),
        Metric("own_gpu_mem_bytes", "B", "gpu", "GPU memory (this kernel)"),
        Metric("other_gpu_mem_bytes", "B", "gpu", "GPU memory (other processes)"),
        Metric("cpu_util", "%", "host", "CPU (kernel process tree)"),
        Metric("host_cpu_util", "%", "host", "CPU (whole host)"),
        Metric("rss_bytes", "B", "host", "RSS (kernel process tree)"),
        Metric("disk_read_bytes_s", "B/s", "host", "Disk read"),
        Metric("disk_write_bytes_s", "B/s", "host", "Disk write"),
    ]
}

# Exported to Prometheus as PROMETHEUS_PREFIX + name, in the unit above (docs/prometheus.md).
PROMETHEUS_PREFIX = "gpuprof_"

GPU_METRICS = [m.name for m in METRICS.values() if m.scope == "gpu"]
# Per-process attribution (core/sources/gpu_processes.py): read once a second, NaN between.
PROCESS_SHARE_METRICS = ("own_sm_util", "other_sm_util", "own_gpu_mem_bytes", "other_gpu_mem_bytes")
HOST_METRICS = [m.name for m in METRICS.values() if m.scope == "host"]

# What each provenance tag measures, in words a user can check against nvidia-smi / DCGM.
PROVENANCE: dict[str, str] = {
    "gpm.sm_util": "GPM SM_UTIL: share of SMs busy",
    "gpm.sm_occupancy": "GPM SM_OCCUPANCY: resident warps / max warps",
    "gpm.tensor_util": "GPM ANY_TENSOR_UTIL: share of SMs with tensor pipes active",
    "gpm.dram_bw_util": "GPM DRAM_BW_UTIL: share of peak DRAM bandwidth",
    "gpm.pcie": "GPM PCIE_TX/RX_PER_SEC",
    "gpm.mig": "GPM samples of this MIG instance",
    "nvml.utilization.gpu": "kernel-active time (share of time at least one kernel ran)",
    "nvml.utilization.memory": "memory-active time (share of time memory was read or written), not bandwidth",
    "nvml.field.power_instant": "NVML_FI_DEV_POWER_INSTANT: instant power",
    "nvml.power_usage": "nvmlDeviceGetPowerUsage: 1 s average on Ampere and newer",
    "nvml.power_usage.whole_gpu": "nvmlDeviceGetPowerUsage of the parent GPU (whole GPU, not this MIG slice)",
    "nvml.field.power_instant.whole_gpu": "instant power of the parent GPU (whole GPU, not this MIG slice)",
    "nvml.total_energy": "delta of nvmlDeviceGetTotalEnergyConsumption (mJ counter)",
    "nvml.total_energy.whole_gpu": "energy counter of the parent GPU (whole GPU, not this MIG slice)",
    "nvml.field.total_energy": "delta of field NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION (the same mJ counter as nvmlDeviceGetTotalEnergyConsumption)",
    "nvml.field.total_energy.whole_gpu": "energy counter field of the parent GPU (whole GPU, not this MIG slice)",
    "integral.power_w": "integral of power_w over time (no energy counter)",
    "integral.power_w.whole_gpu": "integral of the parent GPU's power over time (whole GPU, not this MIG slice)",
    "nvml.memory_info": "nvmlDeviceGetMemoryInfo (includes PyTorch's cache)",
    "nvml.temperature": "nvmlDeviceGetTemperature (GPU die)",
    "nvml.clock.sm": "nvmlDeviceGetClockInfo(SM)",
    "nvml.clock.mem": "nvmlDeviceGetClockInfo(MEM)",
    "nvml.clocks_event_reasons": "nvmlDeviceGetCurrentClocksEventReasons (decoded to names)",
    "nvml.clocks_throttle_reasons": "nvmlDeviceGetCurrentClocksThrottleReasons (older name of the same bitmask)",
    "nvml.pcie_throughput": "nvmlDeviceGetPcieThroughput (1 Hz slow lane, 20 ms window)",
    "nvml.process_utilization": "nvmlDeviceGetProcessUtilization: share of time each process's kernels ran "
                                "(smUtil since the previous read, summed over the kernel's processes or the others')",
    "nvml.running_processes": "NVML running-process lists (compute + graphics): used memory summed over the "
                              "kernel's processes or the others'",
    "torch.cuda": "torch.cuda memory statistics of this process",
    "torch.cuda.step_peak": "torch.cuda.max_memory_allocated at each step's end, reset there: the highest step peak since the previous reading",
    "psutil.process_tree": "psutil over the kernel's process tree (DataLoader workers included)",
    "psutil.cpu_percent": "psutil.cpu_percent (whole host)",
    "psutil.disk_io_counters": "psutil.disk_io_counters (whole host)",
    "psutil.process_io": "psutil io_counters of the kernel's process tree",
    "dcgm.prof.sm_active": "dcgm-exporter DCGM_FI_PROF_SM_ACTIVE x100: share of SMs busy (via Prometheus)",
    "dcgm.gpu_util": "dcgm-exporter DCGM_FI_DEV_GPU_UTIL: kernel-active time, as NVML utilization.gpu (via Prometheus)",
    "dcgm.prof.dram_active": "dcgm-exporter DCGM_FI_PROF_DRAM_ACTIVE x100: share of peak DRAM bandwidth (via Prometheus)",
    "dcgm.mem_copy_util": "dcgm-exporter DCGM_FI_DEV_MEM_COPY_UTIL: memory-active time, not bandwidth (via Prometheus)",
    "dcgm.prof.pipe_tensor_active": "dcgm-exporter DCGM_FI_PROF_PIPE_TENSOR_ACTIVE x100: tensor pipes active (via Prometheus)",
    "dcgm.power_usage": "dcgm-exporter DCGM_FI_DEV_POWER_USAGE (W, via Prometheus)",
    "dcgm.total_energy": "delta of dcgm-exporter DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ counter, via Prometheus)",
    "dcgm.fb_used": "dcgm-exporter DCGM_FI_DEV_FB_USED (MiB, via Prometheus)",
    "dcgm.gpu_temp": "dcgm-exporter DCGM_FI_DEV_GPU_TEMP (via Prometheus)",
    "dcgm.sm_clock": "dcgm-exporter DCGM_FI_DEV_SM_CLOCK (via Prometheus)",
    "dcgm.mem_clock": "dcgm-exporter DCGM_FI_DEV_MEM_CLOCK (via Prometheus)",
    "prometheus.gpuprof": "this project's exporter on that node (gpuprof_* gauges), via Prometheus",
    "simulated": "simulated: not a measurement",
}

@dataclass(frozen=True)
class Window:
    """A provenance's native window: how long a reading describes, so how often it can change.

    ``seconds`` None means the sample interval (GPM compares two samples; psutil rates span one
    tick); 0 means instant (a reading describes its moment) or a counter (exact over any span).
    """

    seconds: float | None
    text: str

    def resolve(self, interval_s: float) -> float:
        return interval_s if self.seconds is None else self.seconds


_INTERVAL = Window(None, "the sample interval")
_INTEGRAL = Window(None, "the sample interval (an integral of power readings)")
_NVML_UTIL = Window(1.0, "1/6 s to 1 s, set by the driver (1 s assumed)")
_POWER_AVG = Window(1.0, "1 s average on Ampere and newer")
_POWER_INSTANT = Window(0.1, "~20-100 ms")
_INSTANT = Window(0.0, "instant")
_COUNTER = Window(0.0, "a counter: exact over any span")
_ONCE_A_SECOND = Window(1.0, "1 s (read once a second)")
_SCRAPE = Window(15.0, "one Prometheus scrape interval (15 s, Prometheus's default)")

# provenance tag -> native window (docs/metrics.md, last column). A tag missing here (a new
# source) is taken as the sample interval (``native_window``).
NATIVE_WINDOWS: dict[str, Window] = {
    "gpm.sm_util": _INTERVAL, "gpm.sm_occupancy": _INTERVAL, "gpm.tensor_util": _INTERVAL,
    "gpm.dram_bw_util": _INTERVAL, "gpm.pcie": _INTERVAL, "gpm.mig": _INTERVAL,
    "nvml.utilization.gpu": _NVML_UTIL, "nvml.utilization.memory": _NVML_UTIL,
    "nvml.field.power_instant": _POWER_INSTANT, "nvml.field.power_instant.whole_gpu": _POWER_INSTANT,
    "nvml.power_usage": _POWER_AVG, "nvml.power_usage.whole_gpu": _POWER_AVG,
    "nvml.total_energy": _COUNTER, "nvml.total_energy.whole_gpu": _COUNTER,
    "nvml.field.total_energy": _COUNTER, "nvml.field.total_energy.whole_gpu": _COUNTER,
    "integral.power_w": _INTEGRAL, "integral.power_w.whole_gpu": _INTEGRAL,
    "nvml.memory_info": _INSTANT, "nvml.temperature": _INSTANT, "nvml.clock.sm": _INSTANT,
    "nvml.clock.mem": _INSTANT, "nvml.clocks_event_reasons": _INSTANT, "nvml.clocks_throttle_reasons": _INSTANT,
    "nvml.pcie_throughput": Window(1.0, "20 ms, read once a second"),
    "torch.cuda": _INSTANT,
    "torch.cuda.step_peak": Window(None, "one training step (the peak is reset at each step's end)"),
    "nvml.process_utilization": Window(1.0, "1 s (read once a second: samples since the previous read)"),
    "nvml.running_processes": _ONCE_A_SECOND,
    "psutil.process_tree": _INTERVAL,
    "psutil.cpu_percent": _ONCE_A_SECOND, "psutil.disk_io_counters": _ONCE_A_SECOND,
    "psutil.process_io": _ONCE_A_SECOND,
    "simulated": _INTERVAL,
    # read through Prometheus: a reading holds for one scrape of the exporter; 15 s is
    # Prometheus's default (the source records the actual interval in the run's context)
    **{tag: _SCRAPE for tag in (
        "dcgm.prof.sm_active", "dcgm.gpu_util", "dcgm.prof.dram_active", "dcgm.mem_copy_util",
        "dcgm.prof.pipe_tensor_active", "dcgm.power_usage", "dcgm.fb_used", "dcgm.gpu_temp", "dcgm.sm_clock",
        "dcgm.mem_clock", "prometheus.gpuprof")},
    "dcgm.total_energy": _COUNTER,
}

# (metric, provenance tag) -> what such a reading cannot tell although the metric's name
# suggests it; any conclusion drawn from it says so (docs/metrics.md, "Provenance in conclusions").
CANNOT_TELL: dict[tuple[str, str], str] = {
    ("sm_util", "nvml.utilization.gpu"): "how many SMs were busy",
    ("mem_bw_util", "nvml.utilization.memory"): "how much of the memory bandwidth was used",
}


def native_window(tag: str) -> Window:
    return NATIVE_WINDOWS.get(tag, _INTERVAL)


# Clock event (throttle) reasons: NVML bit -> name. Same values as pynvml's
# nvmlClocksEventReason* constants; kept here so analysis decodes without pynvml.
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def decode_throttle_reasons(mask: float | int) -> list[str]:
    """Names of the clock event reasons set in an NVML bitmask (NaN -> [])."""
    if mask != mask:  # NaN: not measured
        return []
    bits = int(mask)
    return [name for bit, name in THROTTLE_REASONS.items() if bits & bit]


def describe_provenance(tag: str) -> str:
    return PROVENANCE.get(tag, tag)
