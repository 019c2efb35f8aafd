"""One experiment recorded by the sampler process, from ``begin`` to ``end`` (or the kernel's death).

Runs in the sampler process.

``open`` (on a thread with a deadline: main.py), ``start``, then ``end``; or ``discard`` when
the kernel cancelled the begin. Two lanes read the sources: the *fast lane* (``sampler.Sampler``: polled sources, NVML
included, at the session's interval, on a thread of its own so a hung NVML call never blocks
the control channel) and the *batch lane* (batched sources: the simulated GPU, Prometheus;
polled four times a second). Both hand ticks to one ``Recorder``, whose own thread writes
the crash-safe stream. The live view's changes are prepared here (``live_view``).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from gpuprof_jupyter.core.format import fmt_gap
from gpuprof_jupyter.core.finish import STEP_FIELDS, finish_experiment, steps_table
from gpuprof_jupyter.core.metrics import METRICS
from gpuprof_jupyter.core.protocol import LIVE_ROWS_PER_S, Begin, End, Events, Gap, Tick, apply_kernel_settings
from gpuprof_jupyter.core.sources.base import close_all, is_batched, merged_provenance
from gpuprof_jupyter.core.sources.select import open_sources
from gpuprof_jupyter.core.guarded import run_step
from gpuprof_jupyter.core.fault_injection import trace_steps
from gpuprof_jupyter.core.store.experiment import ExperimentMeta
from gpuprof_jupyter.sampler_process.guards import OptionalParts
from gpuprof_jupyter.sampler_process.kernel_feed import KernelFeed, KernelTorchMemory
from gpuprof_jupyter.sampler_process.sampler import Sampler
from gpuprof_jupyter.sampler_process.live_view import LiveView
from gpuprof_jupyter.sampler_process.recorder import Recorder

BATCH_POLL_S = 0.25  # batched sources (the simulated GPU, Prometheus) are asked four times a second
STOP_JOIN_S = 1.5  # how long ``end`` waits for a lane stuck in a source before leaving it (a loaded
# machine can keep a healthy lane from its exit for longer than 0.5 s: it would be called stuck)
FIRST_LIVE_WAIT_S = 5.0  # the live view waits this long for a device's first rows (a batched source starts late)
# how late the kernel's events may come on a loaded machine (its link hands them over every 1.25 s at
# most, 0.5 s after a live update): a source that follows them (the simulated GPU) may lag this long
EVENTS_LAG_S = 4.0


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
        self.alerts = None  # analysis.live_alerts.LiveAlertEvaluator, when --alert rules were given
        self._alerts_lock = threading.Lock()  # the live thread and ``end`` both feed it
        self._alert_steps = 0  # steps of self.feed handed to it so far
        self.feed = KernelFeed(self.t0)
        self.recorder = Recorder(self.t0, [])
        self.sources = []
        self._batched = []  # the batched ones among them (the batch lane's)
        self.sampler: Sampler | None = None
        self.writer = None
        self.directory = None
        self.live: deque[Tick] = deque(maxlen=100_000)
        self.view = LiveView(self.t0, self.interval, begin.live, self.parts.call)  # what the kernel's view is sent
        self._live_held: list[Tick] = []  # rows waiting for every device to reach their time
        self._live_newest: dict[str, float] = {}
        self._live_unseen: set[str] = set()
        self._gaps_sent = (0, 0)  # the lane's and the batched sources' gaps already sent (and judged)
        self._batch_stop = threading.Event()
        self._batch_thread: threading.Thread | None = None
        self._batch_gaps: list = []
        self.finished = False
        self._steps_written = (0, 0.0)  # a job part's steps written while it runs: (how many, when)
        self._steps_lock = threading.Lock()  # that writing, against the end's
        trace_steps(begin.fail_step)  # tests: name the steps, fail one (core/fault_injection.py)

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
        self.recorder.add_listener(self.live.append)
        self._live_newest = {d["key"]: self.t0 for d in self.meta.devices}  # the live view waits for each
        self._live_unseen = set(self._live_newest)  # not reported yet: waited for longer (FIRST_LIVE_WAIT_S)
        self.recorder.start_writing()
        if self.begin.options.alerts:
            self._step("starting the live alerts", self._start_alerts)
        self._step("starting the sampler", self._start_lanes)
        return self.meta.to_json()

    def _start_alerts(self) -> None:
        from gpuprof_jupyter.core.analysis.live_alerts import LiveAlertEvaluator

        self.alerts = LiveAlertEvaluator(self.begin.options.alerts, self.interval, params=self.meta.params)

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
        self.sources = list(found.sources)
        if found.label == "nvml":  # torch's own statistics, read in the kernel and sent over
            keys = [d.key for d in found.devices if d.kind == "gpu"]
            self.sources.append(KernelTorchMemory(self.feed, keys))
            self._step("opening the per-process shares", self._open_process_shares)
        provenance = merged_provenance(self.sources)
        metrics = [m for m in METRICS if any(m in tags for tags in provenance.values())]
        meta = self.meta
        meta.source, meta.simulated = found.label, found.simulated
        meta.devices = [d.to_dict() for d in found.devices]
        meta.provenance, meta.units = provenance, {m: METRICS[m].unit for m in metrics}
        self.notes.extend(found.notes)
        for source in self.sources:
            try:
                meta.context.update(source.context())
            except Exception:  # noqa: BLE001 - a missing fact is not worth the run
                pass
        meta.context["sampler_pid"] = os.getpid()
        self.recorder = Recorder(self.t0, metrics)
        self._batched = [s for s in self.sources if is_batched(s)]

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
        self.sources.append(share)

    def _open_writer(self) -> None:
        from gpuprof_jupyter.core.store.samples_file import SampleStreamWriter, samples_schema

        if self.directory is not None:
            self.writer = SampleStreamWriter(self.directory, samples_schema(self.recorder.metrics))
            self.recorder.writer = self.writer

    def _start_lanes(self) -> None:
        polled = [s for s in self.sources if not is_batched(s)]
        batched = self._batched
        for source in polled:  # the interval its own gaps (energy across a gap) are judged against
            if hasattr(source, "set_session_interval"):
                source.set_session_interval(self.interval)
        if polled:
            self.sampler = Sampler(polled, self.recorder.on_tick, self.interval,
                                   on_gap=self.recorder.on_gap, on_error=self.recorder.on_error)
            self.sampler.start()
            self.recorder.pace = self.sampler.after_next_tick
        if batched:
            self._batch_thread = threading.Thread(target=self._batch_loop, args=(batched,),
                                                  name="gpuprof-batch-lane", daemon=True)
            self._batch_thread.start()

    def after_next_tick(self) -> None:
        """Periodic work of the process (the live update) starts here: just after the fast
        lane's next tick (sampler.py), or at once without one."""
        sampler = self.sampler
        if sampler is not None:
            sampler.after_next_tick()

    def _batch_loop(self, sources) -> None:
        while not self._batch_stop.wait(BATCH_POLL_S):
            self._poll_batched(sources)

    def _poll_batched(self, sources, final: bool = False) -> None:
        for source in sources:
            try:
                for tick in source.read_batch(final=final):
                    self.recorder.on_tick(tick)
                self._batch_gaps.extend(source.take_gaps())
            except Exception as exc:  # noqa: BLE001 - a source never ends the run
                self.recorder.on_error(f"source {source.name} failed to read ({type(exc).__name__}: {exc})")

    # -- during the run ------------------------------------------------------------------------------
    def live_batch(self, last_sent: dict, final: bool = False) -> LiveBatch:
        """Rows since the last call (at most LIVE_ROWS_PER_S per device and second), recorded
        gaps and fired alerts, for the kernel's live view. Rows are held back until every device
        of the run has reported past their slot (a batched source lags the sampling lane), so one
        slot of the plot gets all its devices at once, in order; a device silent for longer than
        its sources could lag (``_live_silence_s``: a lost GPU, one that never reported) holds
        nobody back. ``final``: everything left."""
        live = self.live
        ticks = [live.popleft() for _ in range(len(live))]  # the lanes only append meanwhile
        new_gaps = self._unsent_gaps()
        alerts = self._judge_alerts(ticks, new_gaps, time.monotonic() - self.t0)  # every sample, at once
        newest = self._live_newest
        for tick in ticks:
            for device in tick.reading:
                newest[device] = max(newest.get(device, -math.inf), tick.mono)
                self._live_unseen.discard(device)
        held = self._live_held
        held.extend(ticks)
        now, silence = time.monotonic(), self._live_silence_s()
        waiting_for = [t for device, t in newest.items()
                       if now - t <= (max(silence, FIRST_LIVE_WAIT_S) if device in self._live_unseen else silence)]
        ready = math.inf if final else min(waiting_for, default=max(newest.values(), default=-math.inf))
        slot = self.view.slot_index  # whole slots only: a later row could still fall in the slot of ``ready``
        ready_slot = ready if math.isinf(ready) else slot(ready)
        ticks, self._live_held = [], []
        for tick in held:
            (ticks if slot(tick.mono) < ready_slot else self._live_held).append(tick)
        spacing = 1.0 / LIVE_ROWS_PER_S
        rows = []
        for tick in sorted(ticks, key=lambda tick: tick.mono):
            for device, values in tick.reading.items():
                if tick.mono - last_sent.get(device, -1e18) >= spacing * 0.999:
                    last_sent[device] = tick.mono
                    rows.append((tick.mono, device, values))
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

    def _live_silence_s(self) -> float:
        """How long a device may stay silent before the live view stops waiting for it: three of
        the slowest source's intervals (a Prometheus scrape lags by one on purpose), at least 2 s,
        and EVENTS_LAG_S with a source that follows the kernel's events. Shorter, and a late row
        would come after its slot was streamed without it (the plot does not go back)."""
        slowest = 3 * max((getattr(s, "interval_s", 0.0) or 0.0 for s in self.sources), default=0.0)
        follows = any(getattr(s, "follows_events", False) for s in self.sources)
        return max(2.0, slowest, EVENTS_LAG_S if follows else 0.0)

    def _judge_alerts(self, ticks, new_gaps, now_s: float, final: bool = False) -> list[dict]:
        """Every sample (full resolution, before the live view's decimation), the recorded gaps
        and the closed steps go to the alert evaluator; returns the alerts it fired now."""
        evaluator = self.alerts
        if evaluator is None:
            return []
        return self.parts.call("the live alerts", lambda: self._feed_alerts(evaluator, ticks, new_gaps, now_s, final)) or []

    def _feed_alerts(self, evaluator, ticks, new_gaps, now_s: float, final: bool) -> list[dict]:
        with self._alerts_lock:
            for tick in ticks:
                t = tick.mono - self.t0
                for device, values in tick.reading.items():
                    evaluator.add_row(t, device, values)
            for gap in new_gaps:
                evaluator.add_gap(gap[0], gap[1])
            steps = self.feed.steps[self._alert_steps:]
            self._alert_steps += len(steps)
            for step in steps:  # a child's step carries its rank after STEP_FIELDS
                evaluator.add_step(step[0], step[1], step[2], step[len(STEP_FIELDS)] if len(step) > len(STEP_FIELDS) else None)
            return [a.to_dict() for a in evaluator.evaluate(now_s, final=final)]

    def _all_gaps(self) -> list[list]:
        for source in self.sources:  # polled sources with a lane of their own (NVML's PCIe lane)
            if not is_batched(source) and hasattr(source, "take_gaps"):
                self._batch_gaps.extend(source.take_gaps())
        return [gap.since(self.t0) for gap in [*self.recorder.gaps, *self._batch_gaps]]

    def _unsent_gaps(self) -> list[list]:
        """The gaps recorded since the last call: the lane's and the batched sources' are two
        lists, each with its own count (a lane gap after batch gaps is not one of theirs)."""
        self._all_gaps()  # the polled sources' own lanes hand theirs over
        lane, batch = self.recorder.gaps, self._batch_gaps
        (lane_sent, batch_sent), ends = self._gaps_sent, (len(lane), len(batch))  # lanes only append meanwhile
        self._gaps_sent = ends
        return [gap.since(self.t0) for gap in [*lane[lane_sent:ends[0]], *batch[batch_sent:ends[1]]]]

    # -- end ------------------------------------------------------------------------------------------
    def end(self, final: End) -> dict:
        """Stop both lanes, write everything, return the saved metadata. ``final``: what only
        the kernel knows (status, error, params, phases, steps...)."""
        with self._steps_lock:  # a job part's steps being written now finish first (write_job_steps)
            if self.finished:
                return self.meta.to_json()
            self.finished = True
        self.feed.add(final.events or Events(as_of=final.as_of if final.as_of is not None else time.monotonic()))
        stuck = self._stop_lanes()
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
        stuck = self._stop_lanes() if self.sampler is not None or self._batch_thread is not None else None
        self._close_writer()
        if self.opened:
            self._close_sources(stuck)
        if self.directory is not None:
            self.store.remove(self.meta)

    def _stop_lanes(self) -> float | None:
        """Stop the lanes; a lane stuck in a source is left behind (its late rows are ignored).
        Returns the time of its last sample when it was stuck, else None."""
        stuck = None
        self._batch_stop.set()
        if self._batch_thread is not None:
            self._batch_thread.join(STOP_JOIN_S + 10 * BATCH_POLL_S)
        sampler = self.sampler
        if sampler is not None:
            self._step("stopping the sampler", lambda: sampler.stop(timeout=max(STOP_JOIN_S, 2 * self.interval)))
            if sampler.running:
                stuck = sampler.last_sample_at
            else:
                self._step("taking the last sample", lambda: self.recorder.on_tick(sampler.sample_once()))
        if self._batched and (self._batch_thread is None or not self._batch_thread.is_alive()):
            self._poll_batched(self._batched, final=True)  # up to what the kernel's last events cover
        return stuck

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
        gaps = self._all_gaps()
        if self.alerts is not None:  # the last samples, steps and gaps; then what the experiment keeps
            rest, unsent = list(self.live), self._unsent_gaps()
            self._step("judging the live alerts", lambda: self._judge_alerts(
                rest, unsent, meta.duration_s, final=True))
            meta.alerts = self.alerts.record()
            note = self.alerts.record_note()
            if note:
                self.notes.append(note)
        meta.gaps = gaps
        notes = self.notes
        notes.extend(n for n in final.notes if n not in notes)
        if self.malformed:
            notes.append(f"gpuprof: the sampler process answered {len(self.malformed)} malformed message(s) with "
                         f"an error and went on (first: {self.malformed[0]})")
        for source in self.sources:
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
        close_all(self.sources)

