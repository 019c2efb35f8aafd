"""One profiling session: sources -> sampler -> recorder -> store, started and stopped once.

Used by the ``%%gpuprofile`` magic, by ``profile()`` (context manager and decorator) and by
the CLI. Observers (the live dashboard) are told when it starts, of each tick (in the sampler
thread: hand over, never render) and when the experiment is saved.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from datetime import datetime, timezone
from typing import Any, Protocol

from ..config import load_config
from ..metrics import METRICS
from ..sampler import Sampler, Tick
from ..sources.select import open_sources
from ..store.directory import Store
from ..store.experiment import Experiment, ExperimentMeta
from ..recording import Recorder
from .activity import ActivityLog
from .context import run_context
from .settings import dataloader_settings, jsonable
from .steps import run_step
from .torch_hooks import TrainingHooks
from .trace_window import TraceSpec, TraceWindow, parse_trace
from .used_settings import used_settings

DEFAULT_INTERVAL_S = 0.1

_current: "ProfileSession | None" = None
_current_lock = threading.Lock()


def current_session() -> "ProfileSession | None":
    return _current


class SessionObserver(Protocol):
    def started(self, session: "ProfileSession") -> None: ...
    def tick(self, tick: Tick) -> None: ...
    def finished(self, experiment: Experiment) -> None: ...


def _utc_iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds")


class ProfileSession:
    """Records one experiment. ``start()`` then ``stop(status)`` -> the saved Experiment."""

    def __init__(
        self,
        name: str | None = None,
        *,
        interval: float | None = None,
        devices: list[int] | None = None,
        source: str | None = None,
        store: Store | str | os.PathLike | None = None,
        params: dict[str, Any] | None = None,
        cell_source: str | None = None,
        observers: list[SessionObserver] | None = None,
        checks: list[str] | None = None,
        trace: "str | TraceSpec | None" = None,
    ) -> None:
        config = load_config()  # defaults for what the caller did not say (config.py)
        if interval is None:
            interval = config.interval or DEFAULT_INTERVAL_S
        if not (isinstance(interval, (int, float)) and 0.001 <= interval <= 3600):
            raise ValueError(f"interval must be between 0.001 and 3600 s, got {interval!r}")
        self.name = name
        self.interval = float(interval)
        self.devices = devices
        self.source_spec = source
        self.store = store if isinstance(store, Store) else Store(store)
        self.params = {key: jsonable(value) for key, value in (params or {}).items()}  # numpy 64 -> 64
        self.cell_source = cell_source
        self.observers = list(observers or [])
        from ..analysis.rules import parse_rules  # a malformed rule fails here, before anything starts

        self.checks = parse_rules([*config.checks, *(checks or [])])
        self.trace_spec = parse_trace(trace) if isinstance(trace, str) else trace  # ValueError: before anything starts
        self.trace_window: TraceWindow | None = None
        self.notes: list[str] = []  # the profiler's own failures and facts, saved with the experiment
        self.meta: ExperimentMeta | None = None
        self.activity: ActivityLog | None = None
        self.hooks: TrainingHooks | None = None  # optimizer/DataLoader hooks, for the run only
        self._loaders_recorded = False
        self.experiment: Experiment | None = None
        self._sampler: Sampler | None = None
        self._source_set = None
        self._directory = None
        self._writer = None
        self._saved_notes = -1

    # -- start ----------------------------------------------------------------------------
    def start(self) -> "ProfileSession":
        """Start sampling. A ValueError (bad source or devices: the caller's input) propagates
        with nothing left running; any other failing step is a note and the rest goes on."""
        global _current
        with _current_lock:
            if _current is not None:
                raise RuntimeError(
                    f"already profiling {_current.name!r}: nested profiling is not supported"
                )
            _current = self
        try:
            self._start()
        except BaseException:
            self._release()
            raise
        return self

    def _start(self) -> None:
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        self.activity = ActivityLog(self.t0)
        self.hooks = TrainingHooks(self.activity)
        self.meta = ExperimentMeta(
            id="", name=self.name or "", started_at=_utc_iso(self.wall0), interval_s=self.interval,
            source="none", notes=self.notes, params=dict(self.params),
            context={**run_context(), "cell_source": self.cell_source},
        )
        self.recorder = Recorder(self.t0, [])
        run_step("opening sources", self._open_sources, self.notes, reraise=(ValueError,))
        self._create()
        run_step("opening the sample file", self._open_writer, self.notes)
        for observer in list(self.observers):
            if run_step(f"starting {type(observer).__name__}", lambda o=observer: o.started(self) or True,
                        self.notes) is None:
                self.observers.remove(observer)
        self.recorder.add_listener(self._drain_events)
        for observer in self.observers:
            self.recorder.add_listener(observer.tick)
        run_step("installing the training hooks", self.hooks.install, self.notes)
        run_step("starting the sampler", self._start_sampler, self.notes)
        if self.trace_spec is not None:
            run_step("starting the trace window", self._start_trace, self.notes)

    def _drain_events(self, tick) -> None:
        """Each sampler tick folds the loop's buffered events (runtime/events.py), as a batch."""
        self.activity.drain()

    def _start_trace(self) -> None:
        window = TraceWindow(self.trace_spec, self.t0, self.wall0, self.notes)
        self.meta.trace = window.info  # updated in place as the window goes
        self.activity.step_listeners.append(window.on_step)
        self.trace_window = window
        window.begin()

    def _finish_trace(self) -> None:
        """Export the window's trace into the experiment; its record_function ranges become phases."""
        if self._directory is None:
            self.trace_window.finish(lambda trace: None)
            return
        self.trace_window.finish(lambda trace: self.store.save_trace(self.meta, trace))
        self.meta.phases.extend(self.trace_window.phases())

    def _open_sources(self) -> None:
        self._source_set = sources = open_sources(self.source_spec, self.devices, self.activity.busy_share)
        provenance: dict[str, dict[str, str]] = {}
        for source in sources.sources:
            for device, tags in source.provenance().items():
                provenance.setdefault(device, {}).update(tags)
        metrics = [m for m in METRICS if any(m in tags for tags in provenance.values())]
        meta = self.meta
        meta.source, meta.simulated = sources.label, sources.simulated
        meta.devices = [d.to_dict() for d in sources.devices]
        meta.provenance, meta.units = provenance, {m: METRICS[m].unit for m in metrics}
        self.notes.extend(sources.notes)
        meta.context.update(_merged_context(sources.sources))
        self.recorder = Recorder(self.t0, metrics)

    def _create(self) -> None:
        """The experiment's directory and first metadata (tried again at stop if it failed)."""
        if self._directory is None:
            self._directory = run_step("creating the experiment", lambda: self.store.create(self.meta), self.notes)
            self.name = self.meta.name

    def _open_writer(self) -> None:
        from ..store.samples_file import SampleStreamWriter, samples_schema  # pyarrow, lazily

        if self._directory is not None:
            self._writer = SampleStreamWriter(self._directory, samples_schema(self.recorder.metrics))
            self.recorder.writer = self._writer

    def _start_sampler(self) -> None:
        if self._source_set is not None:
            self._sampler = Sampler(
                self._source_set.sources, self.recorder.on_tick, self.interval,
                on_gap=self.recorder.on_gap, on_error=self.recorder.on_error,
            )
            self._sampler.start()

    # -- stop -------------------------------------------------------------------------------
    def stop(self, status: str = "ok", error: str | None = None) -> Experiment:
        """Stop sampling, save everything, return the Experiment. Never raises for the
        profiler's own failures (they are notes); the sampler and sources are closed whatever
        happens."""
        if self.experiment is not None:
            return self.experiment
        notes = self.notes
        try:
            window = self.trace_window
            if window is not None:  # first: the window ends with the run, before our own work
                run_step("closing the trace window", lambda: window.close(len(self.activity.steps)), notes)
            run_step("removing the training hooks", self.hooks.remove, notes)
            sampler = self._sampler
            if sampler is not None:
                run_step("stopping the sampler", sampler.stop, notes)
                run_step("taking the last sample", lambda: self.recorder.on_tick(sampler.sample_once()), notes)
            run_step("closing the activity log", self.activity.close, notes)
            run_step("recording the settings the run used", self._record_used, notes)
            run_step("writing the last samples", self.recorder.flush, notes)
            if self._writer is not None:
                run_step("closing the sample file", self._writer.close, notes)
            run_step("finishing the metadata", lambda: self._finish_meta(status, error), notes)
            self._create()
            if window is not None:
                run_step("saving the trace", self._finish_trace, notes)
            self._persist()
        finally:
            self._release()
            if self.experiment is None:
                self.experiment = Experiment(self.meta)
        for observer in self.observers:
            run_step(f"finishing {type(observer).__name__}", lambda o=observer: o.finished(self.experiment), notes)
        self.save_notes()  # again if an observer added a note
        return self.experiment

    def record_loaders(self, namespace: dict) -> None:
        """Settings of the DataLoaders in ``namespace`` and of those the run iterated, into the
        params (``--param`` wins). Done at stop with an empty namespace when nobody did it."""
        iterated = self.hooks.loaders if self.hooks is not None else []
        self.meta.params = {**dataloader_settings(namespace, iterated), **self.meta.params}
        self._loaders_recorded = True

    def _record_used(self) -> None:
        """Loaders iterated, settings the hooks saw (autocast, scaler, ...), where steps came from."""
        if not self._loaders_recorded:
            self.record_loaders({})
        self.meta.params = {**used_settings(self.hooks), **self.meta.params}
        self.notes.extend(self.hooks.notes())
        activity, context = self.activity, self.meta.context
        context["training_hooks"] = "installed" if self.hooks.torch_seen else "torch not imported when the run started"
        context["steps_from"] = activity.steps_origin
        if activity.steps_origin == "step()" and activity.optimizer_steps:
            context["optimizer_steps"] = len(activity.optimizer_steps)  # seen, not counted: step() wins

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

    def _persist(self) -> None:
        """Parquet, steps, summary, rule results, metadata. A failing step is noted, never fatal:
        the samples already on disk (the stream) and the metadata are kept whatever happens."""
        from ..analysis.summary import summary_of
        from ..store.samples_file import stream_to_parquet

        notes = self.notes
        if self._directory is None:  # the store could not be written: the experiment lives in memory
            self.experiment = Experiment(self.meta)
            return
        window = self.trace_window
        experiment = self.store.load_meta(self.meta, trace=window.trace if window is not None else None)
        if self._writer is not None:
            run_step("converting samples to Parquet (they stay in samples.arrows)",
                     lambda: stream_to_parquet(self._directory, self._writer.schema), notes)
        run_step("saving steps", lambda: self.store.save_steps(self.meta, _steps_table(self.activity)), notes)
        run_step("summarising", lambda: summary_of(experiment), notes)  # computed once, kept in self.meta
        if self.checks:
            from ..analysis.rules import evaluate_rules

            run_step("evaluating rules", lambda: setattr(
                self.meta, "checks", [r.to_dict() for r in evaluate_rules(experiment, self.checks)]), notes)
        if run_step("saving the metadata", lambda: self.store.save_meta(self.meta) or True, notes) is None:
            run_step("saving the metadata again", lambda: self.store.save_meta(self.meta), notes)
        self._saved_notes = len(notes)
        self.experiment = experiment

    def _finish_meta(self, status: str, error: str | None) -> None:
        meta, end = self.meta, time.time()
        meta.status, meta.error = status, error
        meta.ended_at = _utc_iso(end)
        meta.duration_s = time.monotonic() - self.t0
        meta.gaps = [[g.start - self.t0, g.end - self.t0] for g in self.recorder.gaps]
        meta.phases = [
            {"name": p.name, "start_s": p.start_s, "end_s": p.end_s} for p in self.activity.phases
        ]
        meta.user_metrics.update(self.activity.user_metrics)
        notes = self.notes
        for source in self._source_set.sources if self._source_set is not None else ():
            notes.extend(n for n in source.notes() if n not in notes)
            final_context = getattr(source, "final_context", None)  # optional: facts known at the end
            if final_context is not None:
                try:
                    meta.context.update(final_context())
                except Exception as exc:  # never lose the experiment over a late fact
                    notes.append(f"{source.name}: could not read final context ({type(exc).__name__}: {exc})")
        notes.extend(e for e in self.recorder.errors if e not in notes)
        for gap in meta.gaps:
            notes.append(f"sampler paused {gap[1] - gap[0]:.1f} s at t={gap[0]:.1f} s (not interpolated)")

    def _release(self) -> None:
        """Whatever failed before: no sampler thread, no open source, no current session."""
        global _current
        try:
            if self.hooks is not None:
                self.hooks.remove()  # no hook outlives its run, whatever failed
        except Exception as exc:  # noqa: BLE001 - noted; the rest of the release goes on
            self.notes.append(f"gpuprof: removing the training hooks failed ({type(exc).__name__}: {exc})")
        try:
            if self._sampler is not None:
                self._sampler.stop()
        finally:
            if self._source_set is not None:
                for source in self._source_set.sources:
                    try:
                        source.close()
                    except Exception:
                        pass
            with _current_lock:
                if _current is self:
                    _current = None


def _merged_context(sources) -> dict:
    merged: dict = {}
    for source in sources:
        try:
            merged.update(source.context())
        except Exception:
            pass
    return merged


def _steps_table(activity: ActivityLog):
    import pyarrow as pa

    steps = activity.steps
    return pa.table({
        "t_end_s": pa.array([s.t_end_s for s in steps], pa.float64()),
        "duration_s": pa.array([s.duration_s for s in steps], pa.float64()),
        "wait_s": pa.array([s.wait_s for s in steps], pa.float64()),
        "n_samples": pa.array([s.n_samples for s in steps], pa.float64()),
        "n_batches": pa.array([s.n_batches for s in steps], pa.int64()),
        "skipped": pa.array([s.skipped for s in steps], pa.bool_()),
    })
