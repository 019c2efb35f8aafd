"""The session record: a low-rate record of the kernel's whole session, cell by cell (docs/session.md).

Runs in the sampler process.

On from ``%load_ext`` (``SessionControl``), one thread (``gpuprof-session``) reads the GPUs
once a second by default (NVML's utilization, memory, power and energy only: no GPM, no PCIe
lane, no host metrics) and this kernel's share of their memory (NVML's process lists), and
hands each reading to a ``SessionAccount``; the kernel's
cell marks (``CellMark``) go to the same account. The thread waits for the process's warm-up
imports before it opens NVML, so it never competes with the first profiled cell's begin.
The record is written to ``<Jupyter runtime folder>/gpuprof-sessions/<kernel id>.json``
(bounded: the account decimates its series) at most once a minute, when it is turned off and
when the kernel quits; the Jupyter server reads it there (the runtime folder is the user's own,
as the kernels' connection files are). Records older than a week are removed when one starts.
A cell that ran longer than ``keep_after_s`` without the magic is saved as an experiment from
the record's own readings (``long_cells.save_long_cell``).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from pathlib import Path

from gpuprof_jupyter.core.protocol import CellMark, SessionControl, SessionNotice, Tick
from gpuprof_jupyter.core.format import fmt_unit

DEFAULT_INTERVAL_S = 1.0
DEFAULT_KEEP_AFTER_S = 60.0
PERSIST_EVERY_S = 60.0  # the record on disk is at most this old (and written when the kernel quits)
LEAN_READERS = ("util", "memory", "fields")  # utilization, memory, power and energy: no GPM, no PCIe lane
STATE_EVERY_S = 30.0  # the small state file (the server's, the status bar's) is at most this old, and
STATE_AFTER_MARK_S = 2.0  # written this soon after a cell starts or ends
DEFAULT_NOTICE_AFTER_S = 600.0  # idle while holding GPU memory this long: the kernel is told, once
KEEP_FILES_S = 7 * 24 * 3600.0  # records of kernels gone for longer are removed when a record starts
RECENT_S = 6 * 3600.0  # full-rate readings kept for a long cell's experiment (the last 6 hours)
SHARE_EVERY_S = 5.0  # this kernel's share of the GPUs' memory (NVML's process lists, two calls a GPU: a
# third of the record's NVML calls) is read this often; between reads its last values stand


class SessionRecord:
    def __init__(self, kernel_pid: int, warmed_up: threading.Event, note, send=None) -> None:
        self.kernel_pid = kernel_pid
        self.send = send  # to the kernel (the idle notice)
        self.warmed_up = warmed_up  # the process's warm-up imports are done
        self.note = note
        self.on = False
        self.interval = DEFAULT_INTERVAL_S
        self.keep_after_s = DEFAULT_KEEP_AFTER_S
        self.store: str | None = None  # where long cells are kept as experiments
        self.record_dir: str | None = None  # where the record is written
        self.kernel: dict = {}
        self.account = None  # core.analysis.session_account.SessionAccount, from the first start
        self.memory_metric = "gpu_mem_used_bytes"
        self.notes: list[str] = []
        self.kept: list[dict] = []  # experiments saved from the record: {"cell", "experiment"}
        self.recent: deque[Tick] = deque()
        self._sources: list = []
        self._share_source = None  # the ProcessShareSource among them, read every SHARE_EVERY_S
        self._share_read: tuple[float, dict] | None = None  # (when, what) it last read
        self.device_provenance: dict = {}  # device -> metric -> tag, of the sources read
        self.device_infos: list[dict] = []  # the GPUs read (DeviceInfo.to_dict)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_persist = 0.0
        self._to_keep: list = []  # long cells whose end a reading has not passed yet
        self.notice_after_s = DEFAULT_NOTICE_AFTER_S
        self._noticed = False  # the kernel was told (once a session)
        self._state_due = 0.0  # monotonic time the state file is to be written at
        self._early_marks: list[CellMark] = []  # marks that came before the account was made
        self._began: tuple[float, float] | None = None  # (mono, wall) the record was first turned on
        self.culled: dict | None = None  # the server's GPU-aware culling shut the kernel down (server/culling.py)

    # -- the kernel's messages ------------------------------------------------------------------
    def control(self, control: SessionControl) -> None:
        with self._lock:
            if control.interval is not None and control.interval > 0:
                self.interval = float(control.interval)
            if control.keep_after_s is not None:
                self.keep_after_s = float(control.keep_after_s)
            if control.store is not None:
                self.store = control.store
            if control.record_dir is not None:
                self.record_dir = control.record_dir
            if control.notice_after_s is not None:
                self.notice_after_s = float(control.notice_after_s)
            if control.kernel is not None:
                self.kernel = dict(control.kernel)
        if control.on is True and not self.on:
            self._start()
        elif control.on is False and self.on:
            self.stop()

    def mark(self, mark: CellMark) -> None:
        with self._lock:
            account = self.account
            if account is None:
                if self.on:  # the record's thread has not made its account yet: kept for it
                    self._early_marks.append(mark)
                return
            self._apply(account, mark)

    def _apply(self, account, mark: CellMark) -> None:
        """One mark on the account (the lock held)."""
        if mark.event == "start":
            account.cell_started(mark.mono, mark.wall, mark.cell, mark.source)
        elif mark.event == "end":
            cell = account.current
            account.cell_ended(mark.mono, mark.wall, mark.status, mark.experiment)
            if (cell.kind == "cell" and mark.experiment is None and self.keep_after_s > 0
                    and (cell.duration_s or 0.0) > self.keep_after_s):
                self._to_keep.append(cell)
        self._state_due = min(self._state_due, time.monotonic() + STATE_AFTER_MARK_S)

    def query(self) -> dict:
        """The record now, with its settings (``session()``, ``%gpuprofile session``)."""
        with self._lock:
            account = self.account
            body = account.to_dict(time.monotonic()) if account is not None else {"rows": [], "timeline": {}}
            body.update(self.settings())
            return body

    def settings(self) -> dict:
        from gpuprof_jupyter.core.analysis.session_account import RECORD_COST

        return {"on": self.on, "interval_s": self.interval, "keep_after_s": self.keep_after_s,
                "store": self.store, "kernel": dict(self.kernel), "memory_metric": self.memory_metric,
                "notes": list(self.notes), "kept": list(self.kept), "cost": RECORD_COST,
                "culled": self.culled}

    # -- the thread -----------------------------------------------------------------------------
    def _start(self) -> None:
        self.on = True
        self._stop = threading.Event()
        if self._began is None:
            self._began = (time.monotonic(), time.time())
        self._last_persist = time.monotonic()  # the first write a minute from now
        self._thread = threading.Thread(target=self._run, args=(self._stop,), name="gpuprof-session", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop reading (the record so far is kept, and written)."""
        self.on = False
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)
        self._thread = None
        self._close_sources()
        self.persist()
        self.persist_state()

    def _run(self, stop: threading.Event) -> None:
        deadline = time.monotonic() + 30.0  # the first profiled cell's begin first
        while not self.warmed_up.wait(0.2) and time.monotonic() < deadline:
            if stop.is_set():
                return
        _attempt("starting the session record", self._make_account, self.notes)
        _attempt("opening the session record's sources", self._open_sources, self.notes)
        _attempt("removing session records older than a week", self._remove_old_files, self.notes)
        if not self._sources:
            with self._lock:
                if self.account is not None:
                    self.account.no_readings = True
                    self.account.finish_passed()
        next_tick = time.monotonic()
        while not stop.is_set():
            if self._sources:
                self._read_once()
            if time.monotonic() - self._last_persist >= PERSIST_EVERY_S:
                self.persist()
            if time.monotonic() >= self._state_due:
                self._state_due = time.monotonic() + STATE_EVERY_S
                self.persist_state()
            self._maybe_notice()
            next_tick += self.interval
            now = time.monotonic()
            if next_tick < now:  # fell behind: skip the missed slots, keep the phase
                next_tick += (int((now - next_tick) // self.interval) + 1) * self.interval
            stop.wait(next_tick - now)

    def _make_account(self) -> None:
        """The account, made here rather than when the kernel turns the record on: it imports
        numpy, which the process's request loop must not wait for."""
        from gpuprof_jupyter.core.analysis.session_account import SessionAccount

        with self._lock:
            if self.account is None:
                self.account = SessionAccount(self.interval, *self._began)
                for mark in self._early_marks:
                    self._apply(self.account, mark)
                self._early_marks.clear()

    def _open_sources(self) -> None:
        from gpuprof_jupyter.core.sources.base import SourceUnavailable
        from gpuprof_jupyter.core.sources.nvml import NvmlSource

        nvml = NvmlSource(only=LEAN_READERS)
        try:
            self.device_infos = [d.to_dict() for d in nvml.open()]
        except SourceUnavailable as exc:
            self.notes.append(f"the session record has no GPU readings: {exc}")
            return
        nvml.set_session_interval(self.interval)
        self._sources = [nvml]
        memory_tag = "nvml.memory_info: memory used on the devices by every process (this kernel's share unknown)"
        try:
            from gpuprof_jupyter.core.sources.gpu_processes import ProcessShareSource, process_tree

            me, kernel = os.getpid(), self.kernel_pid
            share = ProcessShareSource(own_pids=lambda: process_tree(kernel) - {me})
            share.open()
            self._sources.append(share)
            self._share_source = share
            self.memory_metric = "own_gpu_mem_bytes"
            memory_tag = ("nvml.running_processes: memory of this kernel's process tree on the devices, "
                          f"read every {fmt_unit(SHARE_EVERY_S, 's')}")
        except (SourceUnavailable, ImportError) as exc:
            self.notes.append(f"the session record counts the devices' whole memory as held: {exc}")
        from gpuprof_jupyter.core.sources.base import merged_provenance

        self.device_provenance = merged_provenance(self._sources)
        energy = sorted({tags.get("energy_j") for tags in nvml.provenance().values() if tags.get("energy_j")})
        with self._lock:
            if self.account is not None:
                self.account.provenance = {
                    "cadence_s": self.interval,
                    "gpu_busy_s": "nvml.utilization.gpu: share of time a kernel ran, times the time, summed "
                                  f"over the devices, read every {fmt_unit(self.interval, 's')} (the session record)",
                    "energy_j": f"{', '.join(energy) or 'unknown'}: energy counter deltas, summed over the devices",
                    "memory_held_bytes": memory_tag,
                }

    def _read_once(self) -> None:
        reading: dict = {}
        for source in self._sources:
            try:
                for device, values in self._read_source(source).items():
                    reading.setdefault(device, {}).update(values)
            except Exception:  # noqa: BLE001 - a source never ends the record; its gap shows
                continue
        tick = Tick(time.monotonic(), time.time(), reading)
        with self._lock:
            if self.account is None:
                return
            self.account.tick(tick.mono, tick.wall, reading, self.memory_metric)
            self.recent.append(tick)
            while self.recent and tick.mono - self.recent[0].mono > RECENT_S:
                self.recent.popleft()
            ready = [c for c in self._to_keep if c.end_mono is not None and tick.mono >= c.end_mono]
            self._to_keep = [c for c in self._to_keep if c not in ready]
            ticks = [t for t in self.recent if ready and min(c.start_mono for c in ready) - self.interval <= t.mono]
        for cell in ready:
            self._keep(cell, ticks)

    def _read_source(self, source) -> dict:
        """``source.read()``; the memory share (``ProcessShareSource``) only every
        ``SHARE_EVERY_S``, its last reading standing in between (what a kernel holds moves
        slowly; the idle notice waits minutes)."""
        if source is not self._share_source:
            return source.read()
        now = time.monotonic()
        if self._share_read is not None and now - self._share_read[0] < SHARE_EVERY_S:
            return self._share_read[1]
        values = source.read()
        self._share_read = (now, values)
        return values

    def _keep(self, cell, ticks: list) -> None:
        """Save a long cell without the magic as an experiment, from the record's readings."""
        from gpuprof_jupyter.sampler_process.long_cells import save_long_cell

        window = [t for t in ticks if cell.start_mono - self.interval <= t.mono <= cell.end_mono + self.interval]
        store = self.store
        if store is None or not window:
            return
        meta = _attempt("saving a long cell from the session record",
                        lambda: save_long_cell(store, cell, window, self.interval, self.account.provenance,
                                               self.device_provenance, self.device_infos), self.notes)
        if meta is not None:
            cell.experiment = meta["id"]
            with self._lock:
                self.kept.append({"cell": cell.cell, "experiment": meta["id"], "name": meta["name"]})

    def _close_sources(self) -> None:
        sources, self._sources, self._share_source, self._share_read = self._sources, [], None, None
        for source in sources:
            try:
                source.close()
            except Exception:  # noqa: BLE001
                pass

    # -- on disk --------------------------------------------------------------------------------
    def path(self) -> Path | None:
        if self.record_dir is None:
            return None
        name = str(self.kernel.get("id") or f"pid{self.kernel_pid}")
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:120]
        return Path(self.record_dir) / f"{safe}.json"

    def state(self) -> dict:
        """What the Jupyter server shows of this kernel (its API, the status bar, its metrics):
        small, written often. ``idle_since``: when the GPUs went idle while memory was held."""
        with self._lock:
            account = self.account
            held = account.idle_held(time.monotonic()) if account is not None else {}
            running = account is not None and account.current.kind == "cell"
            return {"version": 1, "kernel": dict(self.kernel), "kernel_pid": self.kernel_pid, "on": self.on,
                    "interval_s": self.interval, "cell_running": running,
                    "cell": account.current.cell if running else None,
                    "idle_since": held.get("since_wall"), "idle_s": held.get("idle_s", 0.0),
                    "memory_held_bytes": held.get("memory_held_bytes"),
                    "memory_provenance": (account.provenance.get("memory_held_bytes") if account else None),
                    "written": time.time()}

    def persist_state(self) -> None:
        path = self.path()
        if path is None or self.account is None:
            return
        failed: list[str] = []

        def write() -> None:
            from gpuprof_jupyter.core.store.atomic import write_json_atomic

            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_json_atomic(path.with_suffix(".state.json"), self.state())

        _attempt("writing the session state", write, failed)
        self.notes.extend(n for n in failed if n not in self.notes)

    def _maybe_notice(self) -> None:
        """Tell the kernel, once a session, that the GPUs sat idle while it held their memory."""
        if self._noticed or self.send is None or self.notice_after_s <= 0 or self.account is None:
            return
        with self._lock:
            held = self.account.idle_held(time.monotonic())
        if held["idle_s"] >= self.notice_after_s and (held["memory_held_bytes"] or 0) > 0:
            self._noticed = True
            self.send(SessionNotice(held["idle_s"], float(held["memory_held_bytes"]), held["since_wall"]))

    def _culled(self) -> dict | None:
        """The server's culling decision (server/culling.py) about this kernel, noted in the record."""
        import json

        path = self.path()
        try:
            with open(path.with_suffix(".cull.json"), encoding="utf-8") as f:
                marker = json.load(f)
        except (AttributeError, OSError, ValueError):
            return None
        if not isinstance(marker, dict) or not isinstance(marker.get("culled_at"), (int, float)):
            return None
        from gpuprof_jupyter.core.figure import measured
        from gpuprof_jupyter.core.format import fmt_figure, fmt_idle
        from gpuprof_jupyter.core.protocol import utc_now

        self.culled = marker
        self.notes.append(f"gpuprof: the Jupyter server shut this kernel down ({utc_now()}): its GPUs had sat idle "
                          f"{fmt_idle(marker.get('idle_s'))} while it held "
                          f"{fmt_figure(measured(marker.get('memory_held_bytes'), 'B', 'the session record'))} "
                          f"(c.GPUProfiler.cull_idle_gpu_s = {marker.get('limit_s')})")
        return marker

    def _remove_old_files(self) -> None:
        folder = self.record_dir
        if folder is None or not os.path.isdir(folder):
            return
        cutoff = time.time() - KEEP_FILES_S
        for entry in os.scandir(folder):
            if entry.name.endswith(".json") and entry.is_file(follow_symlinks=False) and \
                    entry.stat(follow_symlinks=False).st_mtime < cutoff:
                os.unlink(entry.path)

    def persist(self) -> None:
        """Write the record (atomically); a failure is one note, never fatal."""
        self._last_persist = time.monotonic()
        path = self.path()
        if path is not None and self.account is None and self._began is not None:
            _attempt("starting the session record", self._make_account, self.notes)  # stopped before its thread did
        if path is None or self.account is None:
            return

        def write() -> None:
            from gpuprof_jupyter.core.store.atomic import write_json_atomic

            body = self.query()
            body["kernel_pid"] = self.kernel_pid
            body["written"] = time.time()
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_json_atomic(path, body)  # opens the folder without following a link

        failed: list[str] = []
        _attempt("writing the session record", write, failed)
        self.notes.extend(n for n in failed if n not in self.notes)  # one note, not one a minute

    def close(self) -> None:
        """The kernel quit or died: stop, write what the record has, and remove its state (the
        server shows live kernels only). Shut down by the server's GPU-aware culling, the
        record says so."""
        culled = self._culled()
        if self.on:
            self.stop()
        elif culled:
            self.persist()
        path = self.path()
        if path is not None:
            try:
                path.with_suffix(".state.json").unlink()
            except OSError:
                pass


def _attempt(what: str, fn, notes: list[str]):
    """``fn()``, or None with a note when it raises. Not ``guarded.run_step``: the record's work
    runs beside the runs, whose steps that names and counts (``core/fault_injection.trace_steps``)."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the record is best effort; the kernel never sees this
        notes.append(f"gpuprof: {what} failed ({type(exc).__name__}: {exc})")
        return None
