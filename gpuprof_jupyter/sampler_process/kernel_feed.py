"""What the kernel tells the sampler process during a run, in batches at the UI rate.

Runs in the sampler process.

The kernel folds its step events (runtime/hooks/activity.py) and sends, once a second,
the busy/wait transitions, the steps and serving requests that ended, and torch's memory statistics (which only
the kernel can read). This feed keeps them for the sources that need them (the simulated
GPU's load, torch memory), for live alerts, and for an experiment finalised after the
kernel died.
"""

from __future__ import annotations

import bisect
import threading
from collections import deque

from gpuprof_jupyter.core.protocol import Events, Reading
from gpuprof_jupyter.core.sources.torch_memory import TorchMemorySource

BUSY = 1


class KernelFeed:
    def __init__(self, t0: float) -> None:
        self.t0 = t0  # the session's start (monotonic s), shared by both processes
        self.covered_until = t0  # the kernel's events are known up to this time
        self.reported = False  # any step or data wait seen
        self.steps: list[tuple] = []  # (t_end_s, duration_s, wait_s, n_samples, n_batches, skipped)
        self.requests: list[tuple] = []  # serving requests, ``core.finish.REQUEST_FIELDS`` order
        self.phases: list[dict] = []
        self._transitions: deque[tuple[float, int]] = deque(maxlen=100_000)
        self._torch: tuple[float, Reading] | None = None
        self.on_torch = None  # called with (as_of, reading) for each torch reading (attribution evidence)
        self._lock = threading.Lock()

    def add(self, batch: Events) -> None:
        """One batch from the kernel (``runtime.session.ProfileSession.handover``)."""
        with self._lock:
            self._transitions.extend(batch.transitions)
            self.steps.extend(batch.steps)
            self.requests.extend(batch.requests)
            if batch.phases:
                self.phases = batch.phases
            self.reported = self.reported or bool(batch.reported)
            if batch.torch:
                self._torch = (batch.as_of, batch.torch)
                if self.on_torch is not None:
                    self.on_torch(batch.as_of, batch.torch)
            self.covered_until = max(self.covered_until, batch.as_of)

    def busy_share(self, start: float, end: float) -> float | None:
        """Share of [start, end] (monotonic s) the loop spent inside steps rather than waiting
        for data; None when the code reported no steps at all."""
        if not self.reported or end <= start:
            return None
        with self._lock:
            transitions = list(self._transitions)
        times = [t for t, _ in transitions]
        i = bisect.bisect_right(times, start)
        state = transitions[i - 1][1] if i > 0 else 0
        busy, cursor = 0.0, start
        for t, new_state in transitions[i:]:
            if t >= end:
                break
            busy += (state == BUSY) * (t - cursor)
            cursor, state = t, new_state
        busy += (state == BUSY) * (end - cursor)
        return busy / (end - start)

    def take_torch(self) -> Reading:
        """The latest torch memory reading, once (then nothing until the next one)."""
        with self._lock:
            latest, self._torch = self._torch, None
        return latest[1] if latest else {}


class KernelTorchMemory(TorchMemorySource):
    """torch.cuda memory statistics read in the kernel, as a polled source of the sampler
    process: each new reading appears once, on the next row (native window: the hand-over
    period, 1 s). Provenance ``torch.cuda``; the peaks are read in the kernel at stop."""

    interval_s = 0.5

    def __init__(self, feed: KernelFeed, device_keys: list[str]) -> None:
        super().__init__(dict(enumerate(device_keys)))  # the keys only: the indices are the kernel's
        self._feed = feed
        self._keys = set(device_keys)

    def read(self) -> Reading:
        return {k: v for k, v in self._feed.take_torch().items() if k in self._keys}

    def final_context(self) -> dict:
        return {}
