"""``--trace``: torch.profiler for a bounded window of the reported steps, sampler still running.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

``steps=A:B`` traces steps A to B-1 (Python slice semantics; step k runs between the k-th and
(k+1)-th ``step()`` call, so step 0 starts with the session). ``seconds=S:T`` starts at the
first step boundary S seconds after the session started and stops at the first boundary T
seconds later. If the run ends inside the window, the partial window is kept and said so.
``on-alert[=N]`` opens this same window over the N steps after a live alert (``alert_trace.py``).

The profiler is started and stopped on the session's own thread (the cell's), at step
boundaries reported from that thread: a profiler started from another thread records nothing
of the training thread, and stopping one from another thread crashed the process (torch 2.13,
checked). Steps reported from another thread leave the window unstarted, with a note.

Activities: CPU, plus CUDA only when ``torch.cuda.is_initialized()`` (the profiler never
initialises CUDA). Shapes are not recorded. The window is capped (``MAX_STEPS``, ``MAX_S``)
and so is the saved trace (``MAX_EVENTS``). Nothing here may break the user's cell: a failure
to start, stop or save becomes a note and the run goes on untraced.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from gpuprof_jupyter.core.format import fmt_unit

MAX_STEPS = 200  # steps traced at most, whatever the window asks
MAX_S = 60.0  # seconds traced at most
MAX_EVENTS = 200_000  # events kept in the saved trace (the earliest; metadata events always)

_SPEC = re.compile(r"^\s*(steps|seconds)\s*=\s*([0-9.]+)\s*:\s*([0-9.]+)\s*$")
_ON_ALERT = re.compile(r"^\s*on-alert\s*(?:=\s*([0-9]+)\s*)?$")
ON_ALERT_STEPS = 5  # steps traced after an alert (--trace on-alert), unless on-alert=N says otherwise


@dataclass(frozen=True)
class TraceSpec:
    kind: str  # "steps", "seconds" or "on-alert" (runtime/hooks/alert_trace.py)
    start: float  # first step, or seconds after the session started (on-alert: 0)
    stop: float  # end step (exclusive), or for seconds: the window's length (on-alert: steps per capture)

    def __str__(self) -> str:
        if self.kind == "on-alert":
            return f"on-alert={int(self.stop)}"
        fmt = (lambda v: str(int(v))) if self.kind == "steps" else (lambda v: f"{v:g}")
        return f"{self.kind}={fmt(self.start)}:{fmt(self.stop)}"


def parse_trace(text: str) -> TraceSpec:
    """``"steps=20:25"``, ``"seconds=30:5"`` or ``"on-alert[=N]"`` -> TraceSpec; ValueError says what
    is expected."""
    alert = _ON_ALERT.match(text or "")
    if alert is not None:
        steps = int(alert.group(1) or ON_ALERT_STEPS)
        if not 1 <= steps <= MAX_STEPS:
            raise ValueError(f"--trace on-alert=N takes 1 to {MAX_STEPS} steps; got {text!r}")
        return TraceSpec("on-alert", 0, steps)
    match = _SPEC.match(text or "")
    if match is None:
        raise ValueError(f"--trace takes steps=A:B (steps A to B-1), seconds=S:T (T seconds from S s) or on-alert[=N] "
                         f"(the N steps after an --alert fires, default {ON_ALERT_STEPS}); got {text!r}")
    kind, a, b = match.group(1), float(match.group(2)), float(match.group(3))
    if kind == "steps":
        if a != int(a) or b != int(b) or b <= a:
            raise ValueError(f"--trace steps=A:B takes whole steps with A < B; got {text!r}")
        return TraceSpec(kind, int(a), int(b))
    if b <= 0:
        raise ValueError(f"--trace seconds=S:T takes a length T > 0; got {text!r}")
    return TraceSpec(kind, a, b)


def _torch_profiler():
    """(profile object, activity names): CPU, and CUDA only if the user's code initialised it."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities, names = [ProfilerActivity.CPU], ["cpu"]
    if torch.cuda.is_initialized():  # never torch.cuda.is_available(): that may initialise it
        activities.append(ProfilerActivity.CUDA)
        names.append("cuda")
    return profile(activities=activities, record_shapes=False, profile_memory=False, with_stack=False), names


def cap_events(trace: dict, limit: int = MAX_EVENTS) -> int:
    """Keep the earliest ``limit`` timed events (metadata events always); how many were dropped."""
    events = trace.get("traceEvents", [])
    meta = [e for e in events if e.get("ph") == "M"]
    timed = [e for e in events if e.get("ph") != "M"]
    if len(timed) <= limit:
        return 0
    timed.sort(key=lambda e: e.get("ts", 0))
    trace["traceEvents"] = meta + timed[:limit]
    return len(timed) - limit


class TraceWindow:
    """One session's trace window. ``begin()`` when the session starts, ``on_step(count, now)``
    at each step boundary (``count`` steps done), ``close()`` when the run ends, then
    ``finish(save)`` writes the trace and returns the record kept in ``meta.trace``."""

    def __init__(self, spec: TraceSpec, t0: float, wall0: float, notes: list[str],
                 make_profiler=None, clock=time.monotonic) -> None:
        self.spec, self.t0, self.wall0, self.notes = spec, t0, wall0, notes
        self.label = str(spec)  # how its notes name it (a rank's on-alert capture: its own step count is not the run's)
        self.make_profiler, self.clock = make_profiler, clock
        self.info: dict = {"spec": str(spec), "status": "not reached", "activities": [], "record_shapes": False,
                           "wall0": wall0, "steps": 0}
        self._profiler = None
        self._thread: int | None = None
        self._done = False
        self._started_at: float | None = None

    # -- on the training thread -------------------------------------------------------------
    def begin(self) -> None:
        self._thread = threading.get_ident()
        if self.spec.kind == "steps" and self.spec.start == 0:
            self._start(0, self.clock())

    def on_step(self, count: int, now: float) -> bool:
        """After a step ended; True once the window is over (the ActivityLog then stops calling).
        Never raises (the user's loop called it)."""
        self._on_step(count, now)
        return self._done

    def _on_step(self, count: int, now: float) -> None:
        if self._done:
            return
        try:
            if threading.get_ident() != self._thread:
                self._give_up("steps are reported from another thread than the session's; torch.profiler "
                              "is started and stopped only on the session's thread, so no trace was taken")
                return
            if self._profiler is None:
                due = count == self.spec.start if self.spec.kind == "steps" else now - self.t0 >= self.spec.start
                if due:
                    self._start(count, now)
                return
            traced = count - self.info["first_step"]
            if self.spec.kind == "steps":
                ended = count >= self.spec.stop
            else:
                ended = now - self._started_at >= self.spec.stop
            if ended:
                self._stop(count, now, "complete")
            elif traced >= MAX_STEPS or now - self._started_at >= MAX_S:
                self._stop(count, now, "capped")
                self.notes.append(f"gpuprof: trace window capped at {traced} steps / {fmt_unit(now - self._started_at, 's', 1)} "
                                  f"(at most {MAX_STEPS} steps or {fmt_unit(MAX_S, 's')} are traced)")
        except Exception as exc:  # noqa: BLE001 - the user's step must go on
            self._give_up(f"the trace window failed ({type(exc).__name__}: {exc}); the run went on untraced")

    def _start(self, count: int, now: float) -> None:
        t = time.perf_counter()
        try:
            profiler, activities = (self.make_profiler or _torch_profiler)()
            profiler.start()
        except Exception as exc:  # noqa: BLE001 - a trace failing to start never breaks the cell
            self._give_up(f"the trace did not start ({type(exc).__name__}: {exc}); the run went on untraced",
                          status="failed")
            return
        self._profiler = profiler
        self._started_at = now
        self.info.update(status="running", activities=activities, first_step=count, start_s=now - self.t0,
                         start_cost_s=time.perf_counter() - t)

    def _stop(self, count: int, now: float, status: str) -> None:
        t = time.perf_counter()
        self._done = True
        try:
            self._profiler.stop()
        except Exception as exc:  # noqa: BLE001
            self._profiler = None
            self._give_up(f"the trace did not stop cleanly ({type(exc).__name__}: {exc}); no trace saved",
                          status="failed")
            return
        self.info.update(status=status, end_step=count, end_s=now - self.t0, steps=count - self.info["first_step"],
                         stop_cost_s=time.perf_counter() - t)

    def _give_up(self, message: str, status: str | None = None) -> None:
        self._done = True
        if status:
            self.info["status"] = status
        self.notes.append(f"gpuprof: trace {self.label}: {message}")

    # -- when the run ends ------------------------------------------------------------------
    def close(self, steps_done: int) -> None:
        """The run ended: a window still open stops here (partial), if on the session's thread."""
        if self._profiler is None or self.info["status"] != "running":
            if self.info["status"] == "not reached":
                self.notes.append(f"gpuprof: trace {self.label}: the run ended before the window "
                                  f"({steps_done} steps reported); nothing traced")
            return
        if threading.get_ident() != self._thread:
            self._done = True
            self.info["status"] = "failed"
            self.notes.append(f"gpuprof: trace {self.label}: the run ended on another thread than the one "
                              "tracing; the profiler was left to that thread (stopping it elsewhere crashes torch)")
            self._profiler = None
            return
        self._stop(steps_done, self.clock(), "partial")
        if self.info["status"] == "partial":
            self.notes.append(f"gpuprof: trace {self.label}: the run ended inside the window; the partial window "
                              f"(steps {self.info['first_step']} to {steps_done - 1}) is kept")

    def finish(self, save) -> dict:
        """Export the trace (kept in ``self.trace``), cap it, ``save(trace) -> file name``;
        return the record kept in ``meta.trace``."""
        self.trace = None
        profiler, self._profiler = self._profiler, None
        if profiler is None or self.info["status"] not in ("complete", "partial", "capped"):
            return self.info
        t = time.perf_counter()
        fd, tmp = tempfile.mkstemp(prefix="gpuprof-trace-", suffix=".json")
        os.close(fd)
        try:
            profiler.export_chrome_trace(tmp)
            with open(tmp, encoding="utf-8") as f:
                trace = json.load(f)
        finally:
            os.unlink(tmp)
        dropped = cap_events(trace)
        if dropped:
            self.notes.append(f"gpuprof: trace {self.label}: {dropped} events past the first {MAX_EVENTS} were dropped")
        self.info.update(file=save(trace), events=len(trace.get("traceEvents", [])), truncated=bool(dropped),
                         dropped_events=dropped, base_time_ns=trace.get("baseTimeNanoseconds"),
                         export_cost_s=time.perf_counter() - t)
        if "cuda" not in self.info["activities"]:
            self.notes.append(f"gpuprof: trace {self.label}: CPU activities only (torch.cuda was not initialised "
                              "by the code, or no GPU): operator times are host times, no kernels or GPU gaps")
        self.trace = trace
        return self.info

    def phases(self) -> list[dict]:
        """The trace's ``record_function`` ranges as phases (session seconds), for the plots."""
        if not self.trace:
            return []
        from gpuprof_jupyter.core.analysis.trace_summary import annotation_spans

        spans, left_out = annotation_spans(self.trace)
        if left_out:
            self.notes.append(f"gpuprof: trace {self.label}: {left_out} record_function ranges past the first "
                              f"{len(spans)} are in the trace but not drawn as phases")
        return [{"name": name, "start_s": a - self.wall0, "end_s": b - self.wall0, "source": "record_function"}
                for name, a, b in spans]


__all__ = ["MAX_EVENTS", "MAX_S", "MAX_STEPS", "ON_ALERT_STEPS", "TraceSpec", "TraceWindow", "cap_events", "parse_trace"]
