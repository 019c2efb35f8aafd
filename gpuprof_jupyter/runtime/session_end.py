"""The end of a run: what a ``ProfileSession`` does once it stops, finishing, saving, noting.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

``ProfileSession`` (session.py) starts a run, hands its events over and stops it; these are
its endings, mixed in: the children's channel closed and merged (``jobs/children_merge.py``),
the settings the run used recorded, the trace saved, the out-of-memory explanation kept, and
the one way a run ends (``_finish``): the sampler process finishes it (``End``), or, when it is
gone or failing, the run is finished here from what it wrote (``core/finish.py``). Notes added
after the experiment was saved are saved too (``note``).
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from datetime import datetime, timezone

from gpuprof_jupyter.core.finish import finish_experiment
from gpuprof_jupyter.core.guarded import run_step
from gpuprof_jupyter.core.protocol import End, timeout_s
from gpuprof_jupyter.core.store.experiment import ExperimentMeta, RunStatus
from gpuprof_jupyter.core.torch_defaults import merge_recorded, torch_filled
from gpuprof_jupyter.runtime.hooks.oom_record import earlier_fit, is_out_of_memory, oom_context
from gpuprof_jupyter.runtime.jobs.children_merge import merge_children, save_rank_traces
from gpuprof_jupyter.runtime.record.request_log import open_requests_note, record_requests_context
from gpuprof_jupyter.runtime.record.settings import dataloader_settings
from gpuprof_jupyter.runtime.record.used_settings import used_settings

END_TIMEOUT_S = 120.0  # Parquet and the summary of a long run


def utc_iso(ts: float) -> str:
    """A run's start or end as the experiment stores it: UTC, to the millisecond."""
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds")


class SessionEnding:
    """The ending half of ``ProfileSession`` (session.py holds its state and its start)."""

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

    def _finish_trace(self) -> None:
        """Export the window's trace into the experiment; its record_function ranges become phases."""
        if self._directory is None:
            self.trace_window.finish(lambda trace: None)
            return
        self.trace_window.finish(lambda trace: self.store.save_trace(self.meta, trace))

    def record_error(self, exc: BaseException | None) -> None:
        """Before ``stop()``: a run that dies of ``torch.OutOfMemoryError`` keeps what explains it
        (``context["oom"]``, runtime.hooks.oom_record; the snapshot first, while the history records)."""
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
            status=status, error=error, ended_at=utc_iso(time.time()), as_of=events.as_of,
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
        warn_failures(meta.notes, self.notes)
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
        if memory.record is not None:  # the sampled step's breakdown (runtime.hooks.memory_hooks)
            context["memory"] = memory.record
        if memory.history is not None and memory.history.low is not None:  # headroom ran low (runtime.hooks.oom_record)
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


def warn_failures(notes: list[str], known: list[str]) -> None:
    """The sampler process's own failed steps, said in the kernel as ``run_step`` says ours."""
    for note in notes:
        if note not in known and note.startswith("gpuprof: ") and " failed (" in note:
            warnings.warn(note, RuntimeWarning, stacklevel=4)


__all__ = ["END_TIMEOUT_S", "SessionEnding", "utc_iso", "warn_failures"]
