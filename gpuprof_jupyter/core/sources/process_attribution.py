"""Which of the processes NVML lists on a GPU are this kernel's: pure rules, no NVML here.

Runs in the sampler process.

NVML's running-process lists and process-utilization samples carry *host* PIDs. The kernel's
process tree is known by the PIDs of its own PID namespace. The rules, in order:

1. **Host PID namespace** (``/proc/self/ns/pid`` is the initial namespace, inode
   0xEFFFFFFC): PIDs mean the same thing on both sides, so the kernel's processes are the
   listed PIDs that are in its tree. None listed means the kernel holds no context on that GPU:
   its share is a real 0.
2. **Another PID namespace** (a container, e.g. a Kubernetes-based JupyterHub): a PID
   match could be a coincidence, so PIDs are not compared. The kernel's own process is
   identified by memory evidence only when it is unambiguous: the kernel reports its torch
   *reserved* memory on that GPU (``own_reserved``, at least :data:`MIN_EVIDENCE_BYTES`);
   that memory lives in the kernel's own CUDA context, so NVML's used memory for the kernel
   process is at least that much; NVML lists every process holding memory on the GPU; so if
   exactly one listed process holds at least that much, it is the kernel's, provided the same
   host PID was the only candidate at the previous read too (the reserved figure and the list
   are not read at the same instant). Then only that process counts as "own": CUDA processes
   the kernel started itself count as "other". Anything else (no figure, two candidates,
   none, a different one each time) is refused: own and other are *not measured*, never 0.
3. **Namespace unknown** (no ``/proc/self/ns/pid``): PIDs are compared; when processes are
   listed and none is the kernel's, that may be a namespace mismatch, so nothing is claimed.

Whatever the rule, a lower bound of the *other* processes is always sound: every process of
the kernel's that NVML can list is in its tree, so at least ``listed - len(tree)`` listed
processes are someone else's. The comparison's fairness warning uses only that bound or a
match, so a kernel alone in its container never warns about itself.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass

INIT_PID_NAMESPACE_INODE = 0xEFFFFFFC  # PROC_PID_INIT_INO in the Linux kernel
MIN_EVIDENCE_BYTES = 256 * 1024**2  # smaller reservations match too many processes to mean anything

PID = "pid"  # matched by PID in the host namespace
MEMORY = "memory"  # the kernel process identified by its reserved memory
UNMATCHED = "unmatched"  # refused to guess: own/other not measured


def in_host_pid_namespace(path: str = "/proc/self/ns/pid") -> bool | None:
    """True in the initial PID namespace, False in another (a container), None when unknown."""
    try:
        return os.stat(path).st_ino == INIT_PID_NAMESPACE_INODE
    except OSError:
        return None


@dataclass(frozen=True)
class Attribution:
    """The kernel's host PIDs on one GPU (``ours``; None: not known) and how they were found."""

    ours: frozenset[int] | None
    method: str  # PID, MEMORY or UNMATCHED
    others_at_least: int  # listed processes certainly not the kernel's
    candidate: int | None = None  # the single memory candidate of this read (pass it back next time)


def memory_candidates(listed: dict[int, float | None], reserved: float | None) -> list[int]:
    """Listed PIDs holding at least ``reserved`` bytes ([] when the evidence is too weak)."""
    if reserved is None or not reserved >= MIN_EVIDENCE_BYTES:
        return []
    return sorted(pid for pid, used in listed.items() if used is not None and used >= reserved)


def attribute(listed: dict[int, float | None], tree: set[int], host_namespace: bool | None,
              reserved: float | None = None, previous_candidate: int | None = None) -> Attribution:
    """Decide which listed host PIDs are the kernel's (see the module docstring).

    Args:
        listed: host PID -> used GPU memory in bytes (None: NVML does not say) for every process
            NVML lists on the GPU.
        tree: the kernel's process tree, PIDs of its own namespace.
        host_namespace: :func:`in_host_pid_namespace`.
        reserved: the kernel's torch reserved bytes on this GPU (a lower bound of its process's
            used memory), or None.
        previous_candidate: the single memory candidate of the previous read, if any.
    """
    at_least = max(0, len(listed) - len(tree))
    if host_namespace or host_namespace is None:
        ours = frozenset(p for p in listed if p in tree)
        if ours or host_namespace or not listed:
            return Attribution(ours, PID, len(listed) - len(ours))
        return Attribution(None, UNMATCHED, at_least)
    if not listed:  # nobody holds a context on this GPU: a real 0 for everyone
        return Attribution(frozenset(), PID, 0)
    candidates = memory_candidates(listed, reserved)
    single = candidates[0] if len(candidates) == 1 else None
    if single is not None and single == previous_candidate:
        return Attribution(frozenset(candidates), MEMORY, at_least, single)
    return Attribution(None, UNMATCHED, at_least, single)


def split_shares(ours: frozenset[int], sm_by_pid: dict[int, float] | None,
                 listed: dict[int, float | None] | None) -> dict[str, float]:
    """own/other SM share (%, capped at 100) and memory (bytes) given the kernel's host PIDs.

    ``sm_by_pid`` None: SM shares not measured; ``listed`` None: memory not measured. A process
    whose used memory NVML does not give (None) adds nothing to the sums.
    """
    out: dict[str, float] = {}
    if sm_by_pid is not None:
        own = sum(v for p, v in sm_by_pid.items() if p in ours)
        other = sum(v for p, v in sm_by_pid.items() if p not in ours)
        out["own_sm_util"], out["other_sm_util"] = min(float(own), 100.0), min(float(other), 100.0)
    if listed is not None:
        out["own_gpu_mem_bytes"] = float(sum(u for p, u in listed.items() if p in ours and u is not None))
        out["other_gpu_mem_bytes"] = float(sum(u for p, u in listed.items() if p not in ours and u is not None))
    return out


class ReservedEvidence:
    """The smallest torch reserved memory the kernel reported per GPU over the last
    ``window_s`` seconds: the ``own_reserved`` evidence of :class:`ProcessShareSource`.

    The kernel's reports reach the sampler process late (at the UI rate); its process's used
    memory is at least what it reserved at any instant since, unless it released memory, which
    a later, smaller report shows within a fraction of a second. Taking the window's minimum
    keeps the figure a lower bound of the kernel process's used memory now.
    """

    def __init__(self, window_s: float = 3.0) -> None:
        self.window_s = window_s
        self._seen: dict[str, deque] = {}  # device key -> (mono, bytes), oldest first

    def observe(self, mono: float, reading: dict[str, dict[str, float]]) -> None:
        """Feed one reading of the torch memory source (device key -> metric -> value)."""
        for key, values in reading.items():
            reserved = values.get("torch_mem_reserved_bytes")
            if reserved is not None and reserved == reserved:
                self._seen.setdefault(key, deque()).append((mono, float(reserved)))

    def __call__(self, now: float | None = None) -> dict[str, float]:
        """device key -> smallest reserved bytes reported in the window ending at ``now``
        (default: the newest report)."""
        out = {}
        for key, seen in self._seen.items():
            end = seen[-1][0] if now is None and seen else now
            while seen and seen[0][0] < end - self.window_s:
                seen.popleft()
            if seen:
                out[key] = min(v for _, v in seen)
        return out
