"""Which Prometheus series become which of our metrics, in which unit, with which provenance.

Runs in any process (core).

Two exporters are read: NVIDIA's dcgm-exporter (``DCGM_FI_*``, docs/facts.md,
"dcgm-exporter's names") and this project's own (``gpuprof_<metric>`` gauges labelled ``node``,
``device`` and ``simulated``, already in the contract's units, beside ``gpuprof_device_info`` and
``gpuprof_metric_provenance_info``: sampler_process/exporter/metrics.py). For each of our metrics the rows are in preference order, per device: our
exporter first (it already applied the contract's best-first order on its node), then DCGM's
profiling fields, then DCGM's device fields. Counters (energy) become the delta from the first
reading, as the NVML source does.

Device identity: our exporter's ``node`` and ``device`` labels; dcgm-exporter's ``Hostname``
and ``gpu`` labels (``UUID``, ``modelName`` when present; a MIG slice adds ``GPU_I_ID``);
the node falls back to the scrape target's host (``instance`` without the port).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuprof_jupyter.core.metrics import METRICS

MIB = 1024.0**2
OWN_PREFIX = "gpuprof_"
OWN_DEVICE_INFO = OWN_PREFIX + "device_info"  # labels node, device, kind, name, uuid, simulated
OWN_PROVENANCE_INFO = OWN_PREFIX + "metric_provenance_info"  # labels node, device, metric, provenance


@dataclass(frozen=True)
class SeriesRule:
    """Series ``series`` gives ``metric`` after ``x scale``; a counter is a delta from the first reading."""

    series: str
    metric: str
    scale: float
    tag: str
    counter: bool = False


def _own(metric: str) -> SeriesRule:
    return SeriesRule(OWN_PREFIX + metric, metric, 1.0, "prometheus.gpuprof", counter=metric == "energy_j")


_DCGM = [
    SeriesRule("DCGM_FI_PROF_SM_ACTIVE", "sm_util", 100.0, "dcgm.prof.sm_active"),
    SeriesRule("DCGM_FI_DEV_GPU_UTIL", "sm_util", 1.0, "dcgm.gpu_util"),
    SeriesRule("DCGM_FI_DEV_GPU_UTIL", "gpu_busy", 1.0, "dcgm.gpu_util"),
    SeriesRule("DCGM_FI_PROF_DRAM_ACTIVE", "mem_bw_util", 100.0, "dcgm.prof.dram_active"),
    SeriesRule("DCGM_FI_DEV_MEM_COPY_UTIL", "mem_bw_util", 1.0, "dcgm.mem_copy_util"),
    SeriesRule("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor_util", 100.0, "dcgm.prof.pipe_tensor_active"),
    SeriesRule("DCGM_FI_DEV_POWER_USAGE", "power_w", 1.0, "dcgm.power_usage"),
    SeriesRule("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "energy_j", 1e-3, "dcgm.total_energy", counter=True),
    SeriesRule("DCGM_FI_DEV_FB_USED", "gpu_mem_used_bytes", MIB, "dcgm.fb_used"),
    SeriesRule("DCGM_FI_DEV_GPU_TEMP", "gpu_temp_c", 1.0, "dcgm.gpu_temp"),
    SeriesRule("DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz", 1.0, "dcgm.sm_clock"),
    SeriesRule("DCGM_FI_DEV_MEM_CLOCK", "mem_clock_mhz", 1.0, "dcgm.mem_clock"),
]

# Preference order: our exporter's row for a metric comes before any DCGM row for it.
RULES: list[SeriesRule] = [_own(m) for m in METRICS] + _DCGM
SERIES_NAMES: list[str] = list(dict.fromkeys(r.series for r in RULES))


@dataclass(frozen=True)
class DeviceIdentity:
    """Where a series comes from: node, device on it ("gpu0", "host", "gpu0-mig1"), GPU UUID."""

    node: str
    device: str
    uuid: str | None
    model: str | None
    simulated: bool

    @property
    def key(self) -> str:
        return f"{self.node}/{self.device}"

    @property
    def kind(self) -> str:
        return "host" if self.device == "host" else "gpu"


def identify(labels: dict[str, str]) -> DeviceIdentity | None:
    """The device a series describes, from its labels; None when they name no device."""
    name = labels.get("__name__", "")
    instance_host = labels.get("instance", "").rsplit(":", 1)[0] or "unknown"
    simulated = labels.get("simulated", "").lower() in ("1", "true", "yes")
    if name.startswith(OWN_PREFIX):
        device = labels.get("device")
        if not device:
            return None
        return DeviceIdentity(labels.get("node") or labels.get("host") or instance_host, device,
                              labels.get("uuid") or None, labels.get("name") or None, simulated)
    gpu = labels.get("gpu")
    if gpu is None:
        return None
    device = f"gpu{gpu}" + (f"-mig{labels['GPU_I_ID']}" if labels.get("GPU_I_ID") else "")
    return DeviceIdentity(labels.get("Hostname") or instance_host, device, labels.get("UUID"),
                          labels.get("modelName"), simulated)
