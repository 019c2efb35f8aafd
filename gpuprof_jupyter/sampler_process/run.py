"""One experiment recorded by the sampler process, from ``begin`` to ``end`` (or the kernel's death).

Runs in the sampler process.

``open`` (on a thread with a deadline: main.py), ``start``, then ``end``; or ``discard`` when
the kernel cancelled the begin. Its parts, one job each: the two lanes reading the sources into
one ``Recorder`` (``lanes.py``), the rows held for the live view (``live_buffer.py``), the live
alerts (``alerts_feed.py``), the live view's changes (``live_view.py``); here, what ties them
together: opening, starting, the live batch, the job's steps while it runs, and the end.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from gpuprof_jupyter.core.format import fmt_gap
from gpuprof_jupyter.core.finish import finish_experiment, steps_table
from gpuprof_jupyter.core.metrics import METRICS
from gpuprof_jupyter.core.protocol import Begin, End, Events, Gap, apply_kernel_settings
from gpuprof_jupyter.core.sources.base import merged_provenance
from gpuprof_jupyter.core.sources.select import open_sources
from gpuprof_jupyter.core.guarded import run_step
from gpuprof_jupyter.core.fault_injection import trace_steps
from gpuprof_jupyter.core.store.experiment import ExperimentMeta
from gpuprof_jupyter.sampler_process.alerts_feed import AlertsFeed
from gpuprof_jupyter.sampler_process.guards import OptionalParts
from gpuprof_jupyter.sampler_process.kernel_feed import KernelFeed, KernelTorchMemory
from gpuprof_jupyter.sampler_process.lanes import Lanes
from gpuprof_jupyter.sampler_process.live_buffer import LiveBuffer
from gpuprof_jupyter.sampler_process.live_view import LiveView
from gpuprof_jupyter.sampler_process.recorder import Recorder


@dataclass
class LiveBatch:
    """The rows since the last batch (``(mono, device, values)``, at most LIVE_ROWS_PER_S per
    device and second), the recorded gaps (``Gap.since``) and the alerts fired: for the live
    view (``live_view.LiveView``) and the exporter."""

    rows: list
    gaps: list = field(default_factory=list)
    alerts: list = field(default_factory=list)


JOB_STEPS_EVERY_S = 2.0  # a job part's steps reach the store this often while it runs (watch)


class Run:
    def __init__(self, begin: Begin, kernel_pid: int | None) -> None:
        self.begin, options = begin, begin.options
        self.t0 = begin.t0
        self.interval = options.interval
        self.kernel_pid = kernel_pid
        self.store = options.store
        self.meta = ExperimentMeta.from_json(begin.meta)
        self.notes = self.meta.notes
        self.parts = OptionalParts(self._note)  # live alerts, attribution: each may fail alone
        self.malformed: list[str] = []  # messages from the kernel that were not the protocol's
        self.opened = False  # the sources opened in time (main.py gives them a deadline)
        self.checks = list(options.checks)
        self.alerts: AlertsFeed | None = None  # when --alert rules were given
        self.feed = KernelFeed(self.t0)
        self.lanes = Lanes(self.t0, self.interval, Recorder(self.t0, []))  # the sources, read into the recorder
        self.writer = None
        self.directory = None
        self.view = LiveView(self.t0, self.interval, begin.live, self.parts.call)  # what the kernel's view is sent
        self.live_buffer = LiveBuffer(self.view.slot_index)  # the rows recorded, until the view may have them
        self.finished = False
        self._steps_written = (0, 0.0)  # a job part's steps written while it runs: (how many, when)
        self._steps_lock = threading.Lock()  # that writing, against the end's
        trace_steps(begin.fail_step)  # tests: name the steps, fail one (core/fault_injection.py)

    @property
    def recorder(self) -> Recorder:
        return self.lanes.recorder

    # -- start ------------------------------------------------------------------------------------
    def _note(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)

    def open(self) -> None:
        """Take the kernel's settings and open the sources (ValueError: the caller's spec)."""
        self._take_kernel_settings()
        self._step("opening sources", self._open_sources, reraise=(ValueError,))

    def start(self) -> dict:
        """Create the experiment and start both lanes (the sources are open). Returns the metadata."""
        self.directory = self._step("creating the experiment", lambda: self.store.create(self.meta))
        self._step("opening the sample file", self._open_writer)
        self.recorder.add_listener(self.live_buffer.ticks.append)
        self.live_buffer.expect([d["key"] for d in self.meta.devices], since=self.t0)  # the live view waits for each
        self.recorder.start_writing()
        if self.begin.options.alerts:
            self._step("starting the live alerts", self._start_alerts)
        self._step("starting the sampler", self.lanes.start)
        return self.meta.to_json()

    def _start_alerts(self) -> None:
        self.alerts = AlertsFeed(self.begin.options.alerts, self.interval, self.meta.params, self.t0, self.feed)

    def _take_kernel_settings(self) -> None:
        """The kernel's CUDA_VISIBLE_DEVICES, GPUPROF_* variables and working directory as of
        this cell (notebooks change them): devices, the config file and prices resolve as there."""
        begin = self.begin
        apply_kernel_settings(begin.cuda_visible_devices, begin.environ or {})
        try:
            os.chdir(begin.cwd or os.getcwd())
        except OSError as exc:
            self.notes.append(f"gpuprof: the sampler process cannot enter the kernel's directory ({exc})")

    def _step(self, name, fn, reraise=()):
        return run_step(name, fn, self.notes, reraise=reraise)

    def _open_sources(self) -> None:
        options = self.begin.options
        found = open_sources(options.source, options.devices, busy_share=self.feed.busy_share,
                             covered=lambda: self.feed.covered_until, host_pid=self.kernel_pid,
                             host_exclude={os.getpid()}, interval=self.interval, start=self.t0)
        self.lanes.sources = list(found.sources)
        if found.label == "nvml":  # torch's own statistics, read in the kernel and sent over
            keys = [d.key for d in found.devices if d.kind == "gpu"]
            self.lanes.sources.append(KernelTorchMemory(self.feed, keys))
            self._step("opening the per-process shares", self._open_process_shares)
        provenance = merged_provenance(self.lanes.sources)
        metrics = [m for m in METRICS if any(m in tags for tags in provenance.values())]
        meta = self.meta
        meta.source, meta.simulated = found.label, found.simulated
        meta.devices = [d.to_dict() for d in found.devices]
        meta.provenance, meta.units = provenance, {m: METRICS[m].unit for m in metrics}
        self.notes.extend(found.notes)
        for source in self.lanes.sources:
            try:
                meta.context.update(source.context())
            except Exception:  # noqa: BLE001 - a missing fact is not worth the run
                pass
        meta.context["sampler_pid"] = os.getpid()
        self.lanes.recorder = Recorder(self.t0, metrics)
        self.lanes.opened()

    def _open_process_shares(self) -> None:
        """This kernel's process tree against "other processes" on each GPU, 1 s
        (core/sources/gpu_processes.py); the kernel's torch reserved memory is the evidence used
        to find its process where NVML's host PIDs cannot be matched (containers)."""
        from gpuprof_jupyter.core.sources.base import SourceUnavailable
        from gpuprof_jupyter.core.sources.gpu_processes import ProcessShareSource, process_tree
        from gpuprof_jupyter.core.sources.process_attribution import ReservedEvidence

        evidence = ReservedEvidence()
        self.feed.on_torch = self.parts.wrap("the attribution evidence", evidence.observe)
        kernel, me = self.kernel_pid, os.getpid()
        share = ProcessShareSource(own_pids=lambda: process_tree(kernel) - {me}, devices=self.begin.options.devices,
                                   own_reserved=evidence)
        try:
            share.open()
        except SourceUnavailable as exc:
            self.notes.append(f"own/other GPU shares not recorded: {exc}")
            return
        self.lanes.sources.append(share)

    def _open_writer(self) -> None:
        from gpuprof_jupyter.core.store.samples_file import SampleStreamWriter, samples_schema

        if self.directory is not None:
            self.writer = SampleStreamWriter(self.directory, samples_schema(self.recorder.metrics))
            self.recorder.writer = self.writer

    def after_next_tick(self) -> None:
        """Periodic work of the process (the live update) starts here: just after the fast
        lane's next tick (sampler.py), or at once without one."""
        self.lanes.after_next_tick()

    # -- during the run ------------------------------------------------------------------------------
    def live_batch(self, last_sent: dict, final: bool = False) -> LiveBatch:
        """Rows since the last call (``live_buffer.LiveBuffer.ready_rows``: at most
        LIVE_ROWS_PER_S per device and second, whole slots every device reached), recorded gaps
        and fired alerts, for the kernel's live view. ``final``: everything left."""
        ticks = self.live_buffer.drain()
        new_gaps = self.lanes.unsent_gaps()
        alerts = self._judge_alerts(ticks, new_gaps, time.monotonic() - self.t0)  # every sample, at once
        rows = self.live_buffer.ready_rows(ticks, last_sent, self.lanes.silence_s(), final)
        return LiveBatch(rows, new_gaps, alerts)

    def write_job_steps(self) -> None:
        """A part of a multi-node job (``context["job"]``) writes its steps so far every
        ``JOB_STEPS_EVERY_S``, so that ``watch(JOB_ID)`` on any host sees every rank while the job
        runs (docs/multi-node.md); the end writes them all, as for any run. Optional: a failure
        turns it off with one note."""
        count, at = self._steps_written
        now = time.monotonic()
        if (not self.meta.context.get("job") or self.directory is None or self.finished
                or now - at < JOB_STEPS_EVERY_S or len(self.feed.steps) == count):
            return
        with self._steps_lock:
            if self.finished:  # the end writes them all
                return
            steps = list(self.feed.steps)
            self._steps_written = (len(steps), now)
            self.parts.call("writing the job's steps while it runs",
                            lambda: self.store.save_steps(self.meta, steps_table(steps)))

    def _judge_alerts(self, ticks, new_gaps, now_s: float, final: bool = False) -> list[dict]:
        """Every sample (full resolution, before the live view's decimation), the recorded gaps
        and the closed steps go to the live alerts; returns the alerts they fired now."""
        alerts = self.alerts
        if alerts is None:
            return []
        return self.parts.call("the live alerts", lambda: alerts.judge(ticks, new_gaps, now_s, final)) or []

    # -- end ------------------------------------------------------------------------------------------
    def end(self, final: End) -> dict:
        """Stop both lanes, write everything, return the saved metadata. ``final``: what only
        the kernel knows (status, error, params, phases, steps...)."""
        with self._steps_lock:  # a job part's steps being written now finish first (write_job_steps)
            if self.finished:
                return self.meta.to_json()
            self.finished = True
        self.feed.add(final.events or Events(as_of=final.as_of if final.as_of is not None else time.monotonic()))
        stuck = self.lanes.stop(self._step)
        self._step("closing the sample file", self._close_writer)
        self._step("finishing the metadata", lambda: self._finish_meta(final, stuck))
        if self.directory is None:
            self.directory = self._step("creating the experiment", lambda: self.store.create(self.meta))
        if self.directory is not None:
            finish_experiment(self.store, self.meta, self.feed.steps, self.checks, self.notes,
                              schema=self.writer.schema if self.writer is not None else None,
                              requests=self.feed.requests)
        self._close_sources(stuck)
        return self.meta.to_json()

    def discard(self) -> None:
        """Leave nothing of this run (the kernel cancelled its begin and keeps its own record):
        stop the lanes, close the file and the sources, remove the experiment's directory."""
        self.finished = True
        stuck = self.lanes.stop(self._step) if self.lanes.started else None
        self._close_writer()
        if self.opened:
            self._close_sources(stuck)
        if self.directory is not None:
            self.store.remove(self.meta)

    def _close_writer(self) -> None:
        self.recorder.close()
        if self.writer is not None:
            self.writer.close()

    def _finish_meta(self, final: End, stuck: float | None) -> None:
        meta, now = self.meta, time.monotonic()
        final.apply_to(meta)
        meta.context.update(final.context)
        if final.duration_s is None:
            meta.duration_s = now - self.t0
        if stuck is not None:  # the fast lane never came back from a source: a recorded gap
            self.recorder.on_gap(Gap(start=stuck, end=final.as_of if final.as_of is not None else now))
            self.recorder.on_error("a source stopped answering (e.g. a hung NVML call): its lane was left behind")
        gaps = self.lanes.all_gaps()
        if self.alerts is not None:  # the last samples, steps and gaps; then what the experiment keeps
            rest, unsent = list(self.live_buffer.ticks), self.lanes.unsent_gaps()
            self._step("judging the live alerts", lambda: self._judge_alerts(
                rest, unsent, meta.duration_s, final=True))
            meta.alerts = self.alerts.evaluator.record()
            note = self.alerts.evaluator.record_note()
            if note:
                self.notes.append(note)
        meta.gaps = gaps
        notes = self.notes
        notes.extend(n for n in final.notes if n not in notes)
        if self.malformed:
            notes.append(f"gpuprof: the sampler process answered {len(self.malformed)} malformed message(s) with "
                         f"an error and went on (first: {self.malformed[0]})")
        for source in self.lanes.sources:
            notes.extend(n for n in source.notes() if n not in notes)
            final_context = getattr(source, "final_context", None)
            if final_context is not None and stuck is None:  # never call into a hung library
                try:
                    meta.context.update(final_context())
                except Exception as exc:  # noqa: BLE001 - never lose the experiment over a late fact
                    notes.append(f"{source.name}: could not read final context ({type(exc).__name__}: {exc})")
        for gap in meta.context.get("energy_gaps", ()):  # monotonic -> seconds since start, as meta.gaps
            for key in ("start", "end"):
                if f"{key}_mono" in gap:
                    gap[f"{key}_s"] = gap.pop(f"{key}_mono") - self.t0
        notes.extend(e for e in self.recorder.errors if e not in notes)
        for gap in meta.gaps:
            where = f" ({gap[2]})" if len(gap) > 2 else ""
            notes.append(f"{fmt_gap(gap[0], gap[1])}{where} (not interpolated)")

    def _close_sources(self, stuck: float | None) -> None:
        if stuck is None:  # else a thread is inside a source: closing it now could free what it uses
            self.close_sources()

    def close_sources(self) -> None:
        self.lanes.close_sources()

