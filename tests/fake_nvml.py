"""A fake NVML library placed *below* nvidia-ml-py's public functions.

``FakeNvml`` replaces the loaded C library (``pynvml.nvmlLib``) with an object whose
attributes are Python callables taking the very ctypes arguments pynvml's wrappers pass
(``c_uint``, ``byref(struct)``, string buffers, opaque handle pointers) and returning NVML
return codes. So pynvml's real wrappers run (``nvmlDeviceGetUtilizationRates``,
``nvmlDeviceGetFieldValues``, ``nvmlGpmMetricsGet`` ...), build their real structs, go
through the real ``_nvmlGetFunctionPointer`` (a function the fake lacks raises the real
``NVMLError_FunctionNotFound``) and the real ``_nvmlCheckReturn`` (real ``NVMLError_*``
classes). "No library at all" patches ``pynvml.CDLL`` so the real ``_LoadNvmlLibrary``
raises ``NVMLError_LibraryNotFound``.

Usage::

    fake = FakeNvml([a100(0), h100(1)], latency={"nvmlDeviceGetPcieThroughput": 0.02})
    with fake:                      # install(); uninstall() on exit
        src = NvmlSource(); src.open(); src.read()
        fake.gpus[0].power_instant_mw = 250_000      # values are plain attributes
        fake.gpus[1].errors["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_NOT_SUPPORTED
        fake.lose(1)                                  # NVML_ERROR_GPU_IS_LOST from now on
        fake.count("nvmlDeviceGetPcieThroughput", thread=threading.get_ident())

Configuration (all mutable between calls):

* ``FakeGpu`` fields: name, uuid, ``gpm`` (Hopper-like GPM support), utilization, memory,
  power (``power_usage_mw`` = 1 s average, ``power_instant_mw`` = field 186), energy
  counter ``energy_mj``, temperature, clocks, ``throttle_reasons``, PCIe KB/s,
  ``gpm_values`` (metric id -> value, PCIe in MiB/s as NVML gives it), ``gpm_errors``
  (metric id -> NVML error code), ``errors`` (NVML function name -> error code for this
  device: NotSupported, NoPermission, ...), ``field_errors`` (field id -> code; field 83
  also follows ``errors["nvmlDeviceGetTotalEnergyConsumption"]``, as on real drivers where
  both read one counter), ``lost_after_reads`` (GPU_IS_LOST once
  ``nvmlDeviceGetMemoryInfo`` has answered that many times: one per sample), ``unknown``
  (every call answers NVML_ERROR_UNKNOWN), ``mig_mode`` + ``migs`` (``FakeMig``);
  per-process attribution: ``processes``, ``graphics_processes`` ((host pid, used bytes)) and
  ``process_sm_util`` (host pid -> smUtil %), served by ``ProcessListsFake``.
* ``FakeNvml(..., missing_functions=...)``: functions absent from the library
  (FunctionNotFound); ``library_present=False``: no libnvidia-ml at all;
  ``init_error``: code nvmlInit returns (e.g. NVML_ERROR_DRIVER_NOT_LOADED);
  ``latency``: function name -> seconds slept per call (for benchmarks);
  ``default_latency``: seconds slept by every call; ``record_calls``: keep ``calls``
  (name, thread id) (turn off for benchmarks).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import pynvml

GIB = 1024**3
SUCCESS = pynvml.NVML_SUCCESS
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
UNKNOWN = pynvml.NVML_ERROR_UNKNOWN
INVALID = pynvml.NVML_ERROR_INVALID_ARGUMENT

GPM_SM_UTIL = pynvml.NVML_GPM_METRIC_SM_UTIL
GPM_SM_OCCUPANCY = pynvml.NVML_GPM_METRIC_SM_OCCUPANCY
GPM_ANY_TENSOR_UTIL = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
GPM_DRAM_BW_UTIL = pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
GPM_PCIE_TX = pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC
GPM_PCIE_RX = pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC

FI_POWER_INSTANT = pynvml.NVML_FI_DEV_POWER_INSTANT
FI_POWER_AVERAGE = pynvml.NVML_FI_DEV_POWER_AVERAGE
FI_TOTAL_ENERGY = pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION


def _default_gpm() -> dict[int, float]:
    return {
        GPM_SM_UTIL: 62.5,
        GPM_SM_OCCUPANCY: 31.25,
        GPM_ANY_TENSOR_UTIL: 40.0,
        GPM_DRAM_BW_UTIL: 55.0,
        GPM_PCIE_TX: 100.0,  # MiB/s
        GPM_PCIE_RX: 300.0,  # MiB/s
    }


@dataclass
class FakeMig:
    """A MIG device of a FakeGpu in MIG mode."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    gpu_instance_id: int = 1
    compute_instance_id: int = 0
    memory_total: int = 10 * GIB
    memory_used: int = 2 * GIB
    gpm_values: dict[int, float] = field(
        default_factory=lambda: {GPM_SM_UTIL: 80.0, GPM_SM_OCCUPANCY: 20.0, GPM_ANY_TENSOR_UTIL: 10.0, GPM_DRAM_BW_UTIL: 30.0}
    )
    errors: dict[str, int] = field(default_factory=dict)
    parent: "FakeGpu | None" = None


@dataclass
class FakeGpu:
    name: str
    uuid: str
    gpm: bool = False
    util_gpu: int = 90  # %
    util_mem: int = 45  # %
    memory_total: int = 40 * GIB
    memory_used: int = 12 * GIB
    power_usage_mw: int = 250_000  # 1 s average
    power_instant_mw: int = 275_500  # field NVML_FI_DEV_POWER_INSTANT
    power_limit_mw: int = 400_000
    energy_mj: int = 1_000_000_000  # counter since driver load
    temp_c: int = 61
    sm_clock_mhz: int = 1410
    mem_clock_mhz: int = 1215
    video_clock_mhz: int = 1275
    throttle_reasons: int = 0x4  # sw_power_cap
    pcie_tx_kbs: int = 2_000  # KB/s
    pcie_rx_kbs: int = 50_000
    gpm_values: dict[int, float] = field(default_factory=_default_gpm)
    gpm_errors: dict[int, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    field_errors: dict[int, int] = field(default_factory=dict)
    lost_after_reads: int | None = None
    lost: bool = False
    unknown: bool = False
    mig_mode: bool = False
    migs: list[FakeMig] = field(default_factory=list)
    memory_reads: int = 0
    processes: list[tuple[int, int]] = field(default_factory=list)  # compute: (host pid, used bytes)
    # per-process attribution (issue 13; see ProcessListsFake below)
    graphics_processes: list[tuple[int, int]] = field(default_factory=list)  # (host pid, used bytes)
    process_sm_util: dict[int, int] = field(default_factory=dict)  # host pid -> smUtil % (none: NOT_FOUND)


def a100(i: int = 0, **kw: Any) -> FakeGpu:
    """An A100-like GPU: no GPM, 40 GB."""
    kw.setdefault("uuid", f"GPU-a100{i:04x}-0000-1111-2222-{i:012x}")
    return FakeGpu(name="NVIDIA A100-SXM4-40GB", gpm=False, **kw)


def h100(i: int = 0, **kw: Any) -> FakeGpu:
    """An H100-like GPU: GPM supported, 80 GB."""
    kw.setdefault("uuid", f"GPU-h100{i:04x}-3333-4444-5555-{i:012x}")
    kw.setdefault("memory_total", 80 * GIB)
    kw.setdefault("power_limit_mw", 700_000)
    return FakeGpu(name="NVIDIA H100 80GB HBM3", gpm=True, **kw)


def _int(x: Any) -> int:
    return x.value if hasattr(x, "value") else int(x)


def _addr(ptr: Any) -> int | None:
    return ctypes.c_void_p.from_buffer(ptr).value


def _set_addr(ptr: Any, addr: int) -> None:
    ctypes.c_void_p.from_buffer(ptr).value = addr


def _out(ref: Any) -> Any:
    """The object behind byref(obj) (pynvml passes output arguments this way)."""
    return ref._obj


_GPU_BASE = 0x10000
_MIG_BASE = 0x20000
_SAMPLE_BASE = 0x40000

# Functions that a MIG device handle answers; any other answers NOT_SUPPORTED on a MIG handle.
_MIG_OK = {
    "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", "nvmlDeviceIsMigDeviceHandle",
}


def _hang(seconds: float, release_file: str | None) -> None:
    """A stuck call: ``seconds``, or until ``release_file`` exists (``seconds`` then only bounds
    it), so a test can tell what happened while the call was still stuck."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (release_file and os.path.exists(release_file)):
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


class _Lib:
    """Stands in for the CDLL: attribute lookup gives the fake C function or AttributeError."""

    def __init__(self, fake: "FakeNvml") -> None:
        self._fake = fake

    def __getattr__(self, name: str) -> Callable:
        fake = self._fake
        impl = fake._impls.get(name)
        if impl is None or name in fake.missing_functions:
            raise AttributeError(name)

        def c_function(*args: Any) -> Any:
            if fake.record_calls:
                fake.calls.append((name, threading.get_ident()))
            delay = fake.latency.get(name, fake.default_latency)
            hang = fake.hang
            if hang and hang["function"] == name:
                hang["calls"] = hang.get("calls", 0) + 1
                if hang["calls"] == hang["after_calls"]:  # one call hangs (a stuck driver), later ones answer
                    _hang(hang["seconds"], hang.get("release_file"))
            if delay:
                time.sleep(delay)
            return impl(*args)

        c_function.__name__ = name
        return c_function


# ------------------------------------------------------------------------------------------
# Per-process attribution (issue 13): running-process lists and per-process utilization.
# Kept apart from the rest of the fake; FakeNvml inherits it.
# ------------------------------------------------------------------------------------------
class ProcessListsFake:
    """Running-process lists (compute ``FakeGpu.processes``, graphics ``graphics_processes``:
    (host pid, used bytes)), _v3 and _v2 (``missing_functions`` removes either), and
    ``nvmlDeviceGetProcessUtilization`` with pynvml's real ``c_nvmlProcessUtilizationSample_t``
    and NVML's two-call size protocol: a NULL buffer answers NVML_ERROR_INSUFFICIENT_SIZE with the
    count; no process with samples answers NVML_ERROR_NOT_FOUND. Each call's samples carry the
    current CPU time (µs), so every call sees new samples. ``errors["nvmlDeviceGetProcessUtilization"]
    = NOT_SUPPORTED`` stands for an old driver or GPU; a MIG handle answers NOT_SUPPORTED."""

    def _processes(self, name: str, attr: str, handle: Any, count: Any, infos: Any) -> int:
        dev, code = self._check(name, handle)
        if code:
            return code
        procs = getattr(dev, attr, [])
        if not procs:
            _out(count).value = 0
            return SUCCESS
        if infos is None or _out(count).value < len(procs):
            _out(count).value = len(procs)
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        for i, (pid, used) in enumerate(procs):
            infos[i].pid = pid
            infos[i].usedGpuMemory = used
        _out(count).value = len(procs)
        return SUCCESS

    def c_nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count: Any, infos: Any) -> int:
        return self._processes("nvmlDeviceGetComputeRunningProcesses", "processes", handle, count, infos)

    def c_nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any, count: Any, infos: Any) -> int:
        return self._processes("nvmlDeviceGetComputeRunningProcesses", "processes", handle, count, infos)

    def c_nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: Any, count: Any, infos: Any) -> int:
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses", "graphics_processes", handle, count, infos)

    def c_nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: Any, count: Any, infos: Any) -> int:
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses", "graphics_processes", handle, count, infos)

    def c_nvmlDeviceGetProcessUtilization(self, handle: Any, samples: Any, count: Any, last_seen: Any) -> int:
        dev, code = self._check("nvmlDeviceGetProcessUtilization", handle)
        if code:
            return code
        now_us = int(time.time() * 1e6)
        entries = [(int(pid), sm) for pid, sm in dev.process_sm_util.items() if now_us > _int(last_seen)]
        if not entries:
            return pynvml.NVML_ERROR_NOT_FOUND
        if samples is None or _out(count).value < len(entries):
            _out(count).value = len(entries)
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        for i, (pid, sm) in enumerate(entries):
            sample = samples[i]
            sample.pid, sample.timeStamp, sample.smUtil = pid, now_us, sm
            sample.memUtil = sample.encUtil = sample.decUtil = 0
        _out(count).value = len(entries)
        return SUCCESS


class FakeNvml(ProcessListsFake):
    """A configurable fake NVML library; see the module docstring."""

    def __init__(
        self,
        gpus: Iterable[FakeGpu] = (),
        *,
        driver_version: str = "550.54.15",
        cuda_driver_version: int = 12040,
        nvml_version: str = "12.550.54.15",
        missing_functions: Iterable[str] = (),
        library_present: bool = True,
        init_error: int | None = None,
        latency: dict[str, float] | None = None,
        default_latency: float = 0.0,
        record_calls: bool = True,
    ) -> None:
        self.gpus: list[FakeGpu] = list(gpus)
        self.driver_version = driver_version
        self.cuda_driver_version = cuda_driver_version
        self.nvml_version = nvml_version
        self.missing_functions: set[str] = set(missing_functions)
        self.library_present = library_present
        self.init_error = init_error
        self.latency: dict[str, float] = dict(latency or {})
        self.default_latency = default_latency
        self.record_calls = record_calls
        self.hang: dict | None = None  # {"function", "after_calls", "seconds"}: see install_from_spec
        self.calls: list[tuple[str, int]] = []
        self.init_count = 0
        self.shutdown_count = 0
        self._refs = 0
        self._samples: dict[int, dict | None] = {}
        self._next_sample = 0
        self._saved: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._impls: dict[str, Callable] = {
            name[2:]: getattr(self, name) for name in dir(type(self)) if name.startswith("c_nvml")
        }

    # ----------------------------------------------------------------- install
    def install(self) -> "FakeNvml":
        for gpu in self.gpus:
            for mig in gpu.migs:
                mig.parent = gpu
        self._saved = {
            "nvmlLib": pynvml.nvmlLib,
            "refcount": pynvml._nvmlLib_refcount,
            "CDLL": pynvml.CDLL,
            "cache": dict(pynvml._nvmlGetFunctionPointer_cache),
        }
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
        if self.library_present:
            pynvml.nvmlLib = _Lib(self)
        else:
            pynvml.nvmlLib = None

            def no_library(*_a: Any, **_k: Any) -> None:
                raise OSError("libnvidia-ml.so.1: cannot open shared object file (fake)")

            pynvml.CDLL = no_library
        _reset_query_helper()
        return self

    def uninstall(self) -> None:
        if self._saved is None:
            return
        pynvml.nvmlLib = self._saved["nvmlLib"]
        pynvml._nvmlLib_refcount = self._saved["refcount"]
        pynvml.CDLL = self._saved["CDLL"]
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlGetFunctionPointer_cache.update(self._saved["cache"])
        self._saved = None
        _reset_query_helper()

    def __enter__(self) -> "FakeNvml":
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()

    # ------------------------------------------------------------ test helpers
    def lose(self, i: int) -> None:
        """GPU i answers NVML_ERROR_GPU_IS_LOST to every call from now on."""
        self.gpus[i].lost = True

    def set_missing(self, *names: str) -> None:
        """Remove functions from the library now (clears pynvml's function cache)."""
        self.missing_functions.update(names)
        pynvml._nvmlGetFunctionPointer_cache.clear()

    def count(self, name: str, thread: int | None = None) -> int:
        """How many times the C function ``name`` was called (optionally from one thread)."""
        return sum(1 for n, t in list(self.calls) if n == name and (thread is None or t == thread))

    @property
    def initialised(self) -> bool:
        return self._refs > 0

    # --------------------------------------------------------------- internals
    def _gpu_handle_addr(self, i: int) -> int:
        return _GPU_BASE + 0x10 * i

    def _mig_handle_addr(self, i: int, j: int) -> int:
        return _MIG_BASE + 0x100 * i + 0x10 * j

    def _resolve(self, handle: Any) -> FakeGpu | FakeMig | None:
        addr = _addr(handle)
        if addr is None:
            return None
        if _GPU_BASE <= addr < _MIG_BASE:
            i = (addr - _GPU_BASE) // 0x10
            return self.gpus[i] if i < len(self.gpus) else None
        if _MIG_BASE <= addr < _SAMPLE_BASE:
            i, j = divmod(addr - _MIG_BASE, 0x100)
            j //= 0x10
            if i < len(self.gpus) and j < len(self.gpus[i].migs):
                return self.gpus[i].migs[j]
        return None

    def _check(self, name: str, handle: Any) -> tuple[Any, int]:
        """(device, SUCCESS) or (None, error code) for a per-device call."""
        if not self._refs:
            return None, pynvml.NVML_ERROR_UNINITIALIZED
        dev = self._resolve(handle)
        if dev is None:
            return None, INVALID
        gpu = dev.parent if isinstance(dev, FakeMig) else dev
        if gpu.lost:
            return None, GPU_IS_LOST
        if gpu.unknown:
            return None, UNKNOWN
        if isinstance(dev, FakeMig) and name not in _MIG_OK and not name.startswith("nvmlGpm"):
            return None, NOT_SUPPORTED
        code = dev.errors.get(name)
        if code:
            return None, code
        return dev, SUCCESS

    # ------------------------------------------------------------ C functions
    # Each c_<nvml function name> is what _nvmlGetFunctionPointer(<name>) returns.
    def c_nvmlInitWithFlags(self, flags: Any) -> int:
        if self.init_error:
            return self.init_error
        self._refs += 1
        self.init_count += 1
        return SUCCESS

    def c_nvmlInit_v2(self) -> int:
        return self.c_nvmlInitWithFlags(0)

    def c_nvmlShutdown(self) -> int:
        if not self._refs:
            return pynvml.NVML_ERROR_UNINITIALIZED
        self._refs -= 1
        self.shutdown_count += 1
        return SUCCESS

    def c_nvmlErrorString(self, result: Any) -> bytes:
        return f"fake NVML error {_int(result)}".encode()

    def _string(self, buf: Any, size: Any, text: str) -> int:
        data = text.encode()
        if len(data) + 1 > _int(size):
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        buf.value = data
        return SUCCESS

    def c_nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> int:
        return self._string(buf, size, self.driver_version) if self._refs else pynvml.NVML_ERROR_UNINITIALIZED

    def c_nvmlSystemGetNVMLVersion(self, buf: Any, size: Any) -> int:
        return self._string(buf, size, self.nvml_version) if self._refs else pynvml.NVML_ERROR_UNINITIALIZED

    def c_nvmlSystemGetCudaDriverVersion(self, ref: Any) -> int:
        _out(ref).value = self.cuda_driver_version
        return SUCCESS

    def c_nvmlSystemGetCudaDriverVersion_v2(self, ref: Any) -> int:
        return self.c_nvmlSystemGetCudaDriverVersion(ref)

    def c_nvmlDeviceGetCount_v2(self, ref: Any) -> int:
        if not self._refs:
            return pynvml.NVML_ERROR_UNINITIALIZED
        _out(ref).value = len(self.gpus)
        return SUCCESS

    def c_nvmlDeviceGetHandleByIndex_v2(self, index: Any, ref: Any) -> int:
        if not self._refs:
            return pynvml.NVML_ERROR_UNINITIALIZED
        i = _int(index)
        if i >= len(self.gpus):
            return INVALID
        code = self.gpus[i].errors.get("nvmlDeviceGetHandleByIndex_v2")
        if code:
            return code
        _set_addr(_out(ref), self._gpu_handle_addr(i))
        return SUCCESS

    def c_nvmlDeviceGetUUID(self, handle: Any, buf: Any, size: Any) -> int:
        dev, code = self._check("nvmlDeviceGetUUID", handle)
        return code if code else self._string(buf, size, dev.uuid)

    def c_nvmlDeviceGetName(self, handle: Any, buf: Any, size: Any) -> int:
        dev, code = self._check("nvmlDeviceGetName", handle)
        return code if code else self._string(buf, size, dev.name)

    def c_nvmlDeviceGetIndex(self, handle: Any, ref: Any) -> int:
        dev, code = self._check("nvmlDeviceGetIndex", handle)
        if code:
            return code
        _out(ref).value = self.gpus.index(dev)
        return SUCCESS

    def c_nvmlDeviceGetMigMode(self, handle: Any, cur: Any, pending: Any) -> int:
        dev, code = self._check("nvmlDeviceGetMigMode", handle)
        if code:
            return code
        if not dev.mig_mode and not dev.migs and "A100" not in dev.name and "H100" not in dev.name:
            return NOT_SUPPORTED
        _out(cur).value = _out(pending).value = int(dev.mig_mode)
        return SUCCESS

    def c_nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, ref: Any) -> int:
        dev, code = self._check("nvmlDeviceGetMaxMigDeviceCount", handle)
        if code:
            return code
        _out(ref).value = 7 if dev.mig_mode else 0
        return SUCCESS

    def c_nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, ref: Any) -> int:
        dev, code = self._check("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if code:
            return code
        j = _int(index)
        if not dev.mig_mode:
            return INVALID
        if j >= len(dev.migs):
            return pynvml.NVML_ERROR_NOT_FOUND
        _set_addr(_out(ref), self._mig_handle_addr(self.gpus.index(dev), j))
        return SUCCESS

    def c_nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any, ref: Any) -> int:
        dev, code = self._check("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle)
        if code:
            return code
        if not isinstance(dev, FakeMig):
            return INVALID
        _set_addr(_out(ref), self._gpu_handle_addr(self.gpus.index(dev.parent)))
        return SUCCESS

    def c_nvmlDeviceIsMigDeviceHandle(self, handle: Any, ref: Any) -> int:
        dev, code = self._check("nvmlDeviceIsMigDeviceHandle", handle)
        if code:
            return code
        _out(ref).value = int(isinstance(dev, FakeMig))
        return SUCCESS

    def c_nvmlDeviceGetGpuInstanceId(self, handle: Any, ref: Any) -> int:
        dev, code = self._check("nvmlDeviceGetGpuInstanceId", handle)
        if code:
            return code
        if not isinstance(dev, FakeMig):
            return INVALID
        _out(ref).value = dev.gpu_instance_id
        return SUCCESS

    def c_nvmlDeviceGetComputeInstanceId(self, handle: Any, ref: Any) -> int:
        dev, code = self._check("nvmlDeviceGetComputeInstanceId", handle)
        if code:
            return code
        if not isinstance(dev, FakeMig):
            return INVALID
        _out(ref).value = dev.compute_instance_id
        return SUCCESS

    def c_nvmlDeviceGetUtilizationRates(self, handle: Any, ref: Any) -> int:
        dev, code = self._check("nvmlDeviceGetUtilizationRates", handle)
        if code:
            return code
        if dev.mig_mode:
            return NOT_SUPPORTED  # as on real GPUs in MIG mode
        util = _out(ref)
        util.gpu, util.memory = dev.util_gpu, dev.util_mem
        return SUCCESS

    def c_nvmlDeviceGetFieldValues(self, handle: Any, count: Any, ref: Any) -> int:
        dev, code = self._check("nvmlDeviceGetFieldValues", handle)
        if code:
            return code
        values = _out(ref)
        now_us = int(time.time() * 1e6)
        for k in range(_int(count)):
            fv = values[k]
            fv.timestamp = now_us
            fv.latencyUsec = 0
            err = dev.field_errors.get(fv.fieldId)
            if fv.fieldId == FI_TOTAL_ENERGY:
                err = err or dev.errors.get("nvmlDeviceGetTotalEnergyConsumption")
            if err:
                fv.nvmlReturn = err
            elif fv.fieldId == FI_POWER_INSTANT:
                fv.valueType, fv.value.uiVal, fv.nvmlReturn = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, dev.power_instant_mw, SUCCESS
            elif fv.fieldId == FI_POWER_AVERAGE:
                fv.valueType, fv.value.uiVal, fv.nvmlReturn = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, dev.power_usage_mw, SUCCESS
            elif fv.fieldId == FI_TOTAL_ENERGY:
                fv.valueType, fv.value.ullVal, fv.nvmlReturn = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, dev.energy_mj, SUCCESS
            else:
                fv.nvmlReturn = NOT_SUPPORTED
        return SUCCESS

    def c_nvmlDeviceGetPowerUsage(self, handle: Any, ref: Any) -> int:
        dev, code = self._check("nvmlDeviceGetPowerUsage", handle)
        if code:
            return code
        _out(ref).value = dev.power_usage_mw
        return SUCCESS

    def c_nvmlDeviceGetTotalEnergyConsumption(self, handle: Any, ref: Any) -> int:
        dev, code = self._check("nvmlDeviceGetTotalEnergyConsumption", handle)
        if code:
            return code
        _out(ref).value = dev.energy_mj
        return SUCCESS

    def c_nvmlDeviceGetEnforcedPowerLimit(self, handle: Any, ref: Any) -> int:
        dev, code = self._check("nvmlDeviceGetEnforcedPowerLimit", handle)
        if code:
            return code
        _out(ref).value = dev.power_limit_mw
        return SUCCESS

    def c_nvmlDeviceGetMemoryInfo(self, handle: Any, ref: Any) -> int:
        dev, code = self._check("nvmlDeviceGetMemoryInfo", handle)
        if code:
            return code
        if isinstance(dev, FakeGpu):
            dev.memory_reads += 1
            if dev.lost_after_reads is not None and dev.memory_reads > dev.lost_after_reads:
                dev.lost = True
                return GPU_IS_LOST
        mem = _out(ref)
        mem.total, mem.used = dev.memory_total, dev.memory_used
        mem.free = dev.memory_total - dev.memory_used
        return SUCCESS

    def c_nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, ref: Any) -> int:
        dev, code = self._check("nvmlDeviceGetTemperature", handle)
        if code:
            return code
        if _int(sensor) != pynvml.NVML_TEMPERATURE_GPU:
            return INVALID
        _out(ref).value = dev.temp_c
        return SUCCESS

    def c_nvmlDeviceGetTemperatureV(self, handle: Any, ref: Any) -> int:
        dev, code = self._check("nvmlDeviceGetTemperatureV", handle)
        if code:
            return code
        t = _out(ref)
        if t.version != pynvml.nvmlTemperature_v1:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        t.temperature = dev.temp_c
        return SUCCESS

    def c_nvmlDeviceGetClockInfo(self, handle: Any, kind: Any, ref: Any) -> int:
        dev, code = self._check("nvmlDeviceGetClockInfo", handle)
        if code:
            return code
        k = _int(kind)
        if k in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):  # one clock domain on these GPUs
            _out(ref).value = dev.sm_clock_mhz
        elif k == pynvml.NVML_CLOCK_MEM:
            _out(ref).value = dev.mem_clock_mhz
        elif k == pynvml.NVML_CLOCK_VIDEO:
            _out(ref).value = dev.video_clock_mhz
        else:
            return NOT_SUPPORTED
        return SUCCESS

    def _codec_utilization(self, name: str, handle: Any, util_ref: Any, period_ref: Any, value: int) -> int:
        dev, code = self._check(name, handle)
        if code:
            return code
        _out(util_ref).value = value
        _out(period_ref).value = 167_000  # us
        return SUCCESS

    def c_nvmlDeviceGetEncoderUtilization(self, handle: Any, util_ref: Any, period_ref: Any) -> int:
        return self._codec_utilization("nvmlDeviceGetEncoderUtilization", handle, util_ref, period_ref, 0)

    def c_nvmlDeviceGetDecoderUtilization(self, handle: Any, util_ref: Any, period_ref: Any) -> int:
        return self._codec_utilization("nvmlDeviceGetDecoderUtilization", handle, util_ref, period_ref, 0)

    def c_nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any, ref: Any) -> int:
        dev, code = self._check("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if code:
            return code
        _out(ref).value = dev.throttle_reasons
        return SUCCESS

    def c_nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any, ref: Any) -> int:
        dev, code = self._check("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        if code:
            return code
        _out(ref).value = dev.throttle_reasons
        return SUCCESS

    def c_nvmlDeviceGetPcieThroughput(self, handle: Any, counter: Any, ref: Any) -> int:
        dev, code = self._check("nvmlDeviceGetPcieThroughput", handle)
        if code:
            return code
        c = _int(counter)
        if c == pynvml.NVML_PCIE_UTIL_TX_BYTES:
            _out(ref).value = dev.pcie_tx_kbs
        elif c == pynvml.NVML_PCIE_UTIL_RX_BYTES:
            _out(ref).value = dev.pcie_rx_kbs
        else:
            return INVALID
        return SUCCESS

    # GPM
    def c_nvmlGpmQueryDeviceSupport(self, handle: Any, ref: Any) -> int:
        dev, code = self._check("nvmlGpmQueryDeviceSupport", handle)
        if code:
            return code
        support = _out(ref)
        if support.version != pynvml.NVML_GPM_SUPPORT_VERSION:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        support.isSupportedDevice = int(isinstance(dev, FakeGpu) and dev.gpm)
        return SUCCESS

    def c_nvmlGpmSampleAlloc(self, ref: Any) -> int:
        with self._lock:
            self._next_sample += 1
            addr = _SAMPLE_BASE + 0x10 * self._next_sample
            self._samples[addr] = None
        _set_addr(_out(ref), addr)
        return SUCCESS

    def c_nvmlGpmSampleFree(self, sample: Any) -> int:
        addr = _addr(sample)
        if addr not in self._samples:
            return INVALID
        del self._samples[addr]
        return SUCCESS

    def _fill_sample(self, sample: Any, source: Any, values: dict[int, float]) -> int:
        addr = _addr(sample)
        if addr not in self._samples:
            return INVALID
        self._samples[addr] = {"source": source, "values": dict(values), "t": time.monotonic()}
        return SUCCESS

    def c_nvmlGpmSampleGet(self, handle: Any, sample: Any) -> int:
        dev, code = self._check("nvmlGpmSampleGet", handle)
        if code:
            return code
        if not (isinstance(dev, FakeGpu) and dev.gpm):
            return NOT_SUPPORTED
        return self._fill_sample(sample, id(dev), dev.gpm_values)

    def c_nvmlGpmMigSampleGet(self, handle: Any, gpu_instance_id: Any, sample: Any) -> int:
        dev, code = self._check("nvmlGpmMigSampleGet", handle)
        if code:
            return code
        if not (isinstance(dev, FakeGpu) and dev.gpm and dev.mig_mode):
            return NOT_SUPPORTED
        gi = _int(gpu_instance_id)
        mig = next((m for m in dev.migs if m.gpu_instance_id == gi), None)
        if mig is None:
            return INVALID
        return self._fill_sample(sample, id(mig), mig.gpm_values)

    def c_nvmlGpmMetricsGet(self, ref: Any) -> int:
        mg = _out(ref)
        if mg.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        s1 = self._samples.get(_addr(mg.sample1))
        s2 = self._samples.get(_addr(mg.sample2))
        if s1 is None or s2 is None or s1["source"] != s2["source"] or _addr(mg.sample1) == _addr(mg.sample2):
            return INVALID
        gpu = next((g for g in self.gpus if id(g) == s2["source"]), None)
        errors = gpu.gpm_errors if gpu is not None else {}
        for k in range(mg.numMetrics):
            m = mg.metrics[k]
            err = errors.get(m.metricId)
            if err:
                m.nvmlReturn = err
            elif m.metricId in s2["values"]:
                m.value, m.nvmlReturn = float(s2["values"][m.metricId]), SUCCESS
            else:
                m.nvmlReturn = NOT_SUPPORTED
        return SUCCESS


def _reset_query_helper() -> None:
    try:
        from gpuprof_jupyter.core.sources.nvml import query as nvml_query
    except ImportError:  # pragma: no cover - helper not built yet
        return
    nvml_query._reset_for_tests()


# ----------------------------------------------------------------- the sampler process's fake
def install_from_spec(spec: dict) -> FakeNvml:
    """Install a fake described in JSON: what ``GPUPROF_FAKE_NVML`` gives the sampler process
    (``sampler_process/main.py``), so tests run the real process against fake GPUs.

    ``{"gpus": ["a100", {"kind": "h100", "lost_after_reads": 8}, ...], "latency": {function: s},
    "default_latency": s,
    "hang": {"function": name, "after_calls": n, "seconds": s, "release_file": path (optional: the
    call returns once it exists)}, "library_present": bool,
    "calls_file": path}`` (``calls_file``: the names of the functions called are appended
    there, one per line, so a test can see what the process did)."""
    makers = {"a100": a100, "h100": h100}
    gpus = []
    for i, entry in enumerate(spec.get("gpus", ["a100"])):
        entry = {"kind": entry} if isinstance(entry, str) else dict(entry)
        gpu = makers[entry.pop("kind")](i)
        for name, value in entry.items():  # e.g. lost_after_reads, processes ([pid, bytes] pairs)
            setattr(gpu, name, [tuple(v) for v in value] if name == "processes" else value)
        gpus.append(gpu)
    fake = FakeNvml(gpus, latency=spec.get("latency"), default_latency=spec.get("default_latency", 0.0),
                    library_present=spec.get("library_present", True), record_calls=False)
    fake.hang = dict(spec["hang"]) if spec.get("hang") else None
    calls_file = spec.get("calls_file")
    if calls_file:
        fake.record_calls = True
        original = fake.calls

        class _Log(list):
            def append(self, item) -> None:
                with open(calls_file, "a") as f:
                    f.write(item[0] + "\n")

        fake.calls = _Log(original)
    return fake.install()


def sampler_process_env(spec: dict | None = None) -> dict[str, str]:
    """The environment variable that makes the sampler process use this fake."""
    import json

    return {"GPUPROF_FAKE_NVML": json.dumps({"module": __file__, "spec": spec or {"gpus": ["a100"]}})}

