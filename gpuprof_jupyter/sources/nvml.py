"""Real GPUs through NVML (nvidia-ml-py), following the metric contract (docs: DESIGN.md).

Per visible GPU (key ``gpu{i}``, ``i`` its index among the CUDA_VISIBLE_DEVICES devices):

* ``sm_util`` %: GPM ``SM_UTIL`` (share of SMs busy) on GPUs with GPM (Hopper and newer),
  else NVML ``utilization.gpu`` (share of time a kernel ran: "kernel-active time"; what
  ``nvidia-smi`` shows as GPU-Util);
* ``gpu_busy`` %: NVML ``utilization.gpu``, always;
* ``mem_bw_util`` %: GPM ``DRAM_BW_UTIL``, else ``utilization.memory`` (memory-active time);
* ``sm_occupancy``, ``tensor_util`` %: GPM only;
* ``power_w`` W: field ``NVML_FI_DEV_POWER_INSTANT``, else ``nvmlDeviceGetPowerUsage`` (a
  1 s average on Ampere and newer; ``nvidia-smi --query-gpu=power.draw``);
* ``energy_j`` J since :meth:`NvmlSource.open`: delta of the mJ energy counter (field
  ``NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` or ``nvmlDeviceGetTotalEnergyConsumption``), else
  the trapezoid integral of ``power_w`` (tag ``integral.power_w``; gaps are not integrated);
* ``gpu_mem_used_bytes``/``gpu_mem_total_bytes`` B, ``gpu_temp_c``, ``sm_clock_mhz``,
  ``mem_clock_mhz``, ``throttle_reasons`` (clock event reasons bitmask as a float);
* ``pcie_tx_bytes_s``/``pcie_rx_bytes_s`` B/s: GPM ``PCIE_TX/RX_PER_SEC`` (MiB/s), else
  ``nvmlDeviceGetPcieThroughput`` (KB/s, taken as KiB/s like nvitop; each call blocks ~20 ms)
  read by a slow-lane daemon thread at most once per ``slow_interval_s``; :meth:`read`
  only merges its cached values and never makes a blocking call.

Missing means absent from the reading, never 0. A metric whose call answers NotSupported,
NoPermission, FunctionNotFound or InvalidArgument is dropped for that device for the
session with one note (falling back where the contract has a fallback). A GPU that answers
GPU_IS_LOST (or Unknown to every call of a sample) leaves the readings, with a note; the
others go on. A MIG slice is a device of its own: memory from its handle, utilization from
GPM MIG samples of its GPU instance (absent when the parent has no GPM), power and energy
the parent's (tags ``*.whole_gpu``), temperature and clocks the parent's too.

All NVML calls go through :mod:`.nvml_query`; nothing here touches CUDA.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
import threading
import time
from typing import Any, Callable

import pynvml

from . import nvml_query as q
from .base import DeviceInfo, NoteBook, Reading, SourceUnavailable
from .visible_devices import VisibleDevice, enumerate_nvml_devices, select_visible

_MIB = 1024.0 * 1024.0
_KIB = 1024.0

# GPM metrics: (metric, GPM metric id, scale to the contract's unit, tag on a whole GPU)
_GPM_GPU = (
    ("sm_util", pynvml.NVML_GPM_METRIC_SM_UTIL, 1.0, "gpm.sm_util"),
    ("sm_occupancy", pynvml.NVML_GPM_METRIC_SM_OCCUPANCY, 1.0, "gpm.sm_occupancy"),
    ("tensor_util", pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, 1.0, "gpm.tensor_util"),
    ("mem_bw_util", pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL, 1.0, "gpm.dram_bw_util"),
    ("pcie_tx_bytes_s", pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, _MIB, "gpm.pcie"),
    ("pcie_rx_bytes_s", pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, _MIB, "gpm.pcie"),
)
_GPM_MIG = _GPM_GPU[:4]  # PCIe is not per slice

_FI_POWER = pynvml.NVML_FI_DEV_POWER_INSTANT
_FI_ENERGY = pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION



# pynvml's structs route every attribute access through a Python __getattribute__ (~1 us
# each); the hot path reads its results with one precompiled struct.unpack_from instead.
def _unpacker(layout: list[tuple[int, str]]) -> struct.Struct:
    """A Struct reading ``code`` at each byte ``offset`` (sorted, non-overlapping)."""
    fmt, pos = "=", 0
    for offset, code in sorted(layout):
        if offset > pos:
            fmt += f"{offset - pos}x"
        fmt += code
        pos = offset + struct.calcsize("=" + code)
    return struct.Struct(fmt)


_UTIL_S = _unpacker([(pynvml.c_nvmlUtilization_t.gpu.offset, "I"), (pynvml.c_nvmlUtilization_t.memory.offset, "I")])
_MEM_S = _unpacker([(pynvml.c_nvmlMemory_t.total.offset, "Q"), (pynvml.c_nvmlMemory_t.used.offset, "Q")])
_FV = pynvml.c_nvmlFieldValue_t
_FV_SIZE = ctypes.sizeof(_FV)
_FV_LAYOUT = [(_FV.fieldId.offset, "I"), (_FV.valueType.offset, "I"), (_FV.nvmlReturn.offset, "I"), (_FV.value.offset, "Q")]
_GPM_REC = ctypes.sizeof(pynvml.c_nvmlGpmMetric_t)
_GPM_BASE = pynvml.c_nvmlGpmMetricsGet_t.metrics.offset
_GPM_LAYOUT = [(pynvml.c_nvmlGpmMetric_t.nvmlReturn.offset, "I"), (pynvml.c_nvmlGpmMetric_t.value.offset, "d")]
_RAW = struct.Struct("=Q")
_VALUE_CODE = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "=d",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "=I",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "=Q" if ctypes.sizeof(ctypes.c_ulong) == 8 else "=I",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "=Q",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "=q",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "=i",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "=H",
}


_UINT = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
_ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
_LITTLE = sys.byteorder == "little"


def _field_value(value_type: int, raw: int) -> float:
    """The c_nvmlValue_t union member ``value_type`` names, from its 8 raw bytes."""
    if value_type == _UINT and _LITTLE:
        return float(raw & 0xFFFFFFFF)
    if value_type == _ULL:
        return float(raw)
    code = _VALUE_CODE.get(value_type, "=I")
    return float(struct.unpack_from(code, _RAW.pack(raw))[0])


def _fields_unpacker(n: int) -> struct.Struct:
    return _unpacker([(k * _FV_SIZE + off, code) for k in range(n) for off, code in _FV_LAYOUT])


def _gpm_unpacker(n: int) -> struct.Struct:
    return _unpacker([(_GPM_BASE + k * _GPM_REC + off, code) for k in range(n) for off, code in _GPM_LAYOUT])


_TEMP_GPU = pynvml.NVML_TEMPERATURE_GPU
_CLOCK_SM = pynvml.NVML_CLOCK_SM
_CLOCK_MEM = pynvml.NVML_CLOCK_MEM
_PCIE_TX = pynvml.NVML_PCIE_UTIL_TX_BYTES
_PCIE_RX = pynvml.NVML_PCIE_UTIL_RX_BYTES

_UTIL = pynvml.nvmlDeviceGetUtilizationRates
_MEMORY = pynvml.nvmlDeviceGetMemoryInfo
_FIELDS = pynvml.nvmlDeviceGetFieldValues
_POWER_USAGE = pynvml.nvmlDeviceGetPowerUsage
_ENERGY = pynvml.nvmlDeviceGetTotalEnergyConsumption
_TEMP = pynvml.nvmlDeviceGetTemperature
_TEMP_V = pynvml.nvmlDeviceGetTemperatureV
_CLOCK = pynvml.nvmlDeviceGetClockInfo
_EVENT_REASONS = pynvml.nvmlDeviceGetCurrentClocksEventReasons
_THROTTLE_REASONS = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
_PCIE = pynvml.nvmlDeviceGetPcieThroughput
_GPM_SAMPLE = pynvml.nvmlGpmSampleGet
_GPM_MIG_SAMPLE = pynvml.nvmlGpmMigSampleGet
_GPM_METRICS = pynvml.nvmlGpmMetricsGet

_REASONS = {
    q.NOT_SUPPORTED: "not supported by this GPU",
    q.NO_PERMISSION: "not permitted for this user",
    q.INVALID: "not available on this device",
}


_READER_METRICS = {
    "util": "gpu_busy (and NVML-fed sm_util, mem_bw_util)",
    "gpm": "GPM metrics",
    "memory": "gpu_mem_used_bytes, gpu_mem_total_bytes",
    "fields": "power_w, energy_j",
    "power_usage": "power_w",
    "energy": "energy_j",
    "temp": "gpu_temp_c",
    "temp_v": "gpu_temp_c",
    "sm_clock": "sm_clock_mhz",
    "mem_clock": "mem_clock_mhz",
    "throttle": "throttle_reasons",
    "throttle_old": "throttle_reasons",
}


class _Reader:
    """One step of a device's sample: ``fn(dev, out)`` fills ``out`` or raises NvmlFailure."""

    __slots__ = ("name", "fn")

    def __init__(self, name: str, fn: Callable[["_Dev", dict], None]) -> None:
        self.name = name
        self.fn = fn


class _Dev:
    """Everything read() needs for one device, planned at open()."""

    def __init__(self, key: str, vis: VisibleDevice) -> None:
        self.key = key
        self.vis = vis
        self.handle = vis.handle
        self.is_mig = vis.mig is not None
        self.parent = vis.gpu.handle  # == handle for a whole GPU
        self.gi_id = vis.mig.gpu_instance_id if vis.mig else None
        self.whole = ".whole_gpu" if self.is_mig else ""
        self.readers: tuple[_Reader, ...] = ()
        self.tags: dict[str, str] = {}
        self.ticks = 0  # completed reads (the probe at open() is not one)
        self.lost = False
        # utilization.gpu / .memory feed these when GPM does not
        self.util_ok = False
        self.util_sm = False
        self.util_mem = False
        # GPM
        self.gpm = False
        self.gpm_out: tuple[tuple[str, float], ...] = ()
        self.gpm_names: tuple[str, ...] = ()
        self.gpm_scaled: tuple[tuple[str, float], ...] = ()
        self.gpm_ids: tuple[int, ...] = ()
        self.gpm_get: Any = None  # two MetricsGet structs, see _set_gpm_metrics
        self.gpm_unpack: struct.Struct | None = None
        self.gpm_samples: tuple = ()  # (s0, s1), filled alternately
        self.gpm_next = 0  # index of the sample the next read fills
        self.gpm_primed = False
        # FieldValues batch: field ids and what each feeds
        self.field_ids: list[int] = []
        self.fields_unpack: struct.Struct | None = None
        self.fields_buf: Any = None  # c_nvmlFieldValue_t array, field ids set once (_set_fields)
        self.fields_args: tuple = ()  # (parent handle, count, byref(buf)) for q.call
        self.util_buf = pynvml.c_nvmlUtilization_t()  # filled in place by every read
        self.util_args = (self.handle, ctypes.byref(self.util_buf))
        self.mem_buf = pynvml.c_nvmlMemory_t()
        self.mem_args = (self.handle, ctypes.byref(self.mem_buf))
        self.temp_out, self.sm_clock_out, self.mem_clock_out, self.reasons_out = (
            ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong())
        self.temp_args = (self.parent, ctypes.c_uint(_TEMP_GPU), ctypes.byref(self.temp_out))
        self.sm_clock_args = (self.parent, ctypes.c_uint(_CLOCK_SM), ctypes.byref(self.sm_clock_out))
        self.mem_clock_args = (self.parent, ctypes.c_uint(_CLOCK_MEM), ctypes.byref(self.mem_clock_out))
        self.reasons_args = (self.parent, ctypes.byref(self.reasons_out))
        # energy
        self.energy_mode: str | None = None  # "counter" | "integral" | None
        self.energy_base_mj: float | None = None
        self.energy_j = 0.0
        self.last_power: float | None = None
        self.last_t = 0.0
        # PCIe slow lane
        self.pcie_slow = False


class NvmlSource:
    """NVML GPUs; see the module docstring for what each metric is and when it is missing.

    Args:
        devices: indices among the *visible* GPUs (CUDA_VISIBLE_DEVICES order) to read;
            None reads all of them. Keys stay ``gpu{visible index}``.
        clock: monotonic clock (seconds), used for energy integration and PCIe cache age.
        slow_interval_s: seconds between two slow-lane (PCIe throughput) passes.
    """

    name = "nvml"
    simulated = False

    def __init__(
        self,
        devices: list[int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        slow_interval_s: float = 1.0,
    ) -> None:
        self._want = None if devices is None else list(devices)
        self._clock = clock
        self._slow_interval = float(slow_interval_s)
        self._pcie_max_age = max(5.0 * self._slow_interval, self._slow_interval + 2.0)
        self._notes = NoteBook()
        self._notes_lock = threading.Lock()
        self._devs: list[_Dev] = []
        self._active: tuple[_Dev, ...] = ()
        self._infos: list[DeviceInfo] = []
        self._context: dict = {}
        self._acquired = False
        self._t0 = 0.0
        self._pcie: dict[str, tuple[float, float, float]] = {}
        self._slow_thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._slow_cond = threading.Condition()
        self._slow_passes = 0

    # ------------------------------------------------------------------ open
    def open(self) -> list[DeviceInfo]:
        """Initialise NVML, match visible devices, plan each device's reads, take a baseline.

        Raises:
            SourceUnavailable: no NVML library, driver not loaded, or no visible GPU.
            ValueError: ``devices`` names a GPU that is not visible.
        """
        self.close()
        self._notes = NoteBook()
        self._stop = threading.Event()
        self._pcie = {}
        try:
            q.acquire()
        except q.NvmlFailure as failure:
            raise SourceUnavailable(_unavailable_message(failure)) from None
        self._acquired = True
        try:
            return self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> list[DeviceInfo]:
        try:
            gpus = enumerate_nvml_devices()
        except q.NvmlFailure as failure:
            raise SourceUnavailable(f"NVML cannot list GPUs ({failure})") from None
        if not gpus:
            raise SourceUnavailable("NVML is loaded but sees no GPU")
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        selection = select_visible(cvd, gpus, os.environ.get("CUDA_DEVICE_ORDER"))
        for note in selection.notes:
            self._note(note)
        visible = selection.devices
        if not visible:
            why = f"CUDA_VISIBLE_DEVICES={cvd!r} hides all {len(gpus)} GPUs" if cvd is not None else (
                f"none of the {len(gpus)} GPUs NVML lists can be opened"
            )
            raise SourceUnavailable(f"no visible GPU: {why}")
        if self._want is not None:
            bad = [i for i in self._want if not 0 <= i < len(visible)]
            if bad:
                raise ValueError(f"devices {bad} not among the {len(visible)} visible GPUs (0..{len(visible) - 1})")
            visible = [visible[i] for i in dict.fromkeys(self._want)]
        self._context = self._read_context(cvd)
        self._t0 = self._clock()
        self._devs = [self._plan(vis) for vis in visible]
        self._active = tuple(self._devs)
        # Baseline pass: primes GPM and the energy counter, finds what is unsupported now so
        # provenance() and notes() are right before the first read().
        now = self._clock()
        first: dict[str, dict] = {}
        for dev in self._active:
            first[dev.key] = out = {}
            self._read_device(dev, out, now)
        self._active = tuple(d for d in self._devs if not d.lost)
        self._infos = [self._info(dev, first[dev.key]) for dev in self._active]
        if not self._active:
            raise SourceUnavailable("every visible GPU was lost while opening: " + "; ".join(self.notes()))
        self._ensure_slow_lane()
        return list(self._infos)

    def final_context(self) -> dict:
        """Facts known only at the end of a run: other processes seen on our GPUs."""
        from .gpu_processes import other_gpu_processes

        handles = {dev.key: dev.handle for dev in self._active}
        return {"other_gpu_processes": other_gpu_processes(handles)} if handles else {}

    def _read_context(self, cvd: str | None) -> dict:
        cuda = q.query_or(None, pynvml.nvmlSystemGetCudaDriverVersion)
        try:
            from importlib.metadata import version

            binding = version("nvidia-ml-py")
        except Exception:  # noqa: BLE001 - informational only
            binding = None
        return {
            "driver_version": q.query_or(None, pynvml.nvmlSystemGetDriverVersion),
            "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
            "nvml_version": q.query_or(None, pynvml.nvmlSystemGetNVMLVersion),
            "nvidia_ml_py_version": binding,
            "cuda_visible_devices": cvd,
        }

    def _info(self, dev: _Dev, first: dict) -> DeviceInfo:
        vis = dev.vis
        name = (vis.mig.name if vis.mig else vis.gpu.name) or q.query_or("", pynvml.nvmlDeviceGetName, dev.handle)
        limit = q.query_or(None, pynvml.nvmlDeviceGetEnforcedPowerLimit, dev.parent)
        return DeviceInfo(
            key=dev.key,
            kind="gpu",
            name=name,
            index=vis.visible_index,
            uuid=vis.uuid,
            power_limit_w=limit / 1000.0 if limit is not None else None,
            memory_total_bytes=first.get("gpu_mem_total_bytes"),
            mig_parent_uuid=vis.gpu.uuid if vis.mig else None,
            extra={
                "nvml_index": vis.gpu.index,
                "gpm": dev.gpm,
                "mig_gpu_instance_id": dev.gi_id,
                "power_limit_whole_gpu": dev.is_mig,
            },
        )

    # ------------------------------------------------------------------ plan
    def _plan(self, vis: VisibleDevice) -> _Dev:
        dev = _Dev(f"gpu{vis.visible_index}", vis)
        key, w = dev.key, dev.whole
        support = q.query_or(None, pynvml.nvmlGpmQueryDeviceSupport, dev.parent)
        parent_gpm = bool(support is not None and support.isSupportedDevice)
        if dev.is_mig and dev.gi_id is None:
            parent_gpm = False
        readers: list[_Reader] = []
        if parent_gpm:
            self._setup_gpm(dev, _GPM_MIG if dev.is_mig else _GPM_GPU)
        if not dev.is_mig:
            dev.util_ok = True
            dev.util_sm = dev.util_mem = not dev.gpm
            dev.tags["gpu_busy"] = "nvml.utilization.gpu"
            if not dev.gpm:
                dev.tags["sm_util"] = "nvml.utilization.gpu"
                dev.tags["mem_bw_util"] = "nvml.utilization.memory"
                dev.pcie_slow = True
                dev.tags["pcie_tx_bytes_s"] = dev.tags["pcie_rx_bytes_s"] = "nvml.pcie_throughput"
                self._note(
                    f"{key}: sm_occupancy, tensor_util not supported by this GPU (no GPM); sm_util is "
                    f"NVML utilization.gpu (kernel-active time, not the share of SMs busy) and "
                    f"mem_bw_util is utilization.memory (memory-active time, not bandwidth)"
                )
            readers.append(_Reader("util", self._read_util))  # gpm goes first (below)
        else:
            parent_uuid = vis.gpu.uuid
            self._note(
                f"{key}: MIG slice of {parent_uuid}: power_w and energy_j are the whole GPU's "
                f"(not this slice's), temperature and clocks are the GPU's; gpu_busy and PCIe "
                f"throughput are not reported per slice"
            )
            if not dev.gpm:
                self._note(
                    f"{key}: sm_util, mem_bw_util, sm_occupancy, tensor_util not available on this "
                    f"MIG slice: its GPU has no GPM, and NVML utilization is not reported per slice"
                )
        if dev.gpm:  # first: its per-metric fallbacks to utilization apply in the same sample
            readers.insert(0, _Reader("gpm", self._read_gpm))
        dev.tags["gpu_mem_used_bytes"] = dev.tags["gpu_mem_total_bytes"] = "nvml.memory_info"
        readers.append(_Reader("memory", self._read_memory))
        # power and energy: one FieldValues call for both
        self._set_fields(dev, [_FI_POWER, _FI_ENERGY])
        dev.tags["power_w"] = "nvml.field.power_instant" + w
        dev.tags["energy_j"] = "nvml.field.total_energy" + w
        dev.energy_mode = "counter"
        readers.append(_Reader("fields", self._read_fields))
        dev.tags["gpu_temp_c"] = "nvml.temperature"
        readers.append(_Reader("temp", self._read_temp))
        dev.tags["sm_clock_mhz"] = "nvml.clock.sm"
        readers.append(_Reader("sm_clock", self._read_sm_clock))
        dev.tags["mem_clock_mhz"] = "nvml.clock.mem"
        readers.append(_Reader("mem_clock", self._read_mem_clock))
        dev.tags["throttle_reasons"] = "nvml.clocks_event_reasons"
        readers.append(_Reader("throttle", self._read_event_reasons))
        dev.readers = tuple(readers)
        return dev

    def _setup_gpm(self, dev: _Dev, metrics: tuple) -> None:
        try:
            dev.gpm_samples = (q.query(pynvml.nvmlGpmSampleAlloc),)
            dev.gpm_samples += (q.query(pynvml.nvmlGpmSampleAlloc),)
        except q.NvmlFailure as failure:
            self._free_gpm(dev)
            self._note(f"{dev.key}: GPM samples cannot be allocated ({failure}); GPM metrics not read")
            return
        dev.gpm = True
        tag_of = (lambda t: "gpm.mig") if dev.is_mig else (lambda t: t)
        for metric, _mid, _scale, tag in metrics:
            dev.tags[metric] = tag_of(tag)
        self._set_gpm_metrics(dev, [(m, mid, scale) for m, mid, scale, _t in metrics])

    def _set_gpm_metrics(self, dev: _Dev, metrics: list[tuple[str, int, float]]) -> None:
        # Samples alternate: a read fills one, then MetricsGet(other, just filled). Two
        # prebuilt MetricsGet structs avoid setting struct fields on every read:
        # gpm_get[n] compares the other sample with sample n.
        s0, s1 = dev.gpm_samples
        pair = []
        for first, second in ((s1, s0), (s0, s1)):
            mg = pynvml.c_nvmlGpmMetricsGet_t()
            mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(metrics)
            mg.sample1, mg.sample2 = first, second
            for k, (_m, mid, _s) in enumerate(metrics):
                mg.metrics[k].metricId = mid
            pair.append(mg)
        dev.gpm_get = tuple(pair)
        dev.gpm_unpack = _gpm_unpacker(len(metrics))
        dev.gpm_out = tuple((m, s) for m, _mid, s in metrics)
        dev.gpm_names = tuple(m for m, _mid, _s in metrics)
        dev.gpm_scaled = tuple((m, s) for m, _mid, s in metrics if s != 1.0)
        dev.gpm_ids = tuple(mid for _m, mid, _s in metrics)

    def _set_fields(self, dev: _Dev, ids: list[int]) -> None:
        dev.field_ids = list(ids)
        dev.fields_unpack = _fields_unpacker(len(ids))
        dev.fields_buf = (_FV * max(len(ids), 1))()
        for k, field_id in enumerate(ids):
            dev.fields_buf[k].fieldId = field_id
        dev.fields_args = (dev.parent, ctypes.c_int32(len(ids)), ctypes.byref(dev.fields_buf))

    def _free_gpm(self, dev: _Dev) -> None:
        for sample in dev.gpm_samples:
            q.query_or(None, pynvml.nvmlGpmSampleFree, sample)
        dev.gpm_samples = ()
        dev.gpm = False

    # --------------------------------------------------------------- readers
    def _read_util(self, dev: _Dev, out: dict) -> None:
        q.call("nvmlDeviceGetUtilizationRates", *dev.util_args)  # no new struct per call
        gpu, memory = _UTIL_S.unpack_from(dev.util_buf)
        out["gpu_busy"] = float(gpu)
        if dev.util_sm:
            out["sm_util"] = float(gpu)
        if dev.util_mem:
            out["mem_bw_util"] = float(memory)

    def _read_memory(self, dev: _Dev, out: dict) -> None:
        q.call("nvmlDeviceGetMemoryInfo", *dev.mem_args)
        total, used = _MEM_S.unpack_from(dev.mem_buf)
        out["gpu_mem_used_bytes"] = float(used)
        out["gpu_mem_total_bytes"] = float(total)

    def _read_fields(self, dev: _Dev, out: dict) -> None:
        q.call("nvmlDeviceGetFieldValues", *dev.fields_args)  # ids set once in _set_fields
        raw = dev.fields_unpack.unpack_from(dev.fields_buf)
        failed = None
        for k in range(0, len(raw), 4):
            field_id, value_type, ret, value = raw[k:k + 4]
            if ret:
                failed = (failed or []) + [(field_id, ret)]
                continue
            if field_id == _FI_POWER:
                out["power_w"] = _field_value(value_type, value) / 1000.0
            else:
                self._energy_from_counter(dev, _field_value(value_type, value), out)
        if failed:
            for field_id, ret in failed:
                self._field_failed(dev, field_id, ret)

    def _read_power_usage(self, dev: _Dev, out: dict) -> None:
        out["power_w"] = q.query(_POWER_USAGE, dev.parent) / 1000.0

    def _read_energy(self, dev: _Dev, out: dict) -> None:
        self._energy_from_counter(dev, float(q.query(_ENERGY, dev.parent)), out)

    def _energy_from_counter(self, dev: _Dev, mj: float, out: dict) -> None:
        base = dev.energy_base_mj
        if base is None:
            base = dev.energy_base_mj = mj - dev.energy_j * 1000.0
        elif mj < base + dev.energy_j * 1000.0:  # counter went back (driver reload): rebase
            base = dev.energy_base_mj = mj - dev.energy_j * 1000.0
        dev.energy_j = (mj - base) / 1000.0
        out["energy_j"] = dev.energy_j

    def _read_temp(self, dev: _Dev, out: dict) -> None:
        q.call("nvmlDeviceGetTemperature", *dev.temp_args)
        out["gpu_temp_c"] = float(dev.temp_out.value)

    def _read_temp_v(self, dev: _Dev, out: dict) -> None:
        out["gpu_temp_c"] = float(q.query(_TEMP_V, dev.parent, _TEMP_GPU))

    def _read_sm_clock(self, dev: _Dev, out: dict) -> None:
        q.call("nvmlDeviceGetClockInfo", *dev.sm_clock_args)
        out["sm_clock_mhz"] = float(dev.sm_clock_out.value)

    def _read_mem_clock(self, dev: _Dev, out: dict) -> None:
        q.call("nvmlDeviceGetClockInfo", *dev.mem_clock_args)
        out["mem_clock_mhz"] = float(dev.mem_clock_out.value)

    def _read_event_reasons(self, dev: _Dev, out: dict) -> None:
        q.call("nvmlDeviceGetCurrentClocksEventReasons", *dev.reasons_args)
        out["throttle_reasons"] = float(dev.reasons_out.value)

    def _read_throttle_reasons(self, dev: _Dev, out: dict) -> None:
        out["throttle_reasons"] = float(q.query(_THROTTLE_REASONS, dev.parent))

    def _read_gpm(self, dev: _Dev, out: dict) -> None:
        n = dev.gpm_next
        if dev.is_mig:
            q.query(_GPM_MIG_SAMPLE, dev.parent, dev.gi_id, dev.gpm_samples[n])
        else:
            q.query(_GPM_SAMPLE, dev.handle, dev.gpm_samples[n])
        dev.gpm_next = 1 - n
        if not dev.gpm_primed:
            dev.gpm_primed = True
            return
        mg = dev.gpm_get[n]
        q.query(_GPM_METRICS, mg)
        raw = dev.gpm_unpack.unpack_from(mg)  # (ret0, value0, ret1, value1, ...)
        rets = raw[0::2]
        if not any(rets):
            out.update(zip(dev.gpm_names, raw[1::2]))
            for metric, scale in dev.gpm_scaled:
                out[metric] *= scale
            return
        for (metric, scale), ret, value in zip(dev.gpm_out, rets, raw[1::2]):
            if not ret:
                out[metric] = value * scale
        for (metric, _scale), ret in list(zip(dev.gpm_out, rets)):
            if ret:
                for moved in self._gpm_metric_failed(dev, metric, ret):
                    out.pop(moved, None)  # PCIe RX leaves GPM with TX: not half from each API

    # ------------------------------------------------------------------ read
    def read(self) -> Reading:
        """One reading of every live device (non-blocking NVML calls only; PCIe from cache)."""
        now = self._clock()
        reading: Reading = {}
        lost = False
        for dev in self._active:
            out: dict[str, float] = {}
            if self._read_device(dev, out, now):
                dev.ticks += 1
                reading[dev.key] = out
            else:
                lost = True
        if lost:
            self._active = tuple(d for d in self._active if not d.lost)
        return reading

    def _read_device(self, dev: _Dev, out: dict, now: float) -> bool:
        """Fill ``out`` with one sample of ``dev``; False when the device is lost."""
        readers = dev.readers
        unknown = self._run(dev, readers, out, now)
        if unknown < 0:
            return False
        tried = len(readers)
        if dev.readers is not readers:
            # A failure swapped in a fallback reader: run it now so this sample (and the
            # energy baseline taken by open()) does not miss it.
            unknown, tried = self._run_new(dev, readers, unknown, tried, out, now)
            if unknown < 0:
                return False
        if unknown and unknown == tried:
            self._lose(dev, None, now)
            return False
        if dev.energy_mode == "integral":
            self._integrate(dev, out, now)
        if dev.pcie_slow:
            cached = self._pcie.get(dev.key)
            if cached is not None and now - cached[2] <= self._pcie_max_age:
                out["pcie_tx_bytes_s"] = cached[0]
                out["pcie_rx_bytes_s"] = cached[1]
        return True

    def _run(self, dev: _Dev, readers: tuple, out: dict, now: float) -> int:
        """Run readers; the number that answered Unknown, or -1 when the GPU is lost."""
        unknown = 0
        for reader in readers:
            try:
                reader.fn(dev, out)
            except q.NvmlFailure as failure:
                kind = failure.kind
                if kind == q.LOST:
                    self._lose(dev, failure, now)
                    return -1
                if kind == q.UNKNOWN:
                    unknown += 1
                self._failed(dev, reader, failure)
        return unknown

    def _run_new(
        self, dev: _Dev, ran: tuple, unknown: int, tried: int, out: dict, now: float
    ) -> tuple[int, int]:
        """Run readers added by fallbacks during this pass: (unknown count or -1, tried)."""
        for _ in range(3):  # a fallback's own fallback, a few levels at most
            if dev.readers is ran:
                break
            new = tuple(r for r in dev.readers if r not in ran)
            ran = dev.readers
            if not new:
                break
            u = self._run(dev, new, out, now)
            if u < 0:
                return -1, tried
            unknown += u
            tried += len(new)
        return unknown, tried

    def _integrate(self, dev: _Dev, out: dict, now: float) -> None:
        power = out.get("power_w")
        if power is None:
            dev.last_power = None  # a gap is not integrated
            return
        if dev.last_power is not None:
            dev.energy_j += 0.5 * (power + dev.last_power) * (now - dev.last_t)
        dev.last_power, dev.last_t = power, now
        out["energy_j"] = dev.energy_j

    # --------------------------------------------------------------- failures
    def _note(self, text: str) -> None:
        with self._notes_lock:
            self._notes.add(text)

    def _lose(self, dev: _Dev, failure: q.NvmlFailure | None, now: float) -> None:
        dev.lost = True
        dev.pcie_slow = False
        self._pcie.pop(dev.key, None)
        why = f"{failure.function}: {failure.error}" if failure else "every NVML call answered Unknown Error"
        wall = time.strftime("%H:%M:%S")
        self._note(
            f"{dev.key}: GPU lost at {wall} ({now - self._t0:.1f} s after start; {why}); "
            f"its series ends there, the other GPUs go on"
        )

    def _remove_reader(self, dev: _Dev, name: str) -> None:
        dev.readers = tuple(r for r in dev.readers if r.name != name)

    def _replace_reader(self, dev: _Dev, name: str, new: _Reader) -> None:
        dev.readers = tuple(new if r.name == name else r for r in dev.readers)

    def _add_reader(self, dev: _Dev, new: _Reader) -> None:
        if all(r.name != new.name for r in dev.readers):
            dev.readers = dev.readers + (new,)

    def _drop(self, dev: _Dev, metrics: list[str], function: str, kind: str, error: Any) -> None:
        """Drop metrics of a device for the session, with one note."""
        for metric in metrics:
            if dev.ticks == 0:  # never produced a value: no provenance to keep
                dev.tags.pop(metric, None)
        names = ", ".join(metrics)
        if kind == q.FUNCTION_NOT_FOUND:
            # the same for every GPU: one note, without a device key
            self._note(
                f"{names}: {function} is missing from this driver's NVML library (Function Not "
                f"Found); dropped on every GPU (a newer driver has it)"
            )
        else:
            self._note(f"{dev.key}: {names} {_REASONS.get(kind, 'unavailable')} ({function}: {error}); dropped")

    def _failed(self, dev: _Dev, reader: _Reader, failure: q.NvmlFailure) -> None:
        kind = failure.kind
        if kind not in q.PERMANENT:
            what = _READER_METRICS.get(reader.name, reader.name)
            self._note(f"{dev.key}: {what} missing at times ({failure}); retried each sample")
            return
        fn, err = failure.function, failure.error
        name = reader.name
        if name == "util":
            self._remove_reader(dev, "util")
            dev.util_ok = False
            metrics = ["gpu_busy"] + (["sm_util"] if dev.util_sm else []) + (["mem_bw_util"] if dev.util_mem else [])
            dev.util_sm = dev.util_mem = False
            self._drop(dev, metrics, fn, kind, err)
        elif name == "memory":
            self._remove_reader(dev, "memory")
            self._drop(dev, ["gpu_mem_used_bytes", "gpu_mem_total_bytes"], fn, kind, err)
        elif name == "fields":  # the whole FieldValues call: both fall back to functions
            ids = list(dev.field_ids)
            self._set_fields(dev, [])
            self._remove_reader(dev, "fields")
            if _FI_POWER in ids:
                self._power_fallback(dev, f"{fn}: {err}")
            if _FI_ENERGY in ids:
                self._energy_fallback(dev)
        elif name == "power_usage":
            self._remove_reader(dev, "power_usage")
            metrics = ["power_w"]
            if dev.energy_mode == "integral":
                dev.energy_mode = None
                metrics.append("energy_j")
            self._drop(dev, metrics, fn, kind, err)
        elif name == "energy":
            self._remove_reader(dev, "energy")
            self._energy_to_integral(dev, fn, kind, err)
        elif name == "temp" and kind == q.FUNCTION_NOT_FOUND:
            self._replace_reader(dev, "temp", _Reader("temp_v", self._read_temp_v))
        elif name == "throttle" and kind == q.FUNCTION_NOT_FOUND:
            dev.tags["throttle_reasons"] = "nvml.clocks_throttle_reasons"
            self._replace_reader(dev, "throttle", _Reader("throttle_old", self._read_throttle_reasons))
        elif name == "gpm":
            self._gpm_failed(dev, f"{fn}: {err}")
        else:
            metric = {
                "temp": "gpu_temp_c", "temp_v": "gpu_temp_c", "sm_clock": "sm_clock_mhz",
                "mem_clock": "mem_clock_mhz", "throttle": "throttle_reasons",
                "throttle_old": "throttle_reasons",
            }[name]
            self._remove_reader(dev, name)
            self._drop(dev, [metric], fn, kind, err)

    def _field_failed(self, dev: _Dev, field_id: int, ret: int) -> None:
        error = pynvml.NVMLError(ret)
        kind = q.classify(error)
        if kind == q.LOST:
            raise q.NvmlFailure(kind, "nvmlDeviceGetFieldValues", error)
        if kind not in q.PERMANENT:
            return  # missing this time
        self._set_fields(dev, [f for f in dev.field_ids if f != field_id])
        if not dev.field_ids:
            self._remove_reader(dev, "fields")
        if field_id == _FI_POWER:
            self._power_fallback(dev, f"field NVML_FI_DEV_POWER_INSTANT: {error}")
        else:
            self._energy_fallback(dev)

    def _power_fallback(self, dev: _Dev, why: str) -> None:
        dev.tags["power_w"] = "nvml.power_usage" + dev.whole
        self._add_reader(dev, _Reader("power_usage", self._read_power_usage))
        self._note(
            f"{dev.key}: instant power not available ({why}); power_w is nvmlDeviceGetPowerUsage, "
            f"a 1 s average on Ampere and newer"
        )

    def _energy_fallback(self, dev: _Dev) -> None:
        # The field and the function read the same counter; try the function before integrating.
        dev.tags["energy_j"] = "nvml.total_energy" + dev.whole
        self._add_reader(dev, _Reader("energy", self._read_energy))

    def _energy_to_integral(self, dev: _Dev, function: str, kind: str, error: Any) -> None:
        has_power = _FI_POWER in dev.field_ids or any(r.name == "power_usage" for r in dev.readers)
        if not has_power:
            dev.energy_mode = None
            self._drop(dev, ["energy_j"], function, kind, error)
            return
        dev.energy_mode = "integral"
        dev.tags["energy_j"] = "integral.power_w" + dev.whole
        self._note(
            f"{dev.key}: no energy counter ({function}: {error}); energy_j is the integral of "
            f"power_w over time (gaps not integrated)"
        )

    def _gpm_failed(self, dev: _Dev, why: str) -> None:
        """GPM sampling itself failed for good: fall back to NVML utilization where we can."""
        self._remove_reader(dev, "gpm")
        metrics = [m for m, _s in dev.gpm_out]
        self._free_gpm(dev)
        dev.gpm_out = ()
        for metric in metrics:
            self._gpm_metric_fallback(dev, metric)
        dropped = [m for m in metrics if dev.tags.get(m, "gpm").startswith("gpm")]
        moved = [f"{m} -> {dev.tags[m]}" for m in metrics if m not in dropped]
        if dev.ticks == 0:
            for m in dropped:
                dev.tags.pop(m, None)
        parts = [f"{dev.key}: GPM unavailable ({why})"]
        if dropped:
            parts.append(f"{', '.join(dropped)} dropped")
        if moved:
            parts.append(f"falling back: {', '.join(moved)}")
        self._note("; ".join(parts))
        self._ensure_slow_lane()

    def _gpm_metric_fallback(self, dev: _Dev, metric: str) -> None:
        if metric == "sm_util" and dev.util_ok:
            dev.util_sm = True
            dev.tags["sm_util"] = "nvml.utilization.gpu"
        elif metric == "mem_bw_util" and dev.util_ok:
            dev.util_mem = True
            dev.tags["mem_bw_util"] = "nvml.utilization.memory"
        elif metric.startswith("pcie_") and not dev.is_mig:
            dev.pcie_slow = True
            dev.tags["pcie_tx_bytes_s"] = dev.tags["pcie_rx_bytes_s"] = "nvml.pcie_throughput"

    def _gpm_metric_failed(self, dev: _Dev, metric: str, code: int) -> set[str]:
        """Drop (or fall back) a GPM metric that failed; the metrics taken off GPM with it."""
        error = pynvml.NVMLError(code)
        kind = q.classify(error)
        if kind not in q.PERMANENT:
            return set()
        gone = {metric}
        if metric.startswith("pcie_"):  # TX and RX come from one API, never half from each
            gone |= {"pcie_tx_bytes_s", "pcie_rx_bytes_s"}
        keep = [(m, mid, s) for (m, s), mid in zip(dev.gpm_out, dev.gpm_ids) if m not in gone]
        self._set_gpm_metrics(dev, keep)
        before = dev.tags.get(metric)
        self._gpm_metric_fallback(dev, metric)
        if dev.tags.get(metric) != before:
            self._note(f"{dev.key}: GPM {metric} {_REASONS.get(kind, 'unavailable')} ({error}); falling back to {dev.tags[metric]}")
            self._ensure_slow_lane()
        else:
            self._drop(dev, [metric], "nvmlGpmMetricsGet", kind, error)
        if not keep:
            self._remove_reader(dev, "gpm")
            self._free_gpm(dev)
        return gone - {metric}

    # ------------------------------------------------------------- slow lane
    def _ensure_slow_lane(self) -> None:
        if self._slow_thread is not None or self._stop.is_set():
            return
        if not any(d.pcie_slow for d in self._active):
            return
        self._slow_thread = threading.Thread(target=self._slow_loop, name="gpuprof-nvml-slow-lane", daemon=True)
        self._slow_thread.start()

    def _slow_loop(self) -> None:
        while not self._stop.is_set():
            self._slow_pass()
            self._stop.wait(self._slow_interval)

    def _slow_pass(self) -> None:
        """Read PCIe throughput (blocking ~20 ms a call) of each device that needs it."""
        for dev in self._active:
            if not dev.pcie_slow or dev.lost or self._stop.is_set():
                continue
            try:
                tx = q.query(_PCIE, dev.handle, _PCIE_TX)
                rx = q.query(_PCIE, dev.handle, _PCIE_RX)
            except q.NvmlFailure as failure:
                if failure.kind in q.PERMANENT:
                    dev.pcie_slow = False
                    self._drop(dev, ["pcie_tx_bytes_s", "pcie_rx_bytes_s"], failure.function, failure.kind, failure.error)
                continue  # lost / transient: read() deals with the device
            self._pcie[dev.key] = (tx * _KIB, rx * _KIB, self._clock())
        with self._slow_cond:
            self._slow_passes += 1
            self._slow_cond.notify_all()

    def wait_slow_lane(self, passes: int = 1, timeout: float = 5.0) -> bool:
        """Block until the slow lane has made ``passes`` passes in all (tests, benchmarks)."""
        with self._slow_cond:
            return self._slow_cond.wait_for(lambda: self._slow_passes >= passes, timeout)

    # ------------------------------------------------------------ interface
    def provenance(self) -> dict[str, dict[str, str]]:
        """device key -> metric -> tag (metrics.PROVENANCE), lost devices included."""
        return {dev.key: dict(dev.tags) for dev in self._devs}

    def notes(self) -> list[str]:
        with self._notes_lock:
            return self._notes.list()

    def context(self) -> dict:
        return dict(self._context)

    def close(self) -> None:
        """Stop the slow lane (joined), free GPM samples, release NVML. Idempotent."""
        self._stop.set()
        thread, self._slow_thread = self._slow_thread, None
        if thread is not None:
            thread.join(timeout=5.0)
        if self._acquired:
            for dev in self._devs:
                self._free_gpm(dev)
            self._acquired = False
            q.release()
        self._active = ()


def _unavailable_message(failure: q.NvmlFailure) -> str:
    value = getattr(failure.error, "value", None)
    if value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return "NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver on this machine or container"
    if value == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return "NVIDIA driver not loaded (nvmlInit: Driver Not Loaded)"
    if value == pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return "NVML library and kernel driver versions differ (reboot or reload the driver)"
    if value == pynvml.NVML_ERROR_NO_PERMISSION:
        return "no permission to use NVML (nvmlInit: Insufficient Permissions)"
    return f"NVML cannot start ({failure.error})"
