"""Other processes using our GPUs: a comparison is not fair when someone else shared them.

NVML lists the compute and graphics processes on each GPU with *host* PIDs. Inside a container
those PIDs may not exist in our namespace; they are then reported as "not visible here" rather
than dropped, since they may well be another user's job on a shared JupyterHub node.
"""

from __future__ import annotations

import os

import psutil
import pynvml

from . import nvml_query as q


def own_pids() -> set[int]:
    """This kernel and all its descendants (DataLoader workers)."""
    me = psutil.Process(os.getpid())
    try:
        return {me.pid} | {p.pid for p in me.children(recursive=True)}
    except psutil.Error:
        return {me.pid}


def _describe(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.NoSuchProcess:
        return "(pid not visible here: another container or user)"
    except psutil.Error:
        return "(unknown)"


def _running(kind: str, handle) -> list:
    """Processes of one kind on one GPU; older drivers lack the _v3 call pynvml tries first."""
    for suffix in ("", "_v2"):
        fn = getattr(pynvml, f"nvmlDeviceGet{kind}RunningProcesses{suffix}")
        try:
            return q.query(fn, handle) or []
        except q.NvmlFailure:
            return []
        except pynvml.NVMLLibraryMismatchError:
            continue  # unversioned call found no _v3 in this driver: try _v2
    return []


def other_gpu_processes(handles: dict[str, object], ours: set[int] | None = None) -> list[dict]:
    """[{device, pid, name, used_memory_bytes}] for processes on ``handles`` that are not ours.

    A GPU whose driver cannot list processes (NotSupported, NoPermission) contributes nothing.
    """
    ours = own_pids() if ours is None else ours
    found: dict[tuple[str, int], dict] = {}
    for key, handle in handles.items():
        for kind in ("Compute", "Graphics"):
            for proc in _running(kind, handle):
                pid = int(proc.pid)
                if pid in ours or (key, pid) in found:
                    continue
                used = getattr(proc, "usedGpuMemory", None)
                found[(key, pid)] = {
                    "device": key,
                    "pid": pid,
                    "name": _describe(pid),
                    "used_memory_bytes": float(used) if isinstance(used, int) else None,
                }
    return list(found.values())
