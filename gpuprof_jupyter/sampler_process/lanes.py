"""The run's two lanes reading its sources into one ``Recorder``, and the gaps they record.

Runs in the sampler process.

The *fast lane* (``sampler.Sampler``: polled sources, NVML included, at the session's
interval, on a thread of its own so a hung NVML call never blocks the control channel) and the
*batch lane* (batched sources: the simulated GPU, Prometheus; polled four times a second). Both
hand ticks to the run's ``Recorder``, whose own thread writes the crash-safe stream. A lane
stuck in a source is left behind at the end, its last sample's time returned as a gap's start.
"""

from __future__ import annotations

import threading
from typing import Callable

from gpuprof_jupyter.core.sources.base import close_all, is_batched
from gpuprof_jupyter.sampler_process.recorder import Recorder
from gpuprof_jupyter.sampler_process.sampler import Sampler

BATCH_POLL_S = 0.25  # batched sources (the simulated GPU, Prometheus) are asked four times a second
STOP_JOIN_S = 1.5  # how long ``stop`` waits for a lane stuck in a source before leaving it (a loaded
# machine can keep a healthy lane from its exit for longer than 0.5 s: it would be called stuck)
# how late the kernel's events may come on a loaded machine (its link hands them over every 1.25 s at
# most, 0.5 s after a live update): a source that follows them (the simulated GPU) may lag this long
EVENTS_LAG_S = 4.0


class Lanes:
    """The sources, the lanes that read them into ``recorder`` and the gaps recorded so far.

    ``sources`` is filled when the run opens them (then ``opened``); ``recorder`` is the run's (replaced once the
    sources say which metrics there are)."""

    def __init__(self, t0: float, interval: float, recorder: Recorder) -> None:
        self.t0, self.interval, self.recorder = t0, interval, recorder
        self.sources: list = []
        self.batched: list = []  # the batched ones among them (the batch lane's), once all are open
        self.sampler: Sampler | None = None
        self._batch_stop = threading.Event()
        self._batch_thread: threading.Thread | None = None
        self._batch_gaps: list = []
        self._gaps_sent = (0, 0)  # the lane's and the batched sources' gaps already sent (and judged)

    def opened(self) -> None:
        """Every source is open: the batched ones are the batch lane's."""
        self.batched = [s for s in self.sources if is_batched(s)]

    @property
    def started(self) -> bool:
        return self.sampler is not None or self._batch_thread is not None

    def start(self) -> None:
        polled = [s for s in self.sources if not is_batched(s)]
        batched = self.batched
        for source in polled:  # the interval its own gaps (energy across a gap) are judged against
            if hasattr(source, "set_session_interval"):
                source.set_session_interval(self.interval)
        recorder = self.recorder
        if polled:
            self.sampler = Sampler(polled, recorder.on_tick, self.interval,
                                   on_gap=recorder.on_gap, on_error=recorder.on_error)
            self.sampler.start()
            recorder.pace = self.sampler.after_next_tick
        if batched:
            self._batch_thread = threading.Thread(target=self._batch_loop, args=(batched,),
                                                  name="gpuprof-batch-lane", daemon=True)
            self._batch_thread.start()

    def after_next_tick(self) -> None:
        """Just after the fast lane's next tick (sampler.py), or at once without one."""
        sampler = self.sampler
        if sampler is not None:
            sampler.after_next_tick()

    def _batch_loop(self, sources) -> None:
        while not self._batch_stop.wait(BATCH_POLL_S):
            self._poll_batched(sources)

    def _poll_batched(self, sources, final: bool = False) -> None:
        recorder = self.recorder
        for source in sources:
            try:
                for tick in source.read_batch(final=final):
                    recorder.on_tick(tick)
                self._batch_gaps.extend(source.take_gaps())
            except Exception as exc:  # noqa: BLE001 - a source never ends the run
                recorder.on_error(f"source {source.name} failed to read ({type(exc).__name__}: {exc})")

    def stop(self, step: Callable) -> float | None:
        """Stop the lanes; a lane stuck in a source is left behind (its late rows are ignored).
        Returns the time of its last sample when it was stuck, else None. ``step(name, fn)``:
        the run's guarded step."""
        stuck = None
        self._batch_stop.set()
        if self._batch_thread is not None:
            self._batch_thread.join(STOP_JOIN_S + 10 * BATCH_POLL_S)
        sampler = self.sampler
        if sampler is not None:
            step("stopping the sampler", lambda: sampler.stop(timeout=max(STOP_JOIN_S, 2 * self.interval)))
            if sampler.running:
                stuck = sampler.last_sample_at
            else:
                step("taking the last sample", lambda: self.recorder.on_tick(sampler.sample_once()))
        batched = self.batched
        if batched and (self._batch_thread is None or not self._batch_thread.is_alive()):
            self._poll_batched(batched, final=True)  # up to what the kernel's last events cover
        return stuck

    def silence_s(self) -> float:
        """How long a device may stay silent before the live view stops waiting for it: three of
        the slowest source's intervals (a Prometheus scrape lags by one on purpose), at least 2 s,
        and EVENTS_LAG_S with a source that follows the kernel's events. Shorter, and a late row
        would come after its slot was streamed without it (the plot does not go back)."""
        slowest = 3 * max((getattr(s, "interval_s", 0.0) or 0.0 for s in self.sources), default=0.0)
        follows = any(getattr(s, "follows_events", False) for s in self.sources)
        return max(2.0, slowest, EVENTS_LAG_S if follows else 0.0)

    def all_gaps(self) -> list[list]:
        """Every gap recorded so far, in seconds since the run's start."""
        for source in self.sources:  # polled sources with a lane of their own (NVML's PCIe lane)
            if not is_batched(source) and hasattr(source, "take_gaps"):
                self._batch_gaps.extend(source.take_gaps())
        return [gap.since(self.t0) for gap in [*self.recorder.gaps, *self._batch_gaps]]

    def unsent_gaps(self) -> list[list]:
        """The gaps recorded since the last call: the lane's and the batched sources' are two
        lists, each with its own count (a lane gap after batch gaps is not one of theirs)."""
        self.all_gaps()  # the polled sources' own lanes hand theirs over
        lane, batch = self.recorder.gaps, self._batch_gaps
        (lane_sent, batch_sent), ends = self._gaps_sent, (len(lane), len(batch))  # lanes only append meanwhile
        self._gaps_sent = ends
        return [gap.since(self.t0) for gap in [*lane[lane_sent:ends[0]], *batch[batch_sent:ends[1]]]]

    def close_sources(self) -> None:
        close_all(self.sources)


__all__ = ["BATCH_POLL_S", "EVENTS_LAG_S", "STOP_JOIN_S", "Lanes"]
