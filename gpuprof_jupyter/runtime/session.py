"""One profiling session, the kernel's side: started and stopped once.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

Used by the ``%%gpuprofile`` magic, by ``profile()`` (context manager and decorator), by
``--tune``'s trials and by the CLI, each with a ``RunOptions`` (``runtime/run_options.py``:
the run's checked options). The sources, the sampler and the store writes live in the sampler process
(docs/architecture.md); the kernel keeps the cheap parts: step events (folded and handed
over once a second), training hooks, the trace window, the settings it saw. Observers
(the live dashboard) are told when it starts, of each row the process sends (in the link's
thread: hand over, never render) and when the experiment is saved.
"""

from __future__ import annotations

import os
import secrets
import sys
import threading
import time
import warnings
from datetime import datetime, timezone
from typing import Any, Protocol

from gpuprof_jupyter.core.fault_injection import fault_step_asked
from gpuprof_jupyter.core.finish import finish_experiment
from gpuprof_jupyter.core.protocol import Begin, End, Events, LiveTarget, LiveUpdate, timeout_s
from gpuprof_jupyter.runtime.link import SamplerGone, SamplerTimeout, cuda_visible_devices, kernel_settings_environ, sampler_link
from gpuprof_jupyter.core.sources.torch_memory import TorchMemorySource
from gpuprof_jupyter.core.torch_defaults import merge_recorded, torch_filled
from gpuprof_jupyter.core.store.atomic import write_atomic
from gpuprof_jupyter.core.store.experiment import Experiment, ExperimentMeta, RunStatus
from gpuprof_jupyter.runtime.hooks.activity import ActivityLog
from gpuprof_jupyter.runtime.hooks.alert_trace import AlertCapture
from gpuprof_jupyter.runtime.jobs.children_listener import ChildListener, hook_forks
from gpuprof_jupyter.runtime.jobs.children_merge import merge_children, save_rank_traces
from gpuprof_jupyter.runtime.record.context import run_context
from gpuprof_jupyter.runtime.hooks.environ_patch import EnvironPatch
from gpuprof_jupyter.runtime.run_options import RunOptions
from gpuprof_jupyter.runtime.hooks.oom_record import MemoryHistory, earlier_fit, is_out_of_memory, oom_context
from gpuprof_jupyter.runtime.record.settings import dataloader_settings
from gpuprof_jupyter.core.guarded import run_step
from gpuprof_jupyter.runtime.record.request_log import open_requests_note, record_requests_context
from gpuprof_jupyter.runtime.hooks.torch_hooks import TrainingHooks
from gpuprof_jupyter.runtime.hooks.trace_window import TraceWindow
from gpuprof_jupyter.runtime.record.used_settings import used_settings

BEGIN_TIMEOUT_S = 60.0  # includes a cold start of the sampler process on a loaded machine
END_TIMEOUT_S = 120.0  # Parquet and the summary of a long run

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


def _utc_iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds")


class ProfileSession:
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
        self.stuck_watch = None  # --stuck-after: a runtime.stuck_watch.StuckWatch, checked at each hand-over
        self.on_stuck = None  # called with each stuck episode once its stacks are saved (gpuprof run --on-stuck)
        self.extra_context: dict = {}  # set before start(): gpuprof run's job (core/job_identity.agent_job)

    # -- start ----------------------------------------------------------------------------
    def start(self) -> "ProfileSession":
        """Start recording. A ValueError (bad source or devices: the caller's input) propagates
        with nothing left running; any other failing step is a note and the rest goes on."""
        global _current
        with _current_lock:
            self._set_aside = _current if getattr(_current, "yields_to_sessions", False) else None
            if _current is not None and self._set_aside is None:  # a child process's hooks yield (runtime.child)
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
        if options.memory_history:  # begun with the hooks, once CUDA is initialised (runtime.oom_record)
            self.hooks.memory.history = MemoryHistory()
        self.meta = ExperimentMeta(
            id="", name=self.name or "", started_at=_utc_iso(self.wall0), interval_s=options.interval,
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

    def _close_children(self, error: str | None) -> str | None:
        """The children's last events folded, their settings, phases and errors into the run."""
        self._environ.restore()
        children = self.children
        children.close()
        try:
            error = merge_children(children, self.meta, self.activity, self.notes, error)
            if self._directory is not None:
                save_rank_traces(children, self.store, self.meta, self.notes)
        finally:
            children.remove_files()
        return error

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
        _warn_failures(meta.notes, self.notes)
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
        if self.options.trace.kind == "on-alert":  # a window after each alert (runtime.alert_trace)
            window = AlertCapture(self.options.trace, self.t0, self.wall0, self.notes, self.activity, self._save_capture,
                                  children=self.children, keep=self._keep_capture)
            self.meta.trace = window.info
            self.trace_window = window
            if self.children is not None:  # a rank asked for a capture sends it back (runtime.child_capture)
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

    def _finish_trace(self) -> None:
        """Export the window's trace into the experiment; its record_function ranges become phases."""
        if self._directory is None:
            self.trace_window.finish(lambda trace: None)
            return
        self.trace_window.finish(lambda trace: self.store.save_trace(self.meta, trace))

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

    def record_error(self, exc: BaseException | None) -> None:
        """Before ``stop()``: a run that dies of ``torch.OutOfMemoryError`` keeps what explains it
        (``context["oom"]``, runtime.oom_record; the snapshot first, while the history records)."""
        if is_out_of_memory(exc) and self.experiment is None and self.hooks is not None and os.getpid() == self._pid:
            self.meta.context["oom"] = run_step("recording the out-of-memory error", lambda: oom_context(
                exc, self.hooks.memory, self._directory), self.notes) or {"error": str(exc)}

    def _fit_for_oom(self) -> None:
        fit = earlier_fit(self.store, self.meta)
        if fit is not None:
            self.meta.context["oom"]["largest_batch"] = fit

    def _final(self, status: str, error: str | None) -> End:
        """What only the kernel knows, for the end of the experiment."""
        meta, activity = self.meta, self.activity
        events = self.handover()  # the last batch of events, up to now
        still_open = [open_requests_note(activity.requests)] + (
            self.children.open_requests_notes() if self.children is not None else [])
        self.notes.extend(n for n in still_open if n is not None and n not in self.notes)
        phases = events.phases + (self.trace_window.phases() if self.trace_window is not None else [])
        return End(
            status=status, error=error, ended_at=_utc_iso(time.time()), as_of=events.as_of,
            duration_s=time.monotonic() - self.t0, params=meta.params, phases=phases,
            user_metrics={**meta.user_metrics, **activity.user_metrics}, captured=meta.captured,
            trace=meta.trace, name=meta.name, context=meta.context, notes=list(self.notes), events=events,
        )

    def _finish(self, status: str, error: str | None) -> None:
        """The one way a run ends, whoever ends it (``stop()``, a start that failed half way).
        The sampler process finishes it (it wrote the samples). If it cannot (gone, or failing),
        it is stopped for good (killed and reaped: one owner per run) and the run is finished
        here from what it wrote, with the same code it would have used (``core/finish.py``),
        unless it did finish it and only its answer was lost. Nothing created: nothing to do."""
        if self.experiment is not None:
            return
        if self._recording_process_alive():
            try:
                self._end(status, error)
                return
            except Exception as exc:  # noqa: BLE001 - noted; finished here below
                self.notes.append(f"gpuprof: the sampler process could not finish the run ({type(exc).__name__}: {exc})")
        if self._directory is None:
            return
        link = self._link
        if link is not None and link.pid == self._sampler_pid:
            link.kill()  # never finish a run its process could still write
        saved = self._saved_by_process()
        if saved is not None:  # it did finish the run; only its answer was lost
            self.meta, self.experiment = saved.meta, saved
            saved.meta.notes[:0] = [n for n in self.notes if n not in saved.meta.notes]
            self.notes = saved.meta.notes
            return
        final = self._final(status, error)
        meta = self.meta
        final.apply_to(meta)
        meta.alerts = list(self.alerts_fired)  # those that reached the kernel before the process died
        steps = [s.as_tuple() for s in self.activity.steps]
        requests = self.activity.requests.all_tuples()
        if self.children is not None:  # the run's child processes, each step with its rank
            steps += self.children.all_steps()
            requests += self.children.all_requests()
        window = self.trace_window
        self.experiment = finish_experiment(self.store, meta, steps, self.options.checks, self.notes,
                                            trace=window.trace if window is not None else None, requests=requests)

    def _end(self, status: str, error: str | None) -> None:
        """The sampler process finishes the run (``End``) and answers with its metadata."""
        reply = self._link.request(self._final(status, error), timeout=timeout_s("END", END_TIMEOUT_S))
        meta = ExperimentMeta.from_json(reply)
        _warn_failures(meta.notes, self.notes)
        self.notes[:] = meta.notes
        meta.notes = self.notes
        self.meta = meta
        window = self.trace_window
        self.experiment = self.store.load_meta(meta, trace=window.trace if window is not None else None)

    def _recording_process_alive(self) -> bool:
        link = self._link
        return link is not None and link.starts == self._link_starts and link.alive

    def _saved_by_process(self):
        """The experiment as the sampler process saved it, when it finished it (None if not)."""
        try:
            on_disk = self.store.resolve(self.meta.id) if self.meta.id else None
        except Exception:  # noqa: BLE001 - nothing readable: finish it here
            return None
        if on_disk is None or on_disk.status in (RunStatus.RUNNING, RunStatus.CRASHED):
            return None
        return self.store.load_meta(on_disk)

    def record_loaders(self, namespace: dict) -> None:
        """Settings of the DataLoaders the run iterated, named after the ``namespace`` variables
        holding them, into the params (``--param`` wins). A loader the run did not iterate is not
        recorded. Done at stop with an empty namespace when nobody did it."""
        iterated = self.hooks.loaders if self.hooks is not None else []
        loaders = dataloader_settings(iterated, namespace)
        merge_recorded(self.meta, loaders, torch_filled(loaders))
        self._loaders_recorded = True

    def _record_used(self) -> None:
        """Loaders iterated, settings the hooks saw (autocast, scaler, ...), where steps came from."""
        if not self._loaders_recorded:
            self.record_loaders({})
        self.meta.params = {**used_settings(self.hooks), **self.meta.params}
        self.notes.extend(self.hooks.notes())
        activity, context = self.activity, self.meta.context
        unfolded = activity.unfolded_note("the run's own process")
        if unfolded:
            self.notes.append(unfolded)
        context["training_hooks"] = "installed" if self.hooks.torch_seen else "torch not imported when the run started"
        if not self.hooks.torch_seen and "torch" in sys.modules and not activity.steps:
            where = "cell" if self.cell_source is not None else "block"  # the magic names its cell's source
            context["torch_imported_late"] = where  # the diagnosis' advice (analysis.diagnosis.no_steps_advice)
            self.notes.append(f"gpuprof: torch was imported inside the profiled {where}, after profiling started, so "
                              "its optimizer and DataLoader hooks were not installed and no steps were counted; "
                              + ("import torch in an earlier cell" if where == "cell" else
                                 "import torch before the block starts"))
        context["steps_from"] = activity.steps_origin
        record_requests_context(context, activity.requests)
        if activity.steps_origin == "step()" and activity.optimizer_steps:
            context["optimizer_steps"] = len(activity.optimizer_steps)  # seen, not counted: step() wins
        memory = self.hooks.memory
        peaks = run_step("reading torch memory peaks", lambda: self._torch.final_context(memory.run_peaks), self.notes)
        if peaks:
            context.update(peaks)
        if memory.record is not None:  # the sampled step's breakdown (runtime.memory_hooks)
            context["memory"] = memory.record
        if memory.history is not None and memory.history.low is not None:  # headroom ran low (runtime.oom_record)
            context["memory_history"] = {"low_headroom": [{"rank": None, **memory.history.low}]}

    def note(self, message: str) -> None:
        """A note about the profiler's own work after the experiment was saved: saved too."""
        self.notes.append(message)
        self.save_notes()

    def save_notes(self) -> None:
        if self.experiment is not None and self._directory is not None and self._saved_notes != len(self.notes):
            self._saved_notes = len(self.notes)
            try:
                self.store.save_meta(self.meta)
            except Exception as exc:  # noqa: BLE001 - the disk itself: nowhere left to note it
                warnings.warn(f"gpuprof: saving the notes failed ({type(exc).__name__}: {exc})", RuntimeWarning,
                              stacklevel=2)

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


def _warn_failures(notes: list[str], known: list[str]) -> None:
    """The sampler process's own failed steps, said in the kernel as ``run_step`` says ours."""
    for note in notes:
        if note not in known and note.startswith("gpuprof: ") and " failed (" in note:
            warnings.warn(note, RuntimeWarning, stacklevel=4)


def _phase_dict(phase) -> dict:
    return {"name": phase.name, "start_s": phase.start_s, "end_s": phase.end_s}
