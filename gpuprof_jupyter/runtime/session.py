"""One profiling session, the kernel's side: started and stopped once.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

Used by the ``%%gpuprofile`` magic, by ``profile()`` (context manager and decorator), by
``--tune``'s trials and by the CLI, each with a ``RunOptions`` (``runtime/run_options.py``:
the run's checked options). The sources, the sampler and the store writes live in the sampler process
(docs/architecture.md); the kernel keeps the cheap parts: step events (folded and handed
over once a second), training hooks, the trace window, the settings it saw. Observers
(the live dashboard) are told when it starts, of each row the process sends (in the link's
thread: hand over, never render) and when the experiment is saved. Here: its state, its
start, the hand-overs while it runs, and ``stop``; what happens at the end (finishing,
saving, notes) is ``session_end.SessionEnding``'s.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from typing import Any, Protocol

from gpuprof_jupyter.core.fault_injection import fault_step_asked
from gpuprof_jupyter.core.protocol import Begin, Events, LiveTarget, LiveUpdate, timeout_s
from gpuprof_jupyter.runtime.link import SamplerGone, SamplerTimeout, cuda_visible_devices, kernel_settings_environ, sampler_link
from gpuprof_jupyter.core.sources.torch_memory import TorchMemorySource
from gpuprof_jupyter.core.store.atomic import write_atomic
from gpuprof_jupyter.core.store.experiment import Experiment, ExperimentMeta, RunStatus
from gpuprof_jupyter.runtime.hooks.activity import ActivityLog
from gpuprof_jupyter.runtime.hooks.alert_trace import AlertCapture
from gpuprof_jupyter.runtime.jobs.children_listener import ChildListener, hook_forks
from gpuprof_jupyter.runtime.record.context import run_context
from gpuprof_jupyter.runtime.hooks.environ_patch import EnvironPatch
from gpuprof_jupyter.runtime.run_options import RunOptions
from gpuprof_jupyter.runtime.session_end import SessionEnding, utc_iso, warn_failures
from gpuprof_jupyter.runtime.hooks.oom_record import MemoryHistory
from gpuprof_jupyter.core.guarded import run_step
from gpuprof_jupyter.runtime.hooks.torch_hooks import TrainingHooks
from gpuprof_jupyter.runtime.hooks.trace_window import TraceWindow

BEGIN_TIMEOUT_S = 60.0  # includes a cold start of the sampler process on a loaded machine

_current: "ProfileSession | None" = None
_current_lock = threading.Lock()


def current_session() -> "ProfileSession | None":
    return _current


class SessionObserver(Protocol):
    """``live`` is called in the link's thread with each ``LiveUpdate`` (once a second): hand
    over only. An observer with ``live_plots = True`` (the live view) is going to name its plots'
    sources (``show_live_plots``), so the sampler process keeps their rows until it does."""

    def started(self, session: "ProfileSession") -> None: ...
    def live(self, update: LiveUpdate) -> None: ...
    def finished(self, experiment: Experiment) -> None: ...


class ProfileSession(SessionEnding):
    """Records one experiment. ``start()`` then ``stop(status)`` -> the saved Experiment.

    ``options``: a ``RunOptions``; or the experiment's name, with the options as keywords
    (``ProfileSession("train", source="sim")``: ``RunOptions.resolve``). A bad option raises
    ValueError here, before anything starts."""

    def __init__(self, options: "RunOptions | str | None" = None, *, cell_source: str | None = None,
                 observers: list[SessionObserver] | None = None, child_environ: bool = True, **fields: Any) -> None:
        if not isinstance(options, RunOptions):
            options = RunOptions.resolve(options, **fields)  # resolved here, in the kernel's cwd
        elif fields:
            raise TypeError(f"ProfileSession takes a RunOptions or keywords, not both: {', '.join(fields)}")
        self.options = options
        self.name = options.name
        self.store = options.store
        self.cell_source = cell_source
        self.observers = list(observers or [])
        self.alerts_fired: list[dict] = []  # as they arrive (analysis.live_alerts.Alert dicts), for the header
        self.trace_window: TraceWindow | AlertCapture | None = None  # --trace (on-alert: AlertCapture)
        self.notes: list[str] = []  # the profiler's own failures and facts, saved with the experiment
        self.meta: ExperimentMeta | None = None
        self.activity: ActivityLog | None = None
        self.hooks: TrainingHooks | None = None  # optimizer/DataLoader hooks, for the run only
        self._loaders_recorded = False
        self.experiment: Experiment | None = None
        self.rows_seen = 0
        self._link = None
        self._link_starts = 0
        self._sampler_pid: int | None = None  # the process recording this run
        self._token: str | None = None  # the run's name in the sampler process (Begin.token)
        self._steps_sent = 0
        self._failed_handovers: set[str] = set()  # parts of the hand-over that failed (noted once each)
        self._torch = TorchMemorySource()  # read in the kernel: torch's allocator is ours
        self._directory = None
        self._saved_notes = -1
        # child processes of the run report over a channel (runtime/jobs/children_listener.py); with
        # child_environ it is named in os.environ while the run lasts (a cell's spawned children)
        self.children: ChildListener | None = None
        self.child_environ = child_environ
        self._environ = EnvironPatch()  # the children's channel, named while the run lasts
        self._set_aside = None  # a child process's run, current again when this session ends
        self._pid = os.getpid()  # a fork leaving the profiled block (sys.exit) must not end our run
        self.stuck_watch = None  # --stuck-after: a runtime.jobs.stuck_watch.StuckWatch, checked at each hand-over
        self.on_stuck = None  # called with each stuck episode once its stacks are saved (gpuprof run --on-stuck)
        self.extra_context: dict = {}  # set before start(): gpuprof run's job (core/job_identity.agent_job)

    # -- start ----------------------------------------------------------------------------
    def start(self) -> "ProfileSession":
        """Start recording. A ValueError (bad source or devices: the caller's input) propagates
        with nothing left running; any other failing step is a note and the rest goes on."""
        global _current
        with _current_lock:
            self._set_aside = _current if getattr(_current, "yields_to_sessions", False) else None
            if _current is not None and self._set_aside is None:  # a child process's hooks yield (runtime.jobs.child)
                raise RuntimeError(
                    f"already profiling {_current.name!r}: nested profiling is not supported"
                )
            _current = self
        try:
            self._start()
        except BaseException:
            try:
                if self.meta is not None:  # whatever began recording ends here, as an error
                    self._finish(RunStatus.ERROR, "the run did not start")
            finally:
                self._release()
            raise
        return self

    def _start(self) -> None:
        options = self.options
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        self.activity = ActivityLog(self.t0)
        self.hooks = TrainingHooks(self.activity)
        if options.memory_history:  # begun with the hooks, once CUDA is initialised (runtime.hooks.oom_record)
            self.hooks.memory.history = MemoryHistory()
        self.meta = ExperimentMeta(
            id="", name=self.name or "", started_at=utc_iso(self.wall0), interval_s=options.interval,
            source="none", notes=self.notes, params=dict(options.params),
            context={**run_context(), "cell_source": self.cell_source, "kernel_pid": os.getpid(),
                     "params_given": sorted(options.params),  # set by the user, not seen by the hooks
                     **self.extra_context},
        )
        if run_step("starting the sampler process", lambda: self._begin() or True, self.notes,
                    reraise=(ValueError,)) is None:  # no samples; the run is still saved, with the note
            self._directory = run_step("creating the experiment here", lambda: self.store.create(self.meta), self.notes)
        for observer in list(self.observers):
            if run_step(f"starting {type(observer).__name__}", lambda o=observer: o.started(self) or True,
                        self.notes) is None:
                self.observers.remove(observer)
        if self.hooks.memory.history is not None:  # its low-headroom snapshot goes with the run
            self.hooks.memory.history.directory = self._directory
        run_step("installing the training hooks", self.hooks.install, self.notes)
        run_step("listening for child processes", self._listen_to_children, self.notes)
        if options.stuck_after != 0:
            from gpuprof_jupyter.runtime.jobs.stuck_watch import StuckWatch  # its analysis: only for a run

            self.stuck_watch = StuckWatch(self.t0, self.activity, self.children, options.stuck_after,
                                          self._save_stacks, self._said_stuck, self.notes,
                                          own="the profiled cell" if self.child_environ and self.cell_source is not None
                                          else "the profiled process")
        if self._link is not None:
            self._link.on_live, self._link.on_gone = self._on_live, self._on_gone
            self._link.handover = self.handover
            self._link.hand_over_soon()  # its thread, idle between runs (no timer), starts the run's period
            self._link.on_handover_failed = self._handover_failed
            if self.children is not None:  # a child's steps go over as they arrive
                self.children.on_steps = self._link.hand_over_soon
        if options.trace is not None:
            run_step("starting the trace window", self._start_trace, self.notes)

    def _listen_to_children(self) -> None:
        self.children = ChildListener(self.t0, self.wall0).start()
        if self.child_environ:
            hook_forks()
            self._environ.set(self.children.environ())

    def _begin(self) -> None:
        """Ask the sampler process to open the sources, create the experiment and sample."""
        link, options = sampler_link(), self.options
        begin = Begin(
            token=secrets.token_hex(8), t0=self.t0, options=options.replace(store=os.path.abspath(self.store.root)),
            meta=self.meta.to_json(), cwd=os.getcwd(), environ=kernel_settings_environ(),
            cuda_visible_devices=cuda_visible_devices(), fail_step=fault_step_asked(),
            live=any(getattr(observer, "live_plots", False) for observer in self.observers),
        )
        try:  # a bad source or devices: the caller's ValueError, raised as such
            reply = link.request(begin, timeout=timeout_s("BEGIN", BEGIN_TIMEOUT_S))
        except SamplerTimeout:  # it must not record on without us: told, or killed
            killed = link.cancel(begin.token)
            if killed is not None:
                self._remove_orphans(killed)
            raise
        self._link, self._link_starts, self._sampler_pid, self._token = link, link.starts, link.pid, begin.token
        meta = ExperimentMeta.from_json(reply)
        warn_failures(meta.notes, self.notes)
        self.notes.extend(n for n in meta.notes if n not in self.notes)
        meta.notes = self.notes
        self.meta, self.name = meta, meta.name
        if meta.id:
            self._directory = self.store.directory(meta)

    def _remove_orphans(self, pid: int) -> None:
        """Runs the killed process ``pid`` had created and never finished: the begin that made
        them was given up, and this kernel keeps its own record of the run."""
        for meta in self.store.list():
            if meta.pid == pid and meta.status in (RunStatus.RUNNING, RunStatus.CRASHED):
                self.store.remove(meta)

    def handover(self) -> Events:
        """The link's thread, once a second: the events folded since the last call. Each part is
        taken on its own (``_taken``): one that fails is a note, and the others go."""
        as_of = time.monotonic()  # every event up to now is in the buffer: drained below
        activity, children, taken = self.activity, self.children, self._taken
        if children is not None:  # children's events come up to a send interval late
            as_of = taken("the children's progress", lambda: children.covered(as_of), as_of)
        transitions = taken("the busy and wait times", activity.take_transitions, [])
        new_steps = taken("the run's steps", self._new_steps, [])
        reported = activity.reported
        if children is not None:  # the run's child processes (runtime/jobs/children_listener.py): their steps carry the rank
            new_steps += taken("the children's steps", children.new_steps, [])
            child_transitions = taken("the children's busy and wait times", children.take_transitions, [])
            if not reported:
                transitions = child_transitions
            reported = reported or children.reported
        hooks = self.hooks
        step_peaks = taken("the steps' memory peaks", hooks.memory.take_peaks, None) if hooks is not None else None
        new_requests = taken("the run's requests", activity.take_requests, [])
        if children is not None:
            new_requests += taken("the children's requests", children.new_requests, [])
        torch_memory = taken("torch's memory", lambda: self._torch.read(step_peaks), None)  # {} unless CUDA is in use
        if self.stuck_watch is not None:  # on the steps just folded: no wake-up of its own
            taken("the stuck watch", self.stuck_watch.check, None)
        return Events(as_of=as_of, transitions=transitions, steps=new_steps, reported=reported,
                      phases=[_phase_dict(p) for p in activity.phases], torch=torch_memory or None,
                      requests=new_requests)

    def _new_steps(self) -> list[tuple]:
        steps = self.activity.steps
        new_steps = [s.as_tuple() for s in steps[self._steps_sent:]]
        self._steps_sent = len(steps)  # once they are all taken
        return new_steps

    def _taken(self, what: str, take, empty):
        """``take()``, or ``empty`` and one note (the first time ``what`` fails) when it raises:
        what it had not marked as handed over is taken at the next hand-over."""
        try:
            return take()
        except Exception as exc:  # noqa: BLE001 - one failing part never costs the hand-over its others
            self._handover_failed(exc, what)
            return empty

    def _handover_failed(self, exc: BaseException, what: str = "the run's events") -> None:
        """A note, once per part, when handing ``what`` to the sampler process failed."""
        if what not in self._failed_handovers:
            self._failed_handovers.add(what)
            self.notes.append(f"gpuprof: handing {what} to the sampler process failed ({type(exc).__name__}: {exc}); "
                              "the rest was handed over, and it is tried again at each hand-over")

    def show_live_plots(self, sources: dict[str, str], spec, recent_rows: int, history_refresh_s: float) -> None:
        """The live view's plots are on the page: from now on the sampler process prepares
        their changes (``LiveTarget``; spec: ``core.plots.spec.PlotSpec``). A process already
        gone is the run's note (``_on_gone``), not the view's failure."""
        if self._link is not None and self._token is not None:
            try:
                self._link.tell(LiveTarget(self._token, sources, spec, recent_rows, history_refresh_s))
            except SamplerGone:
                pass

    def _on_live(self, update: LiveUpdate) -> None:
        """The link's thread: the sampler process's live update, for the observers (hand over only)."""
        self.rows_seen += sum(update.rows.values())
        self.alerts_fired.extend(update.alerts)
        window = self.trace_window
        if isinstance(window, AlertCapture):  # --trace on-alert: the next steps are traced
            for alert in update.alerts:
                run_step("opening a trace window on alert", lambda a=alert: window.alert(a), self.notes)
        for observer in self.observers:
            live = getattr(observer, "live", None)
            if live is not None:
                live(update)

    def _save_stacks(self, name: str, text: str) -> str | None:
        """A stuck episode's stacks file, beside the samples (None: no experiment directory)."""
        if self._directory is None:
            return None
        write_atomic(self._directory / name, lambda f: f.write(text.encode("utf-8")))
        return name

    def _said_stuck(self, record: dict) -> None:
        """A stuck episode (the watch's thread): kept in the run's context, a live alert for the
        header (``alerts_fired``), then the caller's ``on_stuck`` (gpuprof run prints it, may stop)."""
        from gpuprof_jupyter.core.analysis.live_alerts import Alert  # numpy: only when it happens
        from gpuprof_jupyter.core.analysis.stuck import stuck_message

        self.meta.context["stuck"] = list(self.stuck_watch.records)
        message = stuck_message(record)
        files = ", ".join(record["stacks"].values())
        self.alerts_fired.append(Alert("stuck", record["t_s"], "stuck", None, record["for_s"], message,
                                       f"stacks saved: {files}" if files else None).to_dict())
        if self.on_stuck is not None:
            self.on_stuck(record)

    def _on_gone(self, why: str) -> None:
        if not any(why in n for n in self.notes):
            self.notes.append(f"gpuprof: {why}; the samples written until then are kept")

    def _start_trace(self) -> None:
        if self.options.trace.kind == "on-alert":  # a window after each alert (runtime.hooks.alert_trace)
            window = AlertCapture(self.options.trace, self.t0, self.wall0, self.notes, self.activity, self._save_capture,
                                  children=self.children, keep=self._keep_capture)
            self.meta.trace = window.info
            self.trace_window = window
            if self.children is not None:  # a rank asked for a capture sends it back (runtime.jobs.child_capture)
                self.children.on_capture = window.captured
            window.begin()
            return
        window = TraceWindow(self.options.trace, self.t0, self.wall0, self.notes)
        self.meta.trace = window.info  # updated in place as the window goes
        self.activity.step_listeners.append(window.on_step)
        self.trace_window = window
        window.begin()

    def _save_capture(self, trace: dict, name: str) -> tuple[str | None, int]:
        """An alert's capture into the experiment's folder: (file name, bytes on disk)."""
        if self._directory is None:
            return None, 0
        name = self.store.save_trace(self.meta, trace, name)
        return name, (self.store.directory(self.meta) / name).stat().st_size

    def _keep_capture(self, path: str, name: str) -> tuple[str | None, int]:
        """A rank's capture file (beside the children's socket) into the experiment's folder."""
        if self._directory is None:
            return None, 0
        import shutil

        target = self.store.directory(self.meta) / name
        shutil.move(path, target)
        return name, target.stat().st_size

    # -- stop -------------------------------------------------------------------------------
    def stop(self, status: str = RunStatus.OK, error: str | None = None) -> Experiment:
        """Stop recording, save everything, return the Experiment. Never raises for the
        profiler's own failures (they are notes); nothing of the run keeps running."""
        if self.experiment is not None:
            return self.experiment
        if os.getpid() != self._pid:  # a fork of the profiled process: the run, its link and files are the parent's
            return Experiment(self.meta)
        notes = self.notes
        try:
            if self._link is not None:
                self._link.handover = None  # the last batch goes with ``end``
            if self.stuck_watch is not None:  # an episode being saved is kept whole
                run_step("finishing the stuck watch", self.stuck_watch.close, notes)
            window = self.trace_window
            if window is not None:  # first: the window ends with the run, before our own work
                run_step("closing the trace window", lambda: window.close(len(self.activity.steps)), notes)
            run_step("removing the training hooks", self.hooks.remove, notes)
            run_step("closing the activity log", self.activity.close, notes)
            run_step("recording the settings the run used", self._record_used, notes)
            if self.children is not None:
                error = run_step("closing the child processes' channel", lambda: self._close_children(error), notes) or error
            if window is not None:
                run_step("saving the trace", self._finish_trace, notes)
            if isinstance(self.meta.context.get("oom"), dict):  # the largest batch for its explanation
                run_step("fitting the largest batch over earlier runs", self._fit_for_oom, notes)
            run_step("finishing the experiment", lambda: self._finish(status, error), notes)
        finally:
            try:
                self._finish(status, error)  # when the step itself failed: the run still ends, the same way
            except Exception as exc:  # noqa: BLE001 - noted; nothing of the run keeps running
                notes.append(f"gpuprof: finishing the experiment failed ({type(exc).__name__}: {exc})")
            finally:
                self._release()
                if self.experiment is None:
                    self.experiment = Experiment(self.meta)
        for observer in self.observers:
            run_step(f"finishing {type(observer).__name__}", lambda o=observer: o.finished(self.experiment), notes)
        self.save_notes()  # again if an observer added a note
        return self.experiment

    def _release(self) -> None:
        """Whatever failed before: no hook, no link callback into this session, no current session."""
        global _current
        self._environ.restore()
        if self.children is not None and not self.children.closed:  # a failed start: nothing to wait for
            run_step("closing the child processes' channel", lambda: self.children.close(timeout=0), self.notes)
        if self.children is not None:
            self.children.remove_files()
        try:
            if self.hooks is not None:
                self.hooks.remove()  # no hook outlives its run, whatever failed
        except Exception as exc:  # noqa: BLE001 - noted; the rest of the release goes on
            self.notes.append(f"gpuprof: removing the training hooks failed ({type(exc).__name__}: {exc})")
        link = self._link
        if link is not None and link.handover == self.handover:
            link.handover = link.on_live = link.on_gone = link.on_handover_failed = None
        with _current_lock:
            if _current is self:
                _current = self._set_aside


def _phase_dict(phase) -> dict:
    return {"name": phase.name, "start_s": phase.start_s, "end_s": phase.end_s}
