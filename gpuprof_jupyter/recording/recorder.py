"""Columnar buffers for the sampler's ticks, spilled to the store every few seconds.

Memory stays bounded however long the run: only rows since the last flush live here (the
store keeps full resolution). Listeners (the live dashboard) get each tick as it comes, in
the sampler thread: they must only hand it over (append to a deque), never render.
"""

from __future__ import annotations

import math
import threading
from typing import Callable

from ..sampler import Gap, Tick

FLUSH_EVERY_S = 2.0


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
        self._listeners: list[Callable[[Tick], None]] = []
        self._lock = threading.Lock()
        self._columns = self._new_columns()
        self._last_flush_t = 0.0

    def _new_columns(self) -> dict[str, list]:
        return {name: [] for name in ["t", "wall_time", "device", *self.metrics]}

    def add_listener(self, callback: Callable[[Tick], None]) -> None:
        self._listeners.append(callback)

    def on_tick(self, tick: Tick) -> None:
        t = tick.mono - self.t0
        columns, nan = self._columns, math.nan
        with self._lock:
            for device, values in tick.reading.items():
                columns["t"].append(t)
                columns["wall_time"].append(tick.wall)
                columns["device"].append(device)
                for metric in self.metrics:
                    columns[metric].append(values.get(metric, nan))
                self.rows += 1
            if t - self._last_flush_t >= self.flush_every_s:
                self._flush_locked(t)
        for listener in self._listeners:
            listener(tick)

    def on_gap(self, gap: Gap) -> None:
        self.gaps.append(gap)

    def on_error(self, message: str) -> None:
        if message not in self.errors:
            self.errors.append(message)

    def flush(self) -> None:
        with self._lock:
            self._flush_locked(self._last_flush_t)

    def _flush_locked(self, t: float) -> None:
        self._last_flush_t = t
        if self.writer is None or not self._columns["t"]:
            return
        columns, self._columns = self._columns, self._new_columns()
        self.writer.write(columns)
