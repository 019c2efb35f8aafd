"""What the profiled loop did: steps, data waits, phases, results, folded from events.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

Producers (``step()``/``track()``, the DataLoader and optimizer hooks of ``torch_hooks``)
only append ``(kind, time, value)`` tuples to the log's ``EventBuffer`` (``events``): no
lock and no work per event. ``drain()`` folds the pending batch into step records and
busy/wait transitions under one lock; it runs at each hand-over to the sampler process
(once a second, the link's thread), whenever a consumer
reads (``steps``; ``take_transitions``: the simulated GPU in the sampler process) and at
``close()``.

Steps come from two origins, kept apart so nothing is counted twice: explicit ``step()``
calls and the optimizer hooks. When the code calls ``step()`` at all, its steps are the
steps (``steps_origin == "step()"``); otherwise the optimizer's (docs/events.md has the
rules for nested and sibling optimizers, skipped and accumulated steps). Data waits are
counted once however many layers report them (``track()`` around a hooked DataLoader).

All times are ``time.monotonic()`` seconds; records hold seconds since the session start.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from gpuprof_jupyter.runtime.record.events import (NO_BATCH, REQ_END, REQ_MODULE, LOOP_END, MEM, OPT_POST, OPT_PRE, SCALER_POST,
                                                   SCALER_PRE, STEP, WAIT_END, WAIT_START, EventBuffer)
from gpuprof_jupyter.runtime.record.request_log import RequestLog
from gpuprof_jupyter.runtime.hooks.fork_locks import hook_lock
from gpuprof_jupyter.runtime.hooks.requests import RequestTimer

BUSY, WAIT, IDLE = 1, 0, 0  # state values: share of "busy" they contribute


@dataclass(slots=True)
class StepRecord:
    t_end_s: float  # seconds since session start
    duration_s: float
    wait_s: float  # time spent waiting for data during this step
    n_samples: float  # NaN when not known
    n_batches: int = 0  # batches fetched during the step (0: none seen); > 1 with gradient accumulation
    skipped: bool = False  # GradScaler skipped the optimizer step (inf/NaN gradients)
    peak_memory_bytes: float = math.nan  # torch's allocator peak during the step (NaN: CUDA not in use)

    def as_tuple(self) -> tuple:
        """As sent to the sampler process (``core.finish.STEP_FIELDS`` order)."""
        return (self.t_end_s, self.duration_s, self.wait_s, self.n_samples, self.n_batches, self.skipped,
                self.peak_memory_bytes)


@dataclass
class PhaseRecord:
    name: str
    start_s: float
    end_s: float | None = None


class _Steps:
    """Steps of one origin and what accumulates until the next one ends."""

    def __init__(self) -> None:
        self.records: list[StepRecord] = []
        self.last_end: float | None = None
        self.wait = 0.0
        self.batches = 0
        self.samples = 0.0  # NaN once a batch of unknown size came
        self.optimizers: set[int] = set()  # optimizer ids stepped in the last step
        self.peak = math.nan  # highest MEM reading since the last step ended

    def memory(self, peak: float) -> None:
        self.peak = peak if math.isnan(self.peak) else max(self.peak, peak)

    def batch(self, n) -> None:
        self.batches += 1
        self.samples += float(n) if n is not None else math.nan

    def close(self, now: float, start: float, t0: float, n_samples, skipped: bool = False) -> StepRecord:
        record = StepRecord(now - t0, now - start, self.wait, float("nan") if n_samples is None else float(n_samples),
                            self.batches, skipped, self.peak)
        self.records.append(record)
        self.last_end, self.wait, self.batches, self.samples, self.peak = now, 0.0, 0, 0.0, math.nan
        return record


class ActivityLog:
    """The loop's activity during one session; producers append events, consumers drain."""

    def __init__(self, t0: float, clock=time.monotonic) -> None:
        self.t0 = t0
        self.clock = clock
        self.events = EventBuffer()
        self.emit = self.events.append  # producers: emit((kind, clock(), value))
        self.phases: list[PhaseRecord] = []
        self.user_metrics: dict = {}
        self.requests = RequestLog(t0)  # serving calls, folded (request_log.py)
        self.request_timer = RequestTimer(self.emit, clock)  # their producer (requests.py)
        self.reported = False  # True once any step, wait or optimizer step was seen
        # called as listener(steps done, now) after each step, outside the lock, on the thread
        # that reported it (the --trace window starts and stops its profiler there)
        self.step_listeners: list = []
        self._listeners_lock = hook_lock(self, "_listeners_lock")  # add_step_listener from another thread: new in a fork
        # called on the training thread before each step() event (the memory probe, runtime.hooks.memory_hooks)
        self.before_step = None
        self._lock = hook_lock(self, "_lock")  # taken on the training thread too (step listeners): new in a fork
        self._transitions: list[tuple[float, int]] = []  # not yet handed to the sampler process
        self._state = IDLE
        self._explicit, self._auto = _Steps(), _Steps()
        self._first_wait: float | None = None
        self._wait_depth = 0
        self._wait_started = 0.0
        self._wait_batch = None  # sample count of the batch being waited for (first known)
        self._wait_got_batch = False
        self.last_batch_t: float | None = None  # when the last batch came (monotonic s): progress without steps
        self._opt_depth = 0
        self._scaler_depth = 0
        self._scaler_saw_step = False
        self._notified = 0
        self.unfolded = 0  # events the fold raised on: dropped, counted (``unfolded_note``)
        self.first_unfolded: str | None = None
        # a traced child process (runtime.jobs.child) folds here too, and forwards each drained
        # batch as it was to the run that folds it again: None, or the batches not yet taken
        self.forward: list | None = None

    # -- producers (cheap: one append) -------------------------------------------------------
    def wait_started(self) -> None:
        self.emit((WAIT_START, self.clock(), None))

    def wait_ended(self, n_samples=None) -> None:
        self.emit((WAIT_END, self.clock(), n_samples))

    def loop_ended(self) -> None:
        self.emit((LOOP_END, self.clock(), None))

    def step(self, n_samples: float | None = None) -> None:
        if self.before_step is not None:
            self.before_step()
        self.emit((STEP, self.clock(), n_samples))
        if self.step_listeners:
            self.notify_steps()

    def notify_steps(self) -> None:
        """Tell the step listeners of each step that ended since the last call (on this thread).

        A listener that returns True wants no more steps and is dropped, so once a trace window
        has closed the steps go back to costing one append each (no fold per step)."""
        count = len(self.steps)
        now = self.clock()
        while self._notified < count and self.step_listeners:
            self._notified += 1
            done = [listener for listener in self.step_listeners if listener(self._notified, now)]
            if done:
                with self._listeners_lock:
                    self.step_listeners = [listener for listener in self.step_listeners if listener not in done]

    def add_step_listener(self, listener) -> None:
        """From any thread (``--trace on-alert``: the link's): ``listener`` is told of the steps that
        end from now on, not of those before (which no listener was told of while there was none)."""
        count = len(self.steps)
        with self._listeners_lock:
            if not self.step_listeners:
                self._notified = max(self._notified, count)
            self.step_listeners = [*self.step_listeners, listener]

    def phase_started(self, name: str) -> PhaseRecord:
        record = PhaseRecord(name=name, start_s=self.clock() - self.t0)
        with self._lock:
            self.phases.append(record)
        return record

    def phase_ended(self, record: PhaseRecord) -> None:
        record.end_s = self.clock() - self.t0

    # -- the consumer side: events folded in batches ---------------------------------------------
    def drain(self) -> int:
        """Fold the pending events into steps and transitions; returns how many there were."""
        self.request_timer.poll()  # CUDA events of requests whose GPU work is done: read, never waited for
        with self._lock:
            batch = self.events.drain()
            if self.forward is not None:
                self.forward.extend(batch)
            apply = self._apply
            for kind, t, value in batch:
                try:  # free until it raises (Python 3.11)
                    if kind == OPT_PRE:  # half of an optimizer's events: no call for it
                        self._opt_depth += 1
                    else:
                        apply(kind, t, value)
                except Exception as exc:  # noqa: BLE001 - one bad event never costs the batch or the run
                    self.unfolded += 1
                    self.first_unfolded = self.first_unfolded or f"{(kind, t, value)!r}: {type(exc).__name__}: {exc}"
        return len(batch)

    def unfolded_note(self, who: str) -> str | None:
        """One note for the events that raised in the fold (dropped, the others folded), or None."""
        if not self.unfolded:
            return None
        return (f"gpuprof: {self.unfolded} event(s) of {who} could not be folded and were dropped (first: "
                f"{self.first_unfolded}); its other events are kept")

    def take_forwarded(self) -> list[tuple]:
        """The events drained since the last call, as they were (after folding what is pending)."""
        self.drain()
        with self._lock:
            taken, self.forward = self.forward, []
        return taken

    def take_requests(self) -> list[tuple]:
        """Requests completed since the last call (``request_log.RequestLog.take_new``), after
        folding what is pending."""
        self.drain()
        with self._lock:
            return self.requests.take_new()

    def _set_state(self, now: float, state: int) -> None:
        if state != self._state:
            self._state = state
            self._transitions.append((now, state))

    def take_transitions(self) -> list[tuple[float, int]]:
        """Busy/wait transitions since the last call (the simulated GPU's load is derived from
        them in the sampler process: ``sampler_process.kernel_feed``)."""
        self.drain()
        with self._lock:
            taken, self._transitions = self._transitions, []
        return taken

    def _start_of(self, steps: _Steps) -> float:
        if steps.last_end is not None:
            return steps.last_end
        return self._first_wait if self._first_wait is not None else self.t0

    def _apply(self, kind: int, t: float, value) -> None:
        # most frequent kinds first: this runs once per event (benchmarks/bench_hooks.py)
        if kind >= REQ_MODULE:  # requests (request_log.py): busy inside them, idle between
            self.requests.apply(kind, t, value)
            if kind <= REQ_END and not self._wait_depth:
                state = IDLE if kind == REQ_END else BUSY
                if state != self._state:  # _set_state, inlined
                    self.reported = True
                    self._state = state
                    self._transitions.append((t, state))
        elif kind == OPT_POST:
            depth = self._opt_depth = self._opt_depth - 1 if self._opt_depth > 0 else 0
            if self._scaler_depth:
                self._scaler_saw_step = True
            if depth == 0:  # the outermost step() of a wrapper and its inner optimizer
                self._optimizer_step(t, value, skipped=False)
        elif kind == WAIT_START:
            self.reported = True
            if self._first_wait is None:
                self._first_wait = t
            self._wait_depth += 1
            if self._wait_depth == 1:  # the outermost layer times the wait; inner ones only add a size
                self._wait_started, self._wait_batch, self._wait_got_batch = t, None, False
                self._set_state(t, WAIT)
        elif kind == WAIT_END:
            if self._wait_depth == 0:
                return  # its loop already ended (an inner loader's StopIteration)
            if value != NO_BATCH:
                self._wait_got_batch = True
                if self._wait_batch is None:
                    self._wait_batch = value
            self._wait_depth -= 1
            if self._wait_depth == 0:
                waited = t - self._wait_started
                self.requests.waited(waited)
                for steps in (self._explicit, self._auto):
                    steps.wait += waited
                    if self._wait_got_batch:
                        steps.batch(self._wait_batch)
                if self._wait_got_batch:
                    self.last_batch_t = t  # the stuck watch counts it as progress (runtime.jobs.stuck_watch)
                self._set_state(t, BUSY)
        elif kind == LOOP_END:
            self._wait_depth = 0
            self._set_state(t, IDLE)
        elif kind == STEP:
            self.reported = True
            steps = self._explicit
            n = value if value is not None else (steps.samples if steps.batches else None)
            steps.close(t, self._start_of(steps), self.t0, n)
            if self._wait_depth == 0:
                self._set_state(t, BUSY)
        elif kind == SCALER_PRE:
            if self._scaler_depth == 0:
                self._scaler_saw_step = False
            self._scaler_depth += 1
        elif kind == SCALER_POST:
            self._scaler_depth = max(0, self._scaler_depth - 1)
            if self._scaler_depth == 0 and not self._scaler_saw_step:  # inf/NaN: optimizer.step() not called
                self._optimizer_step(t, value, skipped=True)
        elif kind == MEM:  # comes before the step's own event: counts for the step it ends
            self._explicit.memory(value)
            self._auto.memory(value)

    def _optimizer_step(self, t: float, optimizer: int, skipped: bool) -> None:
        """One outermost optimizer step. It joins the last training step when it is a sibling:
        no batch was fetched since, and this optimizer has not stepped in it yet (a GAN's
        generator after its discriminator). Otherwise it ends a new training step."""
        self.reported = True
        steps = self._auto
        if steps.records and steps.batches == 0 and optimizer not in steps.optimizers:
            last = steps.records[-1]
            last.duration_s += t - steps.last_end
            last.t_end_s = t - self.t0
            last.wait_s += steps.wait
            last.skipped = last.skipped and skipped
            if not math.isnan(steps.peak):
                last.peak_memory_bytes = steps.peak if math.isnan(last.peak_memory_bytes) else max(last.peak_memory_bytes, steps.peak)
            steps.last_end, steps.wait, steps.peak = t, 0.0, math.nan
            steps.optimizers.add(optimizer)
        else:
            n = steps.samples if steps.batches else None
            steps.close(t, self._start_of(steps), self.t0, n, skipped)
            steps.optimizers.clear()
            steps.optimizers.add(optimizer)
        if self._wait_depth == 0 and self._state != BUSY:
            self._set_state(t, BUSY)

    def close(self) -> None:
        """End of the session: pending events folded (the last requests' CUDA events waited for: the
        run is over), open phases end now, the loop is idle."""
        self.request_timer.poll(final=True)
        self.drain()
        now = self.clock()
        with self._lock:
            self._set_state(now, IDLE)
        for record in self.phases:
            if record.end_s is None:
                record.end_s = now - self.t0

    def forget_after_fork(self) -> None:
        """In a forked process: what was recorded, pending and locked is the parent's. Start
        empty with fresh locks; the buffer stays (installed hooks append to it) but is emptied."""
        events, emit = self.events, self.emit
        events.drain()
        self.__init__(self.t0, self.clock)
        self.events, self.emit = events, emit

    # -- queries (each drains first) -------------------------------------------------------------
    @property
    def steps(self) -> list[StepRecord]:
        """The steps: from ``step()`` calls when there are any, else from the optimizer hooks."""
        self.drain()
        return self._explicit.records if self._explicit.records else self._auto.records

    @property
    def steps_origin(self) -> str | None:
        """``"step()"``, ``"optimizer"`` or None (no steps)."""
        self.drain()
        return "step()" if self._explicit.records else ("optimizer" if self._auto.records else None)

    @property
    def optimizer_steps(self) -> list[StepRecord]:
        """The optimizer hooks' steps, also when ``step()`` calls took precedence."""
        self.drain()
        return self._auto.records
