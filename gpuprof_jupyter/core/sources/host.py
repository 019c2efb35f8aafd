"""Host metrics via psutil: the kernel's process tree (DataLoader workers included).

Runs in the sampler process.

``cpu_util`` is the tree's CPU time per second as a share of the CPUs this process may use
(CPU affinity, capped by cgroup v2 ``cpu.max``), so 100 % means "all the CPUs we are
allowed are busy with our work", not "one core" as ``top`` shows it. It is read every tick.
The kernel counts CPU time in clock ticks (10 ms at USER_HZ 100), so a window of a few ms reads
0 or several hundred %. A reading whose window is short is missing (NaN) and its window carries
on into the next reading: the run's first (a few ms after ``open``) under ``CPU_MIN_WINDOW_S``,
a later one under both that and a quarter of the previous window (a last reading just after a
tick), so a steady cadence faster than 80 ms keeps every reading. A reading is capped at 100 %
(the unit's maximum: one tick of rounding can push a fully busy tree past it).

``rss_bytes``, ``disk_*_bytes_s`` and ``host_cpu_util`` change slowly or are rates that are
noisy over 0.1 s: they are read once a second (their native window, see docs/metrics.md) and
are absent (NaN) on the ticks in between, never repeated or interpolated. Reading /proc costs
~0.1-0.6 ms a process a tick; this keeps the sampler near-free at 10 Hz.
"""

from __future__ import annotations

import glob
import os
import time
from pathlib import Path
from typing import Callable

import psutil

from gpuprof_jupyter.core.sources.base import DeviceInfo, NoteBook, Reading

_CHILDREN_REFRESH_S = 1.0  # finding new workers walks /proc: once a second
SLOW_WINDOW_S = 1.0  # rss, disk rates, whole-host CPU
CPU_MIN_WINDOW_S = 0.08  # a CPU-time delta over less is 8 clock ticks or fewer: not a reading


def allowed_cpus(cgroup_root: Path = Path("/sys/fs/cgroup")) -> float:
    """CPUs this process may use: affinity count, capped by a cgroup v2 quota when set."""
    try:
        cpus = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        cpus = float(psutil.cpu_count() or 1)
    try:
        quota, period = (cgroup_root / "cpu.max").read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, float(quota) / float(period))
    except (OSError, ValueError):
        pass
    return max(cpus, 0.01)


def descendants(root: psutil.Process) -> list[psutil.Process]:
    """All descendants of ``root``. Linux's /proc/PID/task/TID/children lists a process's own
    children without scanning every process on the host (psutil's ``children()`` reads
    /proc/*/stat for all of them: milliseconds on a busy JupyterHub node); psutil otherwise."""
    if not os.path.exists(f"/proc/{root.pid}/task/{root.pid}/children"):
        return root.children(recursive=True)
    found, stack = [], [root.pid]
    while stack:
        pid = stack.pop()
        for path in glob.glob(f"/proc/{pid}/task/*/children"):
            try:
                with open(path) as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            stack.extend(kids)
            for kid in kids:
                try:
                    found.append(psutil.Process(kid))
                except psutil.Error:
                    pass
    return found


class HostSource:
    """CPU, memory and disk of the process tree rooted at ``pid`` (default: this kernel)."""

    name = "host"
    simulated = False
    interval_s = None  # cpu_util every tick; rss, disk and host CPU once a second (SLOW_WINDOW_S)

    def __init__(self, pid: int | None = None, clock: Callable[[], float] = time.monotonic,
                 exclude: set[int] | None = None) -> None:
        self._root = psutil.Process(pid or os.getpid())
        self._exclude = set(exclude or ())  # e.g. the sampler process, a child of the kernel
        self._own = self._root.pid == os.getpid()  # then os.times() reads our CPU: no /proc file
        self._clock = clock
        self._notes = NoteBook()
        self._procs: dict[int, psutil.Process] = {}
        self._cpu_prev: dict[int, float] = {}
        self._io_prev: tuple[float, float] | None = None
        self._io_tag = "psutil.process_io"
        self._last_children = -1e9
        self._last_t = 0.0
        self._cpu_window = float("inf")  # the last cpu_util reading's window; none before the first
        self._last_slow_t = 0.0
        self._slow_due = True  # the first reading has every metric, even in a short cell
        self.cpus = 1.0

    def open(self) -> list[DeviceInfo]:
        self.cpus = allowed_cpus()
        self._last_t = self._last_slow_t = self._clock()
        self._cpu_window = float("inf")
        self._slow_due = True
        self._refresh_tree(force=True)
        for pid, proc in self._procs.items():
            self._cpu_prev[pid] = self._cpu_time(proc) or 0.0
        psutil.cpu_percent(None)  # prime the whole-host counter
        self._io_prev = self._io_totals()
        return [
            DeviceInfo(
                key="host",
                kind="host",
                name=os.uname().nodename,
                extra={"allowed_cpus": self.cpus, "logical_cpus": psutil.cpu_count()},
            )
        ]

    def _refresh_tree(self, force: bool = False) -> None:
        now = self._clock()
        if not force and now - self._last_children < _CHILDREN_REFRESH_S:
            return
        self._last_children = now
        try:
            tree = [self._root] + descendants(self._root)
        except psutil.Error:
            tree = [self._root]
        for proc in tree:
            if proc.pid not in self._procs and proc.pid not in self._exclude:
                self._procs[proc.pid] = proc
                # A new worker's CPU so far counts from now on, not all at once.
                self._cpu_prev[proc.pid] = self._cpu_time(proc) or 0.0

    def _cpu_time(self, proc: psutil.Process) -> float | None:
        if self._own and proc.pid == self._root.pid:
            t = os.times()
            return t.user + t.system
        try:
            t = proc.cpu_times()
            return t.user + t.system
        except psutil.Error:
            return None

    def _io_totals(self) -> tuple[float, float] | None:
        if self._io_tag == "psutil.process_io":
            read = write = 0.0
            try:
                for proc in list(self._procs.values()):
                    try:
                        io = proc.io_counters()
                    except psutil.NoSuchProcess:
                        continue
                    read += io.read_bytes
                    write += io.write_bytes
                return read, write
            except (psutil.AccessDenied, AttributeError, NotImplementedError):
                self._io_tag = "psutil.disk_io_counters"
                self._notes.add("per-process disk I/O is not readable here: disk_* are whole-host figures")
        io = psutil.disk_io_counters()
        return (float(io.read_bytes), float(io.write_bytes)) if io else None

    def read(self) -> Reading:
        self._refresh_tree()
        now = self._clock()
        values = {"cpu_util": self._read_cpu(now)}
        if self._slow_due or now - self._last_slow_t >= SLOW_WINDOW_S:
            values.update(self._read_slow(max(now - self._last_slow_t, 1e-9)))
            self._last_slow_t, self._slow_due = now, False
        return {"host": values}

    def _read_cpu(self, now: float) -> float:
        """The tree's CPU share since the last reading, or NaN while that window is too short
        (the window then carries on: nothing is lost)."""
        dt = now - self._last_t
        if dt < min(CPU_MIN_WINDOW_S, 0.25 * self._cpu_window):
            return float("nan")
        self._last_t, self._cpu_window = now, dt
        cpu_delta = 0.0
        for pid, proc in list(self._procs.items()):
            cpu = self._cpu_time(proc)
            if cpu is None:  # process ended: forget it
                self._procs.pop(pid, None)
                self._cpu_prev.pop(pid, None)
                continue
            cpu_delta += max(cpu - self._cpu_prev.get(pid, cpu), 0.0)
            self._cpu_prev[pid] = cpu
        return min(100.0 * cpu_delta / (dt * self.cpus), 100.0)

    def _read_slow(self, window: float) -> dict[str, float]:
        """Once a second: RSS of the tree, disk rates and whole-host CPU over the window."""
        rss = 0.0
        for proc in list(self._procs.values()):
            try:
                rss += proc.memory_info().rss
            except psutil.Error:
                pass
        values = {"rss_bytes": rss}
        # Whole-host CPU counts ticks too: over a window shorter than CPU_MIN_WINDOW_S it is
        # missing, and not reading it keeps psutil's window running to the next slow reading.
        values["host_cpu_util"] = psutil.cpu_percent(None) if window >= CPU_MIN_WINDOW_S else float("nan")
        io = self._io_totals()
        if io is not None and self._io_prev is not None:
            values["disk_read_bytes_s"] = max(io[0] - self._io_prev[0], 0.0) / window
            values["disk_write_bytes_s"] = max(io[1] - self._io_prev[1], 0.0) / window
        self._io_prev = io
        return values

    def provenance(self) -> dict[str, dict[str, str]]:
        return {
            "host": {
                "cpu_util": "psutil.process_tree",
                "host_cpu_util": "psutil.cpu_percent",
                "rss_bytes": "psutil.process_tree",
                "disk_read_bytes_s": self._io_tag,
                "disk_write_bytes_s": self._io_tag,
            }
        }

    def notes(self) -> list[str]:
        return self._notes.list()

    def context(self) -> dict:
        return {"allowed_cpus": self.cpus, "logical_cpus": psutil.cpu_count()}

    def close(self) -> None:
        self._procs.clear()
        self._cpu_prev.clear()
