"""What the profiled code reports about itself: steps, data waits, phases, results.

``step()`` and ``track()`` feed an ActivityLog owned by the active profiling session.
From it come throughput and data-wait figures, and the simulated GPU's load: the share
of each sampler interval the loop spent inside training steps rather than waiting for data.
All times are ``time.monotonic()`` seconds; the log converts to seconds since start.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from dataclasses import dataclass, field

BUSY, WAIT, IDLE = 1, 0, 0  # state values: share of "busy" they contribute


@dataclass
class StepRecord:
    t_end_s: float  # seconds since session start
    duration_s: float
    wait_s: float  # time spent waiting for data during this step
    n_samples: float  # NaN when not reported


@dataclass
class PhaseRecord:
    name: str
    start_s: float
    end_s: float | None = None


@dataclass
class ActivityLog:
    """Thread-safe record of the loop's activity during one session."""

    t0: float
    clock: callable = time.monotonic
    steps: list[StepRecord] = field(default_factory=list)
    phases: list[PhaseRecord] = field(default_factory=list)
    user_metrics: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        # (time, state) transitions, pruned to a recent window: the simulated GPU reads it.
        self._transitions: deque[tuple[float, int]] = deque(maxlen=100_000)
        self._state = IDLE
        self._last_step_end: float | None = None
        self._wait_in_step = 0.0
        self._wait_started: float | None = None
        self.reported = False  # True once step() or track() was used
        # called as listener(steps done, now) after each step, outside the lock, on the thread
        # that reported it (the --trace window starts and stops its profiler there)
        self.step_listeners: list = []

    # -- events -----------------------------------------------------------------------------
    def _set_state(self, now: float, state: int) -> None:
        if state != self._state:
            self._state = state
            self._transitions.append((now, state))

    def wait_started(self) -> None:
        now = self.clock()
        with self._lock:
            self.reported = True
            if self._last_step_end is None:
                self._last_step_end = now
            self._wait_started = now
            self._set_state(now, WAIT)

    def wait_ended(self) -> None:
        now = self.clock()
        with self._lock:
            if self._wait_started is not None:
                self._wait_in_step += now - self._wait_started
                self._wait_started = None
            self._set_state(now, BUSY)

    def loop_ended(self) -> None:
        now = self.clock()
        with self._lock:
            self._wait_started = None
            self._set_state(now, IDLE)

    def step(self, n_samples: float | None = None) -> None:
        now = self.clock()
        with self._lock:
            self.reported = True
            start = self._last_step_end if self._last_step_end is not None else self._first_busy(now)
            self.steps.append(
                StepRecord(
                    t_end_s=now - self.t0,
                    duration_s=now - start,
                    wait_s=self._wait_in_step,
                    n_samples=float("nan") if n_samples is None else float(n_samples),
                )
            )
            self._last_step_end = now
            self._wait_in_step = 0.0
            if self._wait_started is None:
                self._set_state(now, BUSY)
            count = len(self.steps)
        for listener in self.step_listeners:
            listener(count, now)

    def _first_busy(self, now: float) -> float:
        for t, state in self._transitions:
            if state == BUSY:
                return t
        return self.t0

    def phase_started(self, name: str) -> PhaseRecord:
        record = PhaseRecord(name=name, start_s=self.clock() - self.t0)
        with self._lock:
            self.phases.append(record)
        return record

    def phase_ended(self, record: PhaseRecord) -> None:
        record.end_s = self.clock() - self.t0

    def close(self) -> None:
        """End of the session: open phases end now, the loop is idle."""
        now = self.clock()
        with self._lock:
            self._set_state(now, IDLE)
        for record in self.phases:
            if record.end_s is None:
                record.end_s = now - self.t0

    # -- queries ----------------------------------------------------------------------------
    def busy_share(self, start: float, end: float) -> float | None:
        """Share of [start, end] (monotonic s) the loop spent inside steps, not waiting.

        None when the code reported no steps at all (the simulator then plays a scenario).
        """
        if not self.reported or end <= start:
            return None
        with self._lock:
            transitions = list(self._transitions)
        times = [t for t, _ in transitions]
        i = bisect.bisect_right(times, start)
        state = transitions[i - 1][1] if i > 0 else IDLE
        busy, cursor = 0.0, start
        for t, new_state in transitions[i:]:
            if t >= end:
                break
            busy += state * (t - cursor)
            cursor, state = t, new_state
        busy += state * (end - cursor)
        return busy / (end - start)
