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
        self.params = dict(params or {})
        self.cell_source = cell_source
        self.observers = list(observers or [])
        from ..analysis.rules import parse_rules  # a malformed rule fails here, before anything starts

        self.checks = parse_rules([*config.checks, *(checks or [])])
        self.meta: ExperimentMeta | None = None
        self.activity: ActivityLog | None = None
        self.experiment: Experiment | None = None
        self._sampler: Sampler | None = None
        self._source_set = None

    # -- start ------------------------------------------------------------------------------
    def start(self) -> "ProfileSession":
        global _current
        with _current_lock:
            if _current is not None:
                raise RuntimeError(
                    f"already profiling {_current.meta.name!r}: nested profiling is not supported"
                )
            _current = self
        try:
            self._start()
        except BaseException:
            self._close_sources()
            with _current_lock:
                _current = None
            raise
        return self

    def _start(self) -> None:
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        self.activity = ActivityLog(self.t0)
        self._source_set = sources = open_sources(self.source_spec, self.devices, self.activity.busy_share)
        provenance: dict[str, dict[str, str]] = {}
        for source in sources.sources:
            for device, tags in source.provenance().items():
                provenance.setdefault(device, {}).update(tags)
        metrics = [m for m in METRICS if any(m in tags for tags in provenance.values())]
        self.meta = ExperimentMeta(
            id="",
            name=self.name or "",
            started_at=_utc_iso(self.wall0),
            interval_s=self.interval,
            source=sources.label,
            simulated=sources.simulated,
            devices=[d.to_dict() for d in sources.devices],
            provenance=provenance,
            units={m: METRICS[m].unit for m in metrics},
            notes=list(sources.notes),
            params=dict(self.params),
            context={**run_context(), **_merged_context(sources.sources), "cell_source": self.cell_source},
        )
        from ..store.samples_file import SampleStreamWriter, samples_schema  # pyarrow, lazily

        directory = self.store.create(self.meta)
        self.name = self.meta.name
        self._writer = SampleStreamWriter(directory, samples_schema(metrics))
        self.recorder = Recorder(self.t0, metrics, self._writer)
        for observer in self.observers:
            self.recorder.add_listener(observer.tick)
        self._sampler = Sampler(
            sources.sources, self.recorder.on_tick, self.interval,
            on_gap=self.recorder.on_gap, on_error=self.recorder.on_error,
        )
        for observer in self.observers:
            observer.started(self)
        self._sampler.start()

    # -- stop -------------------------------------------------------------------------------
    def stop(self, status: str = "ok", error: str | None = None) -> Experiment:
        """Stop sampling, save everything, return the Experiment. Safe after a failed start."""
        global _current
        if self.experiment is not None:
            return self.experiment
        try:
            self._sampler.stop()
            self.recorder.on_tick(self._sampler.sample_once())  # the state at the very end
            self.activity.close()
            self.recorder.flush()
            self._writer.close()
            self._finish_meta(status, error)
            self._persist()
        finally:
            self._close_sources()
            with _current_lock:
                _current = None
        for observer in self.observers:
            observer.finished(self.experiment)
        return self.experiment

    def _persist(self) -> None:
        """Parquet, steps, summary, rule results, metadata. A failing step is noted, never fatal:
        the samples already on disk (the stream) and the metadata are kept whatever happens."""
        from ..store.samples_file import stream_to_parquet

        experiment = self.store.load_meta(self.meta)
        steps = [
            ("converting samples to Parquet (they stay in samples.arrows)",
             lambda: stream_to_parquet(self.store.directory(self.meta), self._writer.schema)),
            ("saving steps", lambda: self.store.save_steps(self.meta, _steps_table(self.activity))),
            ("summarising", lambda: experiment.summary),  # computed once, kept in self.meta
        ]
        if self.checks:
            from ..analysis.rules import evaluate_rules

            steps.append(("evaluating rules", lambda: setattr(
                self.meta, "checks", [r.to_dict() for r in evaluate_rules(experiment, self.checks)])))
        for what, step in steps:
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - reported in the experiment and as a warning
                message = f"gpuprof: {what} failed ({type(exc).__name__}: {exc})"
                self.meta.notes.append(message)
                warnings.warn(message, RuntimeWarning, stacklevel=3)
        self.store.save_meta(self.meta)
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
        notes = list(meta.notes)
        for source in self._source_set.sources:
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
        meta.notes = notes

    def _close_sources(self) -> None:
        if self._source_set is not None:
            for source in self._source_set.sources:
                try:
                    source.close()
                except Exception:
                    pass


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
    })
