"""What the NVML source knows about one device: a plain record, planned at ``open()`` and
changed only by the fallbacks (:mod:`.fallbacks`) when a call stops working.

Runs in the sampler process, and in the Jupyter server for its device list; never in the kernel.

Grouped by job: which readers run and which provenance tags they give (``readers``,
``tags``), what NVML utilization feeds (``util_*``), GPM state (:class:`GpmState`), the
FieldValues batch, energy (:class:`EnergyState`) and whether the PCIe slow lane reads it.
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import pynvml

from gpuprof_jupyter.core.sources.nvml import query as q
from gpuprof_jupyter.core.sources.nvml.visible_devices import VisibleDevice


class Reader(NamedTuple):
    """One step of a device's sample.

    ``fn(dev, out)`` fills ``out`` (metric -> value) or raises NvmlFailure; a batched call
    that partly failed returns its failed items as ``[(field id or GPM metric, NVML code)]``.
    ``metrics`` are the metrics it feeds (named in notes, dropped when it fails for good);
    the utilization and GPM readers feed what the device says (:func:`fed_by`).
    """

    name: str
    fn: Callable[["NvmlDevice", dict], list | None]
    metrics: tuple[str, ...]


@dataclass(slots=True)
class EnergyState:
    """``energy_j`` since ``open()``, from the mJ counter or the integral of ``power_w``."""

    mode: str | None = None  # "counter" | "integral" | None (no energy on this device)
    base_mj: float | None = None  # counter value that stands for 0 J
    joules: float = 0.0
    last_power: float | None = None  # integral: the previous power reading of this segment
    last_t: float = 0.0

    def from_counter(self, mj: float) -> float:
        """Joules since open from a counter reading (rebased if the counter went back)."""
        if self.base_mj is None or mj < self.base_mj + self.joules * 1000.0:  # driver reload
            self.base_mj = mj - self.joules * 1000.0
        self.joules = (mj - self.base_mj) / 1000.0
        return self.joules

    def integrate(self, power: float | None, now: float, new_segment: bool) -> float | None:
        """Trapezoid integral of power; None when power is missing (energy is then absent).

        ``new_segment``: a gap came before this reading; nothing is integrated across it (we
        do not know the power there) and the integral restarts from this reading.
        """
        if power is None:
            self.last_power = None
            return None
        if self.last_power is not None and not new_segment:
            self.joules += 0.5 * (power + self.last_power) * (now - self.last_t)
        self.last_power, self.last_t = power, now
        return self.joules


_GPM_METRIC = pynvml.c_nvmlGpmMetric_t
_GPM_RESULT = [(_GPM_METRIC.nvmlReturn.offset, "I"), (_GPM_METRIC.value.offset, "d")]


def gpm_results_unpacker(n_metrics: int) -> struct.Struct:
    """Reads ``(return code, value)`` of each of a ``c_nvmlGpmMetricsGet_t``'s first ``n_metrics``
    results in one ``unpack_from``, at the offsets nvidia-ml-py's public struct declares: per GPU
    ~0.2 us against ~5 us through pynvml's attribute access (benchmarks/README.md, "Public
    functions only"). Gives ``(ret0, value0, ret1, value1, ...)``."""
    base, size = pynvml.c_nvmlGpmMetricsGet_t.metrics.offset, ctypes.sizeof(_GPM_METRIC)
    layout = sorted((base + k * size + offset, code) for k in range(n_metrics) for offset, code in _GPM_RESULT)
    fmt, pos = "=", 0
    for offset, code in layout:
        fmt += (f"{offset - pos}x" if offset > pos else "") + code
        pos = offset + struct.calcsize("=" + code)
    return struct.Struct(fmt)


def metrics_get_pair(samples: tuple, metric_ids: list[int]) -> tuple:
    """Two ``c_nvmlGpmMetricsGet_t`` requests (nvidia-ml-py's public struct) for alternating GPM
    samples: a read fills one sample, then ``pair[n]`` compares the other with sample ``n``.
    Built once per metric list, so a read sets no struct field."""
    s0, s1 = samples
    pair = []
    for first, second in ((s1, s0), (s0, s1)):
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(metric_ids)
        request.sample1, request.sample2 = first, second
        for k, metric_id in enumerate(metric_ids):
            request.metrics[k].metricId = metric_id
        pair.append(request)
    return tuple(pair)


@dataclass(slots=True)
class GpmState:
    """GPM sampling of one device: two alternating samples and the metrics asked of them."""

    on: bool = False
    samples: tuple = ()  # (s0, s1), filled alternately
    next: int = 0  # index of the sample the next read fills
    primed: bool = False  # a first sample exists: the next read can compute metrics
    metrics: tuple[tuple[str, float], ...] = ()  # (metric, scale to the contract's unit)
    names: tuple[str, ...] = ()
    ids: tuple[int, ...] = ()
    get: tuple = ()  # the two MetricsGet requests (``metrics_get_pair``)
    results: struct.Struct | None = None  # reads their results (``gpm_results_unpacker``)

    def set_metrics(self, metrics: list[tuple[str, int, float]]) -> None:
        """Ask for ``(metric, GPM metric id, scale)`` from now on."""
        self.get = metrics_get_pair(self.samples, [mid for _m, mid, _s in metrics])
        self.results = gpm_results_unpacker(len(metrics))
        self.metrics = tuple((m, s) for m, _mid, s in metrics)
        self.names = tuple(m for m, _mid, _s in metrics)
        self.ids = tuple(mid for _m, mid, _s in metrics)

    def free(self) -> None:
        for sample in self.samples:
            q.query_or(None, pynvml.nvmlGpmSampleFree, sample)
        self.samples = ()
        self.on = False


@dataclass(slots=True)
class NvmlDevice:
    """One visible GPU or MIG slice as the source reads it (key ``gpu{visible index}``)."""

    key: str
    vis: VisibleDevice
    readers: tuple[Reader, ...] = ()
    tags: dict[str, str] = field(default_factory=dict)  # metric -> provenance tag
    ticks: int = 0  # completed reads (the baseline pass at open() is not one)
    lost: bool = False
    # NVML utilization.gpu / .memory: read at all, and feeding sm_util / mem_bw_util (no GPM)
    util_ok: bool = False
    util_sm: bool = False
    util_mem: bool = False
    gpm: GpmState = field(default_factory=GpmState)
    fields: tuple[int, ...] = ()  # FieldValues ids read in one call (power and energy)
    energy: EnergyState = field(default_factory=EnergyState)
    pcie_slow: bool = False  # PCIe throughput comes from the slow lane
    # derived from ``vis`` once (read() uses them on every call; plain attributes are cheapest)
    handle: Any = field(init=False)
    parent: Any = field(init=False)  # the whole GPU's handle (== handle for a whole GPU)
    is_mig: bool = field(init=False)
    gi_id: int | None = field(init=False)  # GPU instance of a MIG slice
    whole: str = field(init=False)  # tag suffix of whole-GPU figures read for a MIG slice

    def __post_init__(self) -> None:
        vis = self.vis
        self.handle = vis.handle
        self.parent = vis.gpu.handle
        self.is_mig = vis.mig is not None
        self.gi_id = vis.mig.gpu_instance_id if vis.mig else None
        self.whole = ".whole_gpu" if self.is_mig else ""

    @property
    def field_ids(self) -> list[int]:
        return list(self.fields)

    def set_fields(self, ids: list[int]) -> None:
        self.fields = tuple(ids)

    def has_reader(self, name: str) -> bool:
        return any(r.name == name for r in self.readers)

    def remove_reader(self, name: str) -> None:
        self.readers = tuple(r for r in self.readers if r.name != name)

    def replace_reader(self, name: str, new: Reader) -> None:
        self.readers = tuple(new if r.name == name else r for r in self.readers)

    def add_reader(self, new: Reader) -> None:
        if not self.has_reader(new.name):
            self.readers = self.readers + (new,)


def fed_by(dev: NvmlDevice, reader: Reader) -> list[str]:
    """The metrics ``reader`` feeds on ``dev`` now."""
    if reader.name == "util":
        return ["gpu_busy"] + (["sm_util"] if dev.util_sm else []) + (["mem_bw_util"] if dev.util_mem else [])
    if reader.name == "gpm":
        return list(dev.gpm.names)
    return list(reader.metrics)
