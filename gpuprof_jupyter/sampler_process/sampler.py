"""The sampler process's fast lane: one background thread that reads every polled source at a fixed cadence.

Runs in the sampler process.

The schedule never drifts (``next_tick += interval``). A sample taken more than two intervals
after the previous one is the end of a recorded gap (``protocol.is_gap``, the one gap rule),
never interpolated: a thread holding the GIL in one long C call starves this thread
(docs/facts.md, "A long C call starves a Python thread"), and the honest answer is "we did not
see that time". An exception in a source is noted once and never reaches the user's cell. A new
thread is made for every ``start()``: a sampler restarted per cell must not silently stop.

The process's periodic work (the writer, the live update) starts just after a tick
(``after_next_tick``), so it runs in the gap before the next one: a thread of this process
that holds the core or the GIL when a tick is due makes that tick late (docs/sampling.md,
"Cadence").
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

from gpuprof_jupyter.core.config import DEFAULT_INTERVAL_S
from gpuprof_jupyter.core.protocol import Gap, Reading, Tick, is_gap
from gpuprof_jupyter.core.sources.base import Source


class Sampler:
    """Reads ``sources`` every ``interval`` seconds and hands each Tick to ``on_tick``."""

    def __init__(
        self,
        sources: Sequence[Source],
        on_tick: Callable[[Tick], None],
        interval: float = DEFAULT_INTERVAL_S,
        on_gap: Callable[[Gap], None] | None = None,
        on_error: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"sampling interval must be > 0 s, got {interval}")
        self.sources = list(sources)
        self.interval = float(interval)
        self._on_tick = on_tick
        self._on_gap = on_gap or (lambda gap: None)
        self._on_error = on_error or (lambda message: None)
        self._clock = clock
        self._wall = wall_clock
        self._sleep = sleep  # tests pass a fake clock's sleep; default: wait on the stop event
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ticked = threading.Condition()  # notified after each tick (after_next_tick)
        self._failed: set[str] = set()
        self.ticks = 0
        self.last_sample_at: float | None = None  # monotonic time of the last reading
        self.lateness: list[float] = []  # |actual - scheduled| per tick, kept short (benchmarks)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            raise RuntimeError("sampler already running")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuprof-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop within one interval (plus one source read); safe to call twice. A thread still
        inside a source after ``timeout`` keeps its handle (``running`` stays True): nobody
        may read the sources while it is (they share buffers and GPM state)."""
        self._stop.set()
        with self._ticked:
            self._ticked.notify_all()  # periodic work waiting for a tick goes on
        if self._thread is not None:
            self._thread.join(timeout if timeout is not None else max(2.0, 3 * self.interval))
            if not self._thread.is_alive():
                self._thread = None

    def after_next_tick(self) -> None:
        """Return just after the next tick is recorded, or two intervals from now (at most a
        second) if none comes (a source stuck in a call, a stopped lane): work started here has
        the gap before the following tick to itself (docs/sampling.md, "Cadence")."""
        if not self.running:
            return
        with self._ticked:
            self._ticked.wait(min(2 * self.interval, 1.0))

    def sample_once(self) -> Tick:
        """Read every source now; a failing source is noted and skipped."""
        reading: Reading = {}
        for source in self.sources:
            try:
                part = source.read()
            except Exception as exc:  # noqa: BLE001 - a source must never break the user's cell
                key = f"{source.name}: {type(exc).__name__}"
                if key not in self._failed:
                    self._failed.add(key)
                    self._on_error(f"source {source.name} failed to read ({type(exc).__name__}: {exc})")
                continue
            for device, values in part.items():
                reading.setdefault(device, {}).update(values)
        return Tick(self._clock(), self._wall(), reading)

    def _run(self) -> None:
        interval = self.interval
        stop = self._stop  # this thread's own: a later start() makes a new one
        next_tick = self._clock()
        last_sample: float | None = None
        while not stop.is_set():
            started = self._clock()
            tick = self.sample_once()
            if stop.is_set():
                break  # stopped while reading: the caller takes the last sample
            if last_sample is not None and is_gap(last_sample, tick.mono, interval):
                self._on_gap(Gap(start=last_sample, end=tick.mono))
            if len(self.lateness) < 100_000:
                self.lateness.append(abs(started - next_tick))  # the tick's start against its schedule
            last_sample = self.last_sample_at = tick.mono
            self.ticks += 1
            try:
                self._on_tick(tick)
            except Exception as exc:  # noqa: BLE001 - the lane outlives a failed recording, which is noted
                self._on_error(f"recording a sample failed ({type(exc).__name__}: {exc})")
            with self._ticked:
                self._ticked.notify_all()
            next_tick += interval
            now = self._clock()
            if next_tick < now:  # fell behind: skip the missed slots, keep the phase
                missed = int((now - next_tick) // interval) + 1
                next_tick += missed * interval
            if self._sleep is not None:
                self._sleep(next_tick - now)
            else:
                stop.wait(next_tick - now)
