"""Real GPUs through NVML (nvidia-ml-py), following the metric contract (docs/metrics.md).

Runs in the sampler process, and in the Jupyter server for its device list; never in the kernel.

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
  the trapezoid integral of ``power_w`` (tag ``integral.power_w``). After a sampler gap the
  counter's difference across it counts (it was measured); the integral is not carried
  across a gap (a new segment starts). Either way the sample is listed in
  ``final_context()["energy_gaps"]`` with one note per device. Power is never interpolated;
* ``gpu_mem_used_bytes``/``gpu_mem_total_bytes`` B, ``gpu_temp_c``, ``sm_clock_mhz``,
  ``mem_clock_mhz``, ``throttle_reasons`` (clock event reasons bitmask as a float);
* ``pcie_tx_bytes_s``/``pcie_rx_bytes_s`` B/s: GPM ``PCIE_TX/RX_PER_SEC`` (MiB/s), else
  ``nvmlDeviceGetPcieThroughput`` (KB/s, taken as KiB/s like nvitop; each call blocks ~20 ms)
  read by a slow-lane daemon thread at most once per ``slow_interval_s`` (native interval
  1 s); :meth:`read` only merges its cached values and never makes a blocking call.

Missing means absent from the reading, never 0. A metric whose call answers NotSupported,
NoPermission, FunctionNotFound or InvalidArgument is dropped for that device for the
session with one note (falling back where the contract has a fallback). A GPU that answers
GPU_IS_LOST (or Unknown to every call of a sample) leaves the readings, with a note; the
others go on. A MIG slice is a device of its own: memory from its handle, utilization from
GPM MIG samples of its GPU instance (absent when the parent has no GPM), power and energy
the parent's (tags ``*.whole_gpu``), temperature and clocks the parent's too.

All NVML calls are nvidia-ml-py's public functions, through :mod:`.query`; nothing here
touches CUDA. This module plans and reads; the rest lives beside it, one job each:
:mod:`.device` (the per-device record), :mod:`.readers` (one function per call and
the table of what each feeds), :mod:`.fallbacks` (what a failing call turns into) and
:mod:`.pcie` (the slow lane's thread).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

import pynvml

from gpuprof_jupyter.core.sources.nvml import query as q
from gpuprof_jupyter.core.protocol import is_gap
from gpuprof_jupyter.core.sources.base import DeviceInfo, Gap, NoteBook, Reading, SourceUnavailable
from gpuprof_jupyter.core.sources.nvml.device import NvmlDevice
from gpuprof_jupyter.core.sources.nvml.fallbacks import Fallbacks
from gpuprof_jupyter.core.sources.nvml.pcie import PcieSlowLane
from gpuprof_jupyter.core.sources.nvml.readers import FI_ENERGY, FI_POWER, READERS
from gpuprof_jupyter.core.sources.nvml.visible_devices import VisibleDevice, enumerate_nvml_devices, select_visible
from gpuprof_jupyter.core.format import fmt_unit

_MIB = 1024.0 * 1024.0

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


class NvmlSource:
    """NVML GPUs; see the module docstring for what each metric is and when it is missing.

    Native intervals: ``interval_s`` is None, i.e. the fast lane (every metric but NVML's
    PCIe throughput) is read at the session's sampling interval; the PCIe slow lane runs at
    ``slow_interval_s`` (1 s by default, ``slow_lane_interval_s``).

    Args:
        devices: indices among the *visible* GPUs (CUDA_VISIBLE_DEVICES order) to read;
            None reads all of them. Keys stay ``gpu{visible index}``.
        clock: monotonic clock (seconds), used for energy integration, gaps and PCIe cache age.
        slow_interval_s: seconds between two slow-lane (PCIe throughput) passes.
        only: the names of the readers (``readers.READERS``) to plan, e.g. ``("util",
            "memory", "fields")`` for the session record's low-rate reads; then no GPM and no
            PCIe slow lane either (their fallbacks still apply). None: every metric.
    """

    name = "nvml"
    simulated = False
    interval_s: float | None = None  # the fast lane runs at the session's interval

    def __init__(
        self,
        devices: list[int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        slow_interval_s: float = 1.0,
        only: tuple[str, ...] | None = None,
    ) -> None:
        self._want = None if devices is None else list(devices)
        self._only = None if only is None else tuple(only)
        self._clock = clock
        self.slow_lane_interval_s = float(slow_interval_s)
        self._session_interval_s: float | None = None  # set_session_interval
        self._notes = NoteBook()
        self._notes_lock = threading.Lock()
        self._fallbacks = Fallbacks(self._note, self._start_slow_lane)
        self._devs: list[NvmlDevice] = []
        self._active: tuple[NvmlDevice, ...] = ()
        self._infos: list[DeviceInfo] = []
        self._context: dict = {}
        self._acquired = False
        self._t0 = 0.0
        self._last_read = 0.0
        self._energy_gaps: list[dict] = []
        self._slow_lane = self._new_slow_lane()

    def set_session_interval(self, interval_s: float) -> None:
        """Tell the source the session's sampling interval, at which its fast lane is read.

        A read more than two such intervals after the previous one comes after a gap (the
        one definition of a gap, docs/architecture.md): the energy counter's difference across
        it is kept and the sample is listed in ``final_context()["energy_gaps"]``; the power
        integral (no counter) is not carried across it. Until this is called, no gap is seen.
        """
        if not interval_s > 0:
            raise ValueError(f"session interval must be > 0 s, got {interval_s!r}")
        self._session_interval_s = float(interval_s)

    def _new_slow_lane(self) -> PcieSlowLane:
        return PcieSlowLane(self.slow_lane_interval_s, self._clock, self._pcie_unsupported)

    # ------------------------------------------------------------------ open
    def open(self) -> list[DeviceInfo]:
        """Initialise NVML, match visible devices, plan each device's reads, take a baseline.

        Raises:
            SourceUnavailable: no NVML library, driver not loaded, or no visible GPU.
            ValueError: ``devices`` names a GPU that is not visible.
        """
        self.close()
        self._notes = NoteBook()
        self._slow_lane = self._new_slow_lane()
        self._energy_gaps = []
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
        now = self._last_read = self._clock()
        first: dict[str, dict] = {}
        for dev in self._active:
            first[dev.key] = out = {}
            self._read_device(dev, out, now)
        self._active = tuple(d for d in self._devs if not d.lost)
        self._infos = [self._info(dev, first[dev.key]) for dev in self._active]
        if not self._active:
            raise SourceUnavailable("every visible GPU was lost while opening: " + "; ".join(self.notes()))
        self._start_slow_lane()
        return list(self._infos)

    def final_context(self) -> dict:
        """Facts known only at the end of a run: the samples whose ``energy_j`` came after a
        sampler gap (``energy_gaps``: device, ``start_mono``/``end_mono`` on the source's clock,
        and whether the energy across the gap is ``counted`` (counter) or ``not integrated``
        (integral of power)). Other processes on our GPUs: ``gpu_processes.ProcessShareSource``,
        which knows the kernel's process tree."""
        context = {}
        if self._energy_gaps:
            context["energy_gaps"] = list(self._energy_gaps)
        return context

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

    def _info(self, dev: NvmlDevice, first: dict) -> DeviceInfo:
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
                "gpm": dev.gpm.on,
                "mig_gpu_instance_id": dev.gi_id,
                "power_limit_whole_gpu": dev.is_mig,
            },
        )


    # ------------------------------------------------------------------ plan
    def _plan(self, vis: VisibleDevice) -> NvmlDevice:
        dev = NvmlDevice(f"gpu{vis.visible_index}", vis)
        key, w = dev.key, dev.whole
        support = q.query_or(None, pynvml.nvmlGpmQueryDeviceSupport, dev.parent)
        parent_gpm = bool(support is not None and support.isSupportedDevice)
        if (dev.is_mig and dev.gi_id is None) or self._only is not None:
            parent_gpm = False
        names: list[str] = []
        if parent_gpm:
            self._setup_gpm(dev, _GPM_MIG if dev.is_mig else _GPM_GPU)
        if dev.gpm.on:  # first: its per-metric fallbacks to utilization apply in the same sample
            names.append("gpm")
        if not dev.is_mig:
            dev.util_ok = True
            dev.util_sm = dev.util_mem = not dev.gpm.on
            dev.tags["gpu_busy"] = "nvml.utilization.gpu"
            if not dev.gpm.on:
                dev.tags["sm_util"] = "nvml.utilization.gpu"
                dev.tags["mem_bw_util"] = "nvml.utilization.memory"
                if self._only is None:
                    dev.pcie_slow = True
                    dev.tags["pcie_tx_bytes_s"] = dev.tags["pcie_rx_bytes_s"] = "nvml.pcie_throughput"
                self._note(
                    f"{key}: sm_occupancy, tensor_util not supported by this GPU (no GPM); sm_util is "
                    f"NVML utilization.gpu (kernel-active time, not the share of SMs busy) and "
                    f"mem_bw_util is utilization.memory (memory-active time, not bandwidth)"
                )
            names.append("util")
        else:
            self._note(
                f"{key}: MIG slice of {vis.gpu.uuid}: power_w and energy_j are the whole GPU's "
                f"(not this slice's), temperature and clocks are the GPU's; gpu_busy and PCIe "
                f"throughput are not reported per slice"
            )
            if not dev.gpm.on:
                self._note(
                    f"{key}: sm_util, mem_bw_util, sm_occupancy, tensor_util not available on this "
                    f"MIG slice: its GPU has no GPM, and NVML utilization is not reported per slice"
                )
        dev.tags["gpu_mem_used_bytes"] = dev.tags["gpu_mem_total_bytes"] = "nvml.memory_info"
        # power and energy: one FieldValues call for both
        dev.set_fields([FI_POWER, FI_ENERGY])
        dev.tags["power_w"] = "nvml.field.power_instant" + w
        dev.tags["energy_j"] = "nvml.field.total_energy" + w
        dev.energy.mode = "counter"
        dev.tags["gpu_temp_c"] = "nvml.temperature"
        dev.tags["sm_clock_mhz"] = "nvml.clock.sm"
        dev.tags["mem_clock_mhz"] = "nvml.clock.mem"
        dev.tags["throttle_reasons"] = "nvml.clocks_event_reasons"
        names += ["memory", "fields", "temp", "sm_clock", "mem_clock", "throttle"]
        if self._only is not None:
            names = [n for n in names if n in self._only]
            kept = {m for n in names for m in READERS[n].metrics} | ({"sm_util", "mem_bw_util"} if "util" in names else set())
            dev.tags = {m: tag for m, tag in dev.tags.items() if m in kept}
        dev.readers = tuple(READERS[n] for n in names)
        return dev

    def _setup_gpm(self, dev: NvmlDevice, metrics: tuple) -> None:
        try:
            dev.gpm.samples = (q.query(pynvml.nvmlGpmSampleAlloc),)
            dev.gpm.samples += (q.query(pynvml.nvmlGpmSampleAlloc),)
        except q.NvmlFailure as failure:
            dev.gpm.free()
            self._note(f"{dev.key}: GPM samples cannot be allocated ({failure}); GPM metrics not read")
            return
        dev.gpm.on = True
        for metric, _mid, _scale, tag in metrics:
            dev.tags[metric] = "gpm.mig" if dev.is_mig else tag
        dev.gpm.set_metrics([(m, mid, scale) for m, mid, scale, _t in metrics])

    # ------------------------------------------------------------------ read
    def read(self) -> Reading:
        """One reading of every live device (non-blocking NVML calls only; PCIe from cache)."""
        now = self._clock()
        interval = self._session_interval_s
        gap_start = self._last_read if interval is not None and is_gap(self._last_read, now, interval) else None
        self._last_read = now
        reading: Reading = {}
        lost = False
        for dev in self._active:
            out: dict[str, float] = {}
            if self._read_device(dev, out, now, gap_start):
                dev.ticks += 1
                reading[dev.key] = out
            else:
                lost = True
        if lost:
            self._active = tuple(d for d in self._active if not d.lost)
        return reading

    def _read_device(self, dev: NvmlDevice, out: dict, now: float, gap_start: float | None = None) -> bool:
        """Fill ``out`` with one sample of ``dev``; False when the device is lost.

        ``gap_start``: time of the previous read when this one comes after a gap.
        """
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
        if dev.energy.mode == "integral":
            joules = dev.energy.integrate(out.get("power_w"), now, new_segment=gap_start is not None)
            if joules is not None:
                out["energy_j"] = joules
        if gap_start is not None and "energy_j" in out:
            self._energy_after_gap(dev, gap_start, now)
        if dev.pcie_slow:
            cached = self._slow_lane.cached(dev.key, now)
            if cached is not None:
                out["pcie_tx_bytes_s"], out["pcie_rx_bytes_s"] = cached
        return True

    def _run(self, dev: NvmlDevice, readers: tuple, out: dict, now: float) -> int:
        """Run readers; the number that answered Unknown, or -1 when the GPU is lost."""
        unknown = 0
        for reader in readers:
            try:
                failed = reader.fn(dev, out)
                if failed:
                    self._fallbacks.partly_failed(dev, reader, failed, out)
            except q.NvmlFailure as failure:
                kind = failure.kind
                if kind == q.LOST:
                    self._lose(dev, failure, now)
                    return -1
                if kind == q.UNKNOWN:
                    unknown += 1
                self._fallbacks.failed(dev, reader, failure)
        return unknown

    def _run_new(
        self, dev: NvmlDevice, ran: tuple, unknown: int, tried: int, out: dict, now: float
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

    def _energy_after_gap(self, dev: NvmlDevice, start: float, end: float) -> None:
        """Record that this sample's ``energy_j`` comes after a gap, and say what it holds."""
        counted = dev.energy.mode != "integral"
        self._energy_gaps.append({
            "device": dev.key, "start_mono": start, "end_mono": end,
            "energy": "counted" if counted else "not integrated",
        })
        if counted:
            self._note(
                f"{dev.key}: energy_j after a sampler gap includes the energy counter's difference "
                f"across it (measured, not interpolated); those samples are listed in the "
                f"experiment context (energy_gaps)"
            )
        else:
            self._note(
                f"{dev.key}: energy_j leaves out sampler gaps (the integral of power_w restarts "
                f"after each; power is never interpolated); they are listed in the experiment "
                f"context (energy_gaps)"
            )

    # --------------------------------------------------------------- failures
    def _note(self, text: str) -> None:
        with self._notes_lock:
            self._notes.add(text)

    def _lose(self, dev: NvmlDevice, failure: q.NvmlFailure | None, now: float) -> None:
        dev.lost = True
        dev.pcie_slow = False
        self._slow_lane.forget(dev.key)
        why = f"{failure.function}: {failure.error}" if failure else "every NVML call answered Unknown Error"
        wall = time.strftime("%H:%M:%S")
        self._note(
            f"{dev.key}: GPU lost at {wall} ({fmt_unit(now - self._t0, 's', 1)} after start; {why}); "
            f"its series ends there, the other GPUs go on"
        )

    def _pcie_unsupported(self, dev: NvmlDevice, failure: q.NvmlFailure) -> None:
        self._fallbacks.drop(dev, ["pcie_tx_bytes_s", "pcie_rx_bytes_s"], failure.function, failure.kind, failure.error)

    def _start_slow_lane(self) -> None:
        self._slow_lane.start_if_needed(self._active)

    def take_gaps(self) -> list[Gap]:
        """Gaps of the PCIe slow lane (source ``nvml.pcie``, against its own 1 s interval)
        since the last call. The fast lane's gaps are the sampler's to record."""
        return self._slow_lane.take_gaps()

    def wait_slow_lane(self, passes: int = 1, timeout: float = 5.0) -> bool:
        """Block until the slow lane has made ``passes`` passes in all (tests, benchmarks)."""
        return self._slow_lane.wait(passes, timeout)

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
        self._slow_lane.close()
        if self._acquired:
            for dev in self._devs:
                dev.gpm.free()
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
