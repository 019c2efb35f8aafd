"""Columnar buffers for the sampler's ticks, written to the store by a thread of their own
(runs in the sampler process).

Runs in the sampler process.

Memory stays bounded however long the run: only rows since the last write live here (the
store keeps full resolution). The sampling lanes only append (``on_tick``); a writer thread
hands the rows to the store every ``flush_every_s``, so a slow home directory (NFS) delays
the file, never a sample. The writer starts each flush just after a tick (``pace``: the
lane's ``after_next_tick``), in the gap before the next one, so its CPU never delays a tick.
Each flush is serialised to bytes at once; bytes whose write fails (a full disk) wait, oldest
first, and are written again from the stream's last good offset (samples_file.py), so a row is
never written twice. What happened becomes one note per episode: how often writes failed and
that nothing was lost, or exactly how many rows were lost and over which seconds (more than
``MAX_WAITING_BYTES`` waited, or the disk never recovered before the run ended). Listeners (the
live feed) get each tick as it comes, in the lane's thread: they must only hand it over.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Callable

from gpuprof_jupyter.core.protocol import Gap, Tick
from gpuprof_jupyter.core.format import fmt_unit

FLUSH_EVERY_S = 2.0
RETRY_S = 0.5  # first retry delay after a failed write, doubled up to FLUSH_EVERY_S
MAX_WAITING_BYTES = 64 << 20  # serialised rows held while the disk fails; beyond, the oldest are lost (noted)


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
        self._waiting: deque = deque()  # samples_file.EncodedBatch not written yet, oldest first
        self._waiting_bytes = 0
        self._trouble: _WriteTrouble | None = None  # the current episode of failing writes
        self._closed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.pace: Callable[[], None] = lambda: None  # the fast lane's after_next_tick (lanes.py), once it runs

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
            self.pace()
            delay = self.flush_every_s if self.flush() else min(max(RETRY_S, delay / 2) * 2, self.flush_every_s)

    def flush(self) -> bool:
        """Hand the rows so far to the writer; False when a write failed (they wait for a retry)."""
        with self._lock:
            columns = self._columns
            if columns["t"]:
                self._columns = self._new_columns()
        if self.writer is None:
            return True
        with self._write_lock:
            if columns["t"]:
                self._encode(columns)
            while self._waiting:
                try:
                    self.writer.append(self._waiting[0])
                except Exception as exc:  # noqa: BLE001 - the disk: retried, and said once per episode
                    self.write_failures += 1
                    self._troubled().failed(exc)
                    self._shed(MAX_WAITING_BYTES)
                    return False
                self._waiting_bytes -= len(self._waiting.popleft().data)
            if self._trouble is not None:
                self.on_error(self._trouble.note(recovered=True))
                self._trouble = None
        return True

    def _encode(self, columns: dict[str, list]) -> None:
        try:
            encoded = self.writer.encode(columns)
        except Exception as exc:  # noqa: BLE001 - never expected (values are floats); said, never silent
            t = [v for v in columns["t"] if v == v]
            self._troubled().failed(exc)
            self._trouble.lose(len(columns["t"]), min(t, default=None), max(t, default=None))
            return
        self._waiting.append(encoded)
        self._waiting_bytes += len(encoded.data)

    def _troubled(self) -> "_WriteTrouble":
        if self._trouble is None:
            self._trouble = _WriteTrouble()
        return self._trouble

    def _shed(self, keep_bytes: int) -> None:
        """Drop the oldest waiting batches until at most ``keep_bytes`` wait (counted as lost)."""
        while self._waiting and self._waiting_bytes > keep_bytes:
            lost = self._waiting.popleft()
            self._waiting_bytes -= len(lost.data)
            self._troubled().lose(lost.rows, lost.t_min, lost.t_max)

    @property
    def unwritten_rows(self) -> int:
        return sum(b.rows for b in self._waiting) + len(self._columns["t"])

    def close(self, retries: int = 3) -> None:
        """No more rows (a late tick is ignored); stop the thread; write what is left, retrying
        a failing write a few times. Rows still unwritten then are lost, and the note says how
        many and over which seconds."""
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
        with self._write_lock:
            self._shed(0)
            self.on_error(self._trouble.note(recovered=False))
            self._trouble = None


class _WriteTrouble:
    """One episode of failing writes: how often, the last error, the rows lost (if any)."""

    def __init__(self) -> None:
        self.failures = 0
        self.error = ""
        self.lost_rows = 0
        self.lost_from = math.inf
        self.lost_to = -math.inf

    def failed(self, exc: Exception) -> None:
        self.failures += 1
        self.error = f"{type(exc).__name__}: {exc}"

    def lose(self, rows: int, t_min: float | None, t_max: float | None) -> None:
        self.lost_rows += rows
        if t_min is not None:
            self.lost_from = min(self.lost_from, t_min)
        if t_max is not None:
            self.lost_to = max(self.lost_to, t_max)

    def note(self, recovered: bool) -> str:
        said = f"writing samples failed {self.failures} time{'s' * (self.failures != 1)} ({self.error})"
        if not self.lost_rows:
            return f"{said}; the rows waited in memory and were all written afterwards: none lost or repeated"
        span = (f"from t={fmt_unit(self.lost_from, 's', 2)} to t={fmt_unit(self.lost_to, 's', 2)}" if self.lost_from <= self.lost_to
                else "at unknown times")
        why = ("more waited than the memory set aside for them" if recovered
               else "the disk was still failing when the run ended")
        return f"{said}; {self.lost_rows} sample rows {span} were lost ({why}); every other row was written once"
