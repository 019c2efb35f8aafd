"""``--trace on-alert``: the steps just after a live alert, traced by torch.profiler.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

The sampler process judges the ``--alert`` rules (``core/analysis/live_alerts.py``) and sends
the alerts it fires with its live update, once a second; the session hands each one to
``AlertCapture.alert`` (on the link's thread). A capture is then due: from the next step
boundary on the session's thread, the bounded window of ``--trace steps=A:B``
(``trace_window.TraceWindow``, its step, time and event caps included) traces the next
``spec.stop`` steps (5 unless ``on-alert=N``). When it closes, its trace is exported at that
boundary and saved into the experiment (``trace-alert<N>.json.gz``), with the alert that
caused it, so the alert links to its trace and ``gpuprof trace`` merges it.

Limits, so that a rule that keeps firing never traces the whole run:
* one capture at a time (an alert while one runs is counted, not queued);
* at most one capture per alert rule (its kind) per ``INTERVAL_S`` of run time;
* no new capture once the captures saved reach ``MAX_BYTES`` on disk in this run.

Between captures no step listener is installed, so a step costs what it costs untraced.

Under ``gpuprof run`` (or a cell whose child processes train) the process that holds the run
trains nothing: ``children`` (``runtime/jobs/children_listener.ChildListener``) asks the offending rank
(``Alert.rank``; the only training child when the alert names none) for the capture instead.
That child opens its own ``AlertCapture`` (without limits: the run's are judged here)
and sends the window back when it closes (``captured``).
"""

from __future__ import annotations

import threading
import time

from gpuprof_jupyter.runtime.hooks.trace_window import TraceSpec, TraceWindow
from gpuprof_jupyter.core.format import fmt_bytes, fmt_unit

INTERVAL_S = 600.0  # one capture per alert rule per this many seconds of run time
MAX_BYTES = 256 * 1024**2  # captures saved per run, on disk (gzipped JSON); then no new one
CAPTURE_FILE = "trace-alert{}.json.gz"  # the k-th capture's file in the experiment's folder
# what the run's trace record takes from its first capture (the summary and `gpuprof trace` read them)
_FIRST = ("status", "activities", "first_step", "end_step", "start_s", "end_s", "steps", "file", "events",
          "truncated", "dropped_events", "base_time_ns", "start_cost_s", "stop_cost_s", "export_cost_s", "rank")


class AlertCapture:
    """One session's ``--trace on-alert``. ``begin()`` when the session starts (on its thread),
    ``alert(record)`` from any thread for each alert fired, ``close(steps_done)`` when the run
    ends. ``info`` is the run's ``meta.trace``, updated in place; ``info["captures"]`` lists the
    windows taken, each with the alert that caused it.

    ``save(trace, name) -> (file name or None, bytes on disk)``; ``make_profiler``: as
    TraceWindow's (tests give a fake)."""

    def __init__(self, spec: TraceSpec, t0: float, wall0: float, notes: list[str], activity, save,
                 make_profiler=None, clock=time.monotonic, interval_s: float = INTERVAL_S,
                 max_bytes: int = MAX_BYTES, children=None, keep=None, on_capture=None) -> None:
        self.spec, self.t0, self.wall0, self.notes = spec, t0, wall0, notes
        self.activity, self.save, self.make_profiler, self.clock = activity, save, make_profiler, clock
        self.interval_s, self.max_bytes = interval_s, max_bytes
        # children: the run's ChildListener (ranks asked for captures); keep(path, name) -> (file
        # name or None, bytes): a rank's capture file into the experiment; on_capture(record): in
        # a child, each window saved (sent to the run)
        self.children, self.keep, self.on_capture = children, keep, on_capture
        self._asked: dict | None = None  # the rank asked for the capture now due: {"rank", "t_s", "name"}
        self.info: dict = {"spec": str(spec), "trigger": "alert", "status": "no alert", "activities": [],
                           "record_shapes": False, "wall0": wall0, "steps": 0, "captures": []}
        self._phases: list[dict] = []  # the captures' record_function ranges, as phases
        self.saved_bytes = 0
        self.skipped: dict[str, int] = {}  # why an alert was not traced -> how many
        self._lock = threading.Lock()
        self._due: dict | None = None  # the alert waiting for the next step boundary
        self._window: TraceWindow | None = None
        self._busy = False  # a capture is due or running
        self._last: dict[str, float] = {}  # rule -> run time of its last capture
        self._thread: int | None = None

    def begin(self, thread: int | None = None) -> None:
        """On the thread that trains (or name it: ``thread``), where torch.profiler may start."""
        self._thread = thread or threading.get_ident()

    # -- the link's thread ------------------------------------------------------------------
    def alert(self, record: dict) -> bool:
        """An alert fired (``live_alerts.Alert.to_dict()``); True when a capture of it is now due."""
        rule, t_s = record.get("rule", "?"), float(record.get("t_s") or 0.0)
        with self._lock:
            last = self._last.get(rule)
            if self._busy:
                why = "another capture was running"
            elif self.saved_bytes >= self.max_bytes:
                why = f"the run's captures reached {fmt_bytes(self.max_bytes, 0)}"
            elif last is not None and t_s - last < self.interval_s:
                why = f"the same rule was traced less than {fmt_unit(self.interval_s / 60, 'min')} before"
            else:
                self._busy, self._due, self._last[rule] = True, dict(record), t_s
                why = None
            if why is not None:
                self.skipped[why] = self.skipped.get(why, 0) + 1
                return False
        if self.children is not None and (record.get("rank") is not None
                                          or (not self.activity.reported and self.children.training())):
            return self._ask_rank(record)
        self.activity.add_step_listener(self.on_step)
        return True

    def _ask_rank(self, record: dict) -> bool:
        """A child process trains: ask the offending rank (or the only one) for the capture."""
        name = CAPTURE_FILE.format(len(self.info["captures"]) + 1)
        self._asked = {"rank": record.get("rank"), "t_s": record.get("t_s"), "name": name}  # before it can answer
        rank, why = self.children.request_trace(record.get("rank"), int(self.spec.stop), name, self._alert_of(record))
        if why is not None:
            self._asked = None
            with self._lock:
                self.skipped[why] = self.skipped.get(why, 0) + 1
            self._free()
            return False
        self._asked["rank"] = rank
        return True

    def captured(self, rank: int, window: dict, path: str | None) -> None:
        """A rank's capture came back (the children's reader thread): its file into the
        experiment (``keep``), its record into ``info``; the next alert may be traced."""
        record, asked = dict(window), self._asked or {}
        answers = asked.get("rank") == rank  # else a late answer to a capture given up: kept, under its own name
        name = asked["name"] if answers else f"trace-alert-rank{rank}-{len(self.info['captures']) + 1}.json.gz"
        record["file"], record["bytes"] = self.keep(path, name) if path else (None, 0)
        record["rank"] = rank
        if answers:
            self._asked = None
        self._record(record, free=answers)

    # -- the training thread -----------------------------------------------------------------
    def on_step(self, count: int, now: float) -> bool:
        """A step ended (``count`` done): open the due window here, or feed the open one. True
        once the capture is over (the ActivityLog then stops calling). Never raises."""
        try:
            if self._window is None:
                return self._open(count, now)
            if self._window.on_step(count, now):
                self._saved(self._window)
                return True
            return False
        except Exception as exc:  # noqa: BLE001 - the user's step goes on
            self.notes.append(f"gpuprof: --trace {self.spec}: the capture failed ({type(exc).__name__}: {exc})")
            self._window = None
            self._free()
            return True

    def _open(self, count: int, now: float) -> bool:
        if threading.get_ident() != self._thread:
            self.notes.append(f"gpuprof: --trace {self.spec}: steps are reported from another thread than the "
                              "session's; torch.profiler runs only on the session's thread, so no capture was taken")
            self._free()
            return True
        window = TraceWindow(TraceSpec("steps", count, count + int(self.spec.stop)), self.t0, self.wall0,
                             self.notes, make_profiler=self.make_profiler, clock=self.clock)
        window.info["alert"] = self._alert_of(self._due)
        if self.on_capture is not None:  # a rank counts its steps from when it was asked: the run renumbers them
            window.label = f"{self.spec} after {self._due.get('rule')}"
        self._window = window
        window.begin()
        if window.on_step(count, now):  # it failed to start (its note says why)
            self._window = None
            if not self.info["captures"]:
                self.info["status"] = "failed"
            self._free()
            return True
        return False

    @staticmethod
    def _alert_of(record: dict) -> dict:
        """What a capture keeps of its alert."""
        return {k: record.get(k) for k in ("rule", "t_s", "span", "evidence", "rank") if k in record}

    def _free(self) -> None:
        with self._lock:
            self._busy, self._due = False, None

    def _saved(self, window: TraceWindow) -> None:
        """The window closed: export and save it, record it in ``info``."""
        name = CAPTURE_FILE.format(len(self.info["captures"]) + 1)
        sizes = []

        def save(trace: dict):
            file, size = self.save(trace, name)
            sizes.append(size)
            return file

        record = dict(window.finish(save))
        self._phases += window.phases()
        window.trace = None  # saved: the memory goes back (the experiment reads it from its file)
        record["window"], record["bytes"] = record.pop("spec"), sum(sizes)
        self._window = None
        if self.on_capture is not None:  # a child: the run keeps it
            self.on_capture(record)
        self._record(record)

    def _record(self, record: dict, free: bool = True) -> None:
        """A capture taken (here or by a rank): into ``info``; the next alert may be traced (``free``)."""
        self.info["captures"].append(record)
        if len(self.info["captures"]) == 1:
            self.info.update({k: record[k] for k in _FIRST if k in record})
            self.info["alert"] = record.get("alert")
        with self._lock:
            self.saved_bytes += record["bytes"]
        if free:
            self._free()

    # -- when the run ends ------------------------------------------------------------------
    def close(self, steps_done: int) -> None:
        """The run ended: a capture still open is kept as partial; the alerts not traced, said."""
        window = self._window
        if window is not None and window.info["status"] == "running":
            window.close(steps_done)
            if window.info["status"] == "partial":
                self._saved(window)
        elif window is None and self._busy and self._asked is None:
            self.notes.append(f"gpuprof: --trace {self.spec}: an alert fired but the run ended before the next step; "
                              "nothing traced")
        if self.skipped:
            reasons = "; ".join(f"{n} because {why}" for why, n in self.skipped.items())
            self.notes.append(f"gpuprof: --trace {self.spec}: {sum(self.skipped.values())} alert(s) not traced: "
                              f"{reasons}")

    trace = None  # as TraceWindow's, which the session reads: captures are on disk already

    def finish(self, save) -> dict:
        """As ``TraceWindow.finish``: each capture was saved when it closed (a rank's, at the
        latest when the children's channel closed, before this)."""
        if self._asked is not None:
            self.notes.append(f"gpuprof: --trace {self.spec}: rank {self._asked['rank']} was asked for a trace after the "
                              f"alert at t={fmt_unit(float(self._asked['t_s'] or 0), 's', 1)}; none came back before the run ended (it "
                              "made no more steps, or ended without saying goodbye)")
            self._asked = None
        return self.info

    def phases(self) -> list[dict]:
        """Every capture's ``record_function`` ranges as phases (taken when each was saved)."""
        return list(self._phases)


__all__ = ["AlertCapture", "CAPTURE_FILE", "INTERVAL_S", "MAX_BYTES"]
