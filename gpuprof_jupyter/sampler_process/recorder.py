"""Columnar buffers for the sampler's ticks, written to the store by a thread of their own.

Runs in the sampler process.

Memory stays bounded however long the run: only rows since the last write live here (the
store keeps full resolution). The sampling lanes only append (``on_tick``); a writer thread
hands the rows to the store every ``flush_every_s``, so a slow home directory (NFS) delays
the file, never a sample. A write that fails is kept and retried, with one note saying so;
rows are never dropped silently (if the disk stays broken, memory holds them and the
experiment's notes say how many are unwritten). Listeners (the live feed) get each tick as
it comes, in the lane's thread: they must only hand it over.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Callable

from gpuprof_jupyter.sampler_process.lane import Gap, Tick

FLUSH_EVERY_S = 2.0
RETRY_S = 0.5  # first retry delay after a failed write, doubled up to FLUSH_EVERY_S


class Recorder:
    """Turns ticks into long-format rows (t, wall_time, device, metrics...)."""

    def __init__(self, t0: float, metrics: list[str], writer=None, flush_every_s: float = FLUSH_EVERY_S) -> None:
        self.t0 = t0
        self.metrics = list(metrics)
        self.writer = writer  # store.samples_file.SampleStreamWriter, or None (benchmarks)
        self.flush_every_s = flush_every_s
        self.gaps: list[Gap] = []
        self.errors: list[str] = []
        self.rows = 0
        self.write_failures = 0
        self._listeners: list[Callable[[Tick], None]] = []
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()  # one write at a time (the thread, a final flush)
        self._columns = self._new_columns()
        self._unwritten: list[dict[str, list]] = []  # batches whose write failed, oldest first
        self._closed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _new_columns(self) -> dict[str, list]:
        return {name: [] for name in ["t", "wall_time", "device", *self.metrics]}

    def add_listener(self, callback: Callable[[Tick], None]) -> None:
        self._listeners.append(callback)

    def on_tick(self, tick: Tick) -> None:
        t = tick.mono - self.t0
        nan = math.nan
        with self._lock:
            if self._closed:  # a lane thread that was stuck in a source returned too late
                return
            columns = self._columns
            for device, values in tick.reading.items():
                columns["t"].append(t)
                columns["wall_time"].append(tick.wall)
                columns["device"].append(device)
                for metric in self.metrics:
                    columns[metric].append(values.get(metric, nan))
                self.rows += 1
        for listener in self._listeners:
            listener(tick)

    def on_gap(self, gap: Gap) -> None:
        self.gaps.append(gap)

    def on_error(self, message: str) -> None:
        if message not in self.errors:
            self.errors.append(message)

    # -- writing -------------------------------------------------------------------------------
    def start_writing(self) -> None:
        """Write every ``flush_every_s`` on a thread of its own."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._write_loop, name="gpuprof-writer", daemon=True)
        self._thread.start()

    def _write_loop(self) -> None:
        delay = self.flush_every_s
        while not self._stop.wait(delay):
            delay = self.flush_every_s if self.flush() else min(max(RETRY_S, delay / 2) * 2, self.flush_every_s)

    def flush(self) -> bool:
        """Hand the rows so far to the writer; False when a write failed (kept for a retry)."""
        with self._lock:
            if self._columns["t"]:
                self._unwritten.append(self._columns)
                self._columns = self._new_columns()
        if self.writer is None:
            self._unwritten.clear()
            return True
        with self._write_lock:
            while self._unwritten:
                try:
                    self.writer.write(self._unwritten[0])
                except Exception as exc:  # noqa: BLE001 - the disk: retried, and said once
                    self.write_failures += 1
                    self.on_error(f"writing samples failed ({type(exc).__name__}: {exc}); kept in memory and retried")
                    return False
                self._unwritten.pop(0)
        return True

    @property
    def unwritten_rows(self) -> int:
        return sum(len(c["t"]) for c in self._unwritten) + len(self._columns["t"])

    def close(self, retries: int = 3) -> None:
        """No more rows (a late tick is ignored); stop the thread; write what is left, retrying
        a failing write a few times. Rows still unwritten are counted in a note."""
        with self._lock:
            self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30.0)
            self._thread = None
        for attempt in range(retries + 1):
            if self.flush():
                return
            time.sleep(RETRY_S * (attempt + 1))
        self.on_error(f"{self.unwritten_rows} sample rows could not be written: the disk kept failing")
