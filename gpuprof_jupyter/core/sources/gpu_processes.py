"""This kernel's share of each GPU against everyone else's, as one aggregate.

Runs in the sampler process.

``ProcessShareSource`` (a polled source, native interval 1 s) reads, per visible GPU, NVML's
running-process lists (compute and graphics: used memory per process) and
``nvmlDeviceGetProcessUtilization`` (SM share per process since the previous read), decides
which listed processes are the kernel's (:mod:`.process_attribution`: host PIDs, containers,
memory evidence) and records ``own_sm_util``/``other_sm_util`` (%) and
``own_gpu_mem_bytes``/``other_gpu_mem_bytes`` (B).

Other users' PIDs, names and command lines are never shown or stored: only counts, sums and
shares leave this module. Not available on MIG slices (NVML gives no per-process utilization
there), said in a note.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable

import psutil
import pynvml

from gpuprof_jupyter.core.metrics import PROCESS_SHARE_METRICS
from gpuprof_jupyter.core.sources.nvml import query as q
from gpuprof_jupyter.core.sources.base import DeviceInfo, NoteBook, Reading, SourceUnavailable
from gpuprof_jupyter.core.sources.host import descendants
from gpuprof_jupyter.core.sources.process_attribution import MEMORY, attribute, in_host_pid_namespace, split_shares
from gpuprof_jupyter.core.sources.nvml.visible_devices import enumerate_nvml_devices, select_visible

SM_TAG = "nvml.process_utilization"
MEM_TAG = "nvml.running_processes"


def process_tree(pid: int | None = None) -> set[int]:
    """``pid`` (default: this process) and all its descendants (DataLoader workers); {} when
    ``pid`` is gone."""
    try:
        root = psutil.Process(os.getpid() if pid is None else pid)
    except psutil.Error:
        return set()
    try:
        return {root.pid} | {p.pid for p in descendants(root)}
    except psutil.Error:
        return {root.pid}


def _running(kind: str, handle) -> list:
    """Processes of one kind on one GPU; older drivers lack the _v3 call pynvml tries first.

    Raises:
        q.NvmlFailure: NVML cannot list them (NotSupported, NoPermission, ...).
    """
    for suffix in ("", "_v2"):
        fn = getattr(pynvml, f"nvmlDeviceGet{kind}RunningProcesses{suffix}")
        try:
            return q.query(fn, handle) or []
        except pynvml.NVMLLibraryMismatchError:
            continue  # unversioned call found no _v3 in this driver: try _v2
    raise q.NvmlFailure(q.FUNCTION_NOT_FOUND, f"nvmlDeviceGet{kind}RunningProcesses",
                        RuntimeError("neither _v3 nor _v2 is in this driver's NVML library"))


def running_processes(handle) -> dict[int, float | None]:
    """host PID -> used GPU memory in bytes (None: NVML does not say) of every compute and
    graphics process on the GPU. A process in both lists is one context: counted once.

    Raises:
        q.NvmlFailure: NVML cannot list the processes of this GPU.
    """
    found: dict[int, float | None] = {}
    for kind in ("Compute", "Graphics"):
        for proc in _running(kind, handle):
            used = getattr(proc, "usedGpuMemory", None)
            used = float(used) if isinstance(used, int) else None
            pid = int(proc.pid)
            if found.get(pid) is None or (used is not None and used > found[pid]):
                found[pid] = used
    return found


def sm_by_process(handle, since_us: int) -> tuple[dict[int, float], int]:
    """(host PID -> mean smUtil % of its samples newer than ``since_us``, newest timestamp).

    NVML answers NOT_FOUND when no process ran a kernel since ``since_us``: every share is
    then a real 0 ({}).

    Raises:
        q.NvmlFailure: any other NVML error (NotSupported on pre-Maxwell GPUs and MIG slices).
    """
    try:
        samples = q.query(pynvml.nvmlDeviceGetProcessUtilization, handle, since_us)
    except q.NvmlFailure as failure:
        if getattr(failure.error, "value", None) == pynvml.NVML_ERROR_NOT_FOUND:
            return {}, since_us
        raise
    sums: dict[int, list[float]] = {}
    newest = since_us
    for s in samples:
        if s.timeStamp <= since_us:
            continue
        sums.setdefault(int(s.pid), []).append(float(s.smUtil))
        newest = max(newest, int(s.timeStamp))
    return {pid: sum(v) / len(v) for pid, v in sums.items()}, newest


@dataclass
class _Dev:
    key: str
    handle: object
    since_us: int = 0
    sm_ok: bool = True
    lists_ok: bool = True
    candidate: int | None = None
    methods: dict[str, int] = field(default_factory=dict)
    others_max: int = 0
    other_mem_peak: float | None = None
    own_mem_peak: float | None = None
    sm_sums: dict[str, float] = field(default_factory=dict)
    sm_reads: int = 0


class ProcessShareSource:
    """Own vs other SM share and memory per GPU (see the module docstring).

    Args:
        own_pids: returns the kernel's process tree (PIDs of its own namespace); the sampler
            process passes the kernel's tree without itself. Default: this process's tree.
        devices: indices among the visible GPUs, as for ``NvmlSource`` (same device keys).
        own_reserved: returns device key -> the kernel's torch reserved bytes on that GPU (the
            smallest value it reported over the last seconds, a lower bound of its process's
            used memory: :class:`.process_attribution.ReservedEvidence`). Used only in another
            PID namespace, to find the kernel's process by memory; None: no such evidence.
        host_namespace: returns :func:`in_host_pid_namespace` (tests fix it).
        clock, wall: monotonic and wall clocks (seconds).
    """

    name = "processes"
    simulated = False
    interval_s = 1.0

    def __init__(self, own_pids: Callable[[], set[int]] = process_tree, devices: list[int] | None = None,
                 own_reserved: Callable[[], dict[str, float]] | None = None,
                 host_namespace: Callable[[], bool | None] = in_host_pid_namespace,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self._own_pids = own_pids
        self._want = None if devices is None else list(devices)
        self._own_reserved = own_reserved
        self._host_namespace = host_namespace
        self._clock, self._wall = clock, wall
        self._notes = NoteBook()
        self._devs: list[_Dev] = []
        self._mig_keys: list[str] = []
        self._host_ns: bool | None = None
        self._last_read: float | None = None
        self._acquired = False

    def open(self) -> list[DeviceInfo]:
        """Open handles of the visible GPUs. Adds metrics to the GPU source's devices: returns [].

        Raises:
            SourceUnavailable: NVML cannot run or lists no GPU.
        """
        self.close()
        self._notes = NoteBook()
        try:
            q.acquire()
            self._acquired = True
            gpus = enumerate_nvml_devices()
        except q.NvmlFailure as failure:
            self.close()
            raise SourceUnavailable(f"NVML cannot list GPUs ({failure})") from None
        visible = select_visible(os.environ.get("CUDA_VISIBLE_DEVICES"), gpus,
                                 os.environ.get("CUDA_DEVICE_ORDER")).devices
        if self._want is not None:
            visible = [visible[i] for i in dict.fromkeys(self._want) if 0 <= i < len(visible)]
        if not visible:
            self.close()
            raise SourceUnavailable("no visible GPU")
        self._host_ns = self._host_namespace()
        since = int(self._wall() * 1e6)
        self._devs, self._mig_keys = [], []
        for vis in visible:
            key = f"gpu{vis.visible_index}"
            if vis.mig is not None:
                self._mig_keys.append(key)
                self._notes.add(f"{key}: own/other SM share and memory (own_sm_util, own_gpu_mem_bytes ...) are "
                                f"not available on MIG slices: NVML gives no per-process utilization there")
            else:
                self._devs.append(_Dev(key, vis.handle, since_us=since))
        return []

    def read(self) -> Reading:
        """Own/other shares of every GPU; {} when called sooner than half its 1 s interval."""
        now = self._clock()
        if not self._acquired:
            return {}
        if self._last_read is not None and now - self._last_read < 0.5 * self.interval_s:
            return {}
        self._last_read = now
        tree = set(self._own_pids())
        reserved = self._own_reserved() if self._own_reserved is not None else {}
        reading: Reading = {}
        for dev in self._devs:
            values = self._read_device(dev, tree, reserved.get(dev.key))
            if values:
                reading[dev.key] = values
        return reading

    def _read_device(self, dev: _Dev, tree: set[int], reserved: float | None) -> dict[str, float]:
        listed = self._listed(dev)
        sm = self._sm(dev)
        if listed is None and sm is None:
            return {}
        known = dict(listed or {})
        for pid in sm or ():
            known.setdefault(pid, None)
        a = attribute(known, tree, self._host_ns, reserved, dev.candidate)
        dev.candidate = a.candidate
        dev.methods[a.method] = dev.methods.get(a.method, 0) + 1
        dev.others_max = max(dev.others_max, a.others_at_least)
        if a.ours is None:
            self._note_unmatched(dev, reserved)
            return {}
        if a.method == MEMORY:
            self._notes.add(
                f"{dev.key}: this kernel runs in another PID namespace than NVML's; its process was "
                f"identified as the only one on the GPU holding at least its torch reserved memory, so "
                f"'own' is the kernel process alone (CUDA processes it started count as 'other')")
        values = split_shares(a.ours, sm, listed)
        self._keep_figures(dev, values)
        return values

    def _note_unmatched(self, dev: _Dev, reserved: float | None) -> None:
        where = ("this kernel runs in another PID namespace (a container), so its processes cannot be found "
                 "among them by PID" if self._host_ns is False else
                 "none of them is this kernel's, which may mean it runs in another PID namespace (a container)")
        tried = ("; no single process matched its torch reserved memory" if self._host_ns is False and reserved
                 else "")
        self._notes.add(f"{dev.key}: NVML reports host PIDs; {where}{tried}: own and other SM share and memory "
                        f"are not measured (not zero) while that lasts (docs/metrics.md, per-process attribution)")

    def _keep_figures(self, dev: _Dev, values: dict[str, float]) -> None:
        for metric, peak in (("other_gpu_mem_bytes", "other_mem_peak"), ("own_gpu_mem_bytes", "own_mem_peak")):
            if metric in values:
                setattr(dev, peak, max(getattr(dev, peak) or 0.0, values[metric]))
        if "own_sm_util" in values:
            dev.sm_reads += 1
            for metric in ("own_sm_util", "other_sm_util"):
                dev.sm_sums[metric] = dev.sm_sums.get(metric, 0.0) + values[metric]

    def _listed(self, dev: _Dev) -> dict[int, float | None] | None:
        return self._query(dev, "lists_ok", lambda: running_processes(dev.handle),
                           "own_gpu_mem_bytes, other_gpu_mem_bytes not available: NVML cannot list the "
                           "processes on this GPU")

    def _sm(self, dev: _Dev) -> dict[int, float] | None:
        def read():
            sm, dev.since_us = sm_by_process(dev.handle, dev.since_us)
            return sm

        return self._query(dev, "sm_ok", read, "own_sm_util, other_sm_util not available: "
                           "nvmlDeviceGetProcessUtilization is not usable on this GPU or driver")

    def _query(self, dev: _Dev, usable: str, read, why: str):
        """``read()`` while the device's ``usable`` flag holds; a permanent NVML failure clears
        it with one note (``why``), a transient one skips this read."""
        if not getattr(dev, usable):
            return None
        try:
            return read()
        except q.NvmlFailure as failure:
            if failure.kind in q.PERMANENT:
                setattr(dev, usable, False)
                self._notes.add(f"{dev.key}: {why} ({failure.kind})")
            return None

    def provenance(self) -> dict[str, dict[str, str]]:
        tags = {m: SM_TAG if m.endswith("sm_util") else MEM_TAG for m in PROCESS_SHARE_METRICS}
        return {dev.key: dict(tags) for dev in self._devs}

    def notes(self) -> list[str]:
        return self._notes.list()

    def context(self) -> dict:
        return {}

    def final_context(self) -> dict:
        """``gpu_sharing``: per GPU, how the kernel's processes were found and what the others
        held, as aggregates (no PID, no name). See docs/metrics.md."""
        devices: dict[str, dict] = {}
        for dev in self._devs:
            n = dev.sm_reads
            devices[dev.key] = {
                "attribution": sorted(dev.methods),  # PID, MEMORY, UNMATCHED as they happened
                "reads": sum(dev.methods.values()),
                "other_processes_max": dev.others_max,
                "other_gpu_mem_peak_bytes": dev.other_mem_peak,
                "own_gpu_mem_peak_bytes": dev.own_mem_peak,
                "other_sm_util_mean": dev.sm_sums["other_sm_util"] / n if n else None,
                "own_sm_util_mean": dev.sm_sums["own_sm_util"] / n if n else None,
            }
        for key in self._mig_keys:
            devices[key] = {"attribution": ["not_available"], "reads": 0, "other_processes_max": 0}
        namespace = {True: "host", False: "separate", None: "unknown"}[self._host_ns]
        return {"gpu_sharing": {"pid_namespace": namespace, "devices": devices}}

    def close(self) -> None:
        """Release NVML; the run's figures stay for :meth:`final_context`."""
        if self._acquired:
            self._acquired = False
            q.release()


__all__ = ["ProcessShareSource", "process_tree", "running_processes", "sm_by_process"]
