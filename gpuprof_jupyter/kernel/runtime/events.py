"""The kernel-side event buffer: what the training loop's hooks append, drained in batches.

Runs in the kernel (or the profiled script).

Every event the profiled code produces (a step, the start and end of a data wait, an
optimizer step) is one tuple ``(kind, time, value)`` appended to an ``EventBuffer``. An
append is one ``deque.append`` (atomic under the GIL, no lock, ~0.1 us); nothing is sent,
written or computed per event. Consumers take whole batches with ``drain()``: the
ActivityLog folds them into steps and busy/wait transitions when the sampler ticks, when a
view asks, and when the session stops (docs/events.md).

``drain()``'s batches are plain tuples of ints, floats and None, so a batch crosses to another
process as it is: a job's child processes send theirs raw to the run (``kernel/runtime/child.py``).
"""

from __future__ import annotations

from collections import deque

# Event kinds (first field). value: see each kind.
STEP = 1  # explicit gpuprof_jupyter.step(n): value = n_samples or None
WAIT_START = 2  # a batch is being waited for (track(), DataLoader.__next__): value None
WAIT_END = 3  # the batch came: value = its sample count, or None when unknown / no batch
LOOP_END = 4  # an iteration ran out (StopIteration): the loop is idle
OPT_PRE = 5  # optimizer.step() entered: value = id(optimizer)
OPT_POST = 6  # optimizer.step() returned: value = id(optimizer)
SCALER_PRE = 7  # GradScaler.step(optimizer) entered: value = id(optimizer)
SCALER_POST = 8  # GradScaler.step(optimizer) returned: value = id(optimizer)
MEM = 9  # torch's allocator peak since the last boundary, read before the step's own event: value = bytes

MAX_PENDING = 1_000_000  # ~100 MB of tuples: only reached when nothing drains for hours


class EventBuffer:
    """Append-only, drained in batches. ``append((kind, t, value))`` from any thread, no lock.

    ``drain()`` takes the events appended so far, in order; events appended meanwhile stay
    for the next drain. One consumer drains at a time (the ActivityLog, under its lock).
    Beyond ``max_pending`` undrained events the oldest are dropped (a deque with ``maxlen``
    drops them atomically); the ActivityLog drains at every sampler tick, so that takes
    hours without a tick.
    """

    __slots__ = ("_queue", "append")

    def __init__(self, max_pending: int = MAX_PENDING) -> None:
        self._queue: deque = deque(maxlen=max_pending)
        self.append = self._queue.append  # the bound method itself: one call per event

    def __len__(self) -> int:
        return len(self._queue)

    def drain(self) -> list[tuple]:
        """The pending events, oldest first (popleft is atomic: concurrent appends are kept)."""
        queue = self._queue
        pop = queue.popleft
        batch = []
        for _ in range(len(queue)):
            try:
                batch.append(pop())
            except IndexError:  # another drainer took the rest
                break
        return batch


__all__ = ["EventBuffer", "STEP", "WAIT_START", "WAIT_END", "LOOP_END", "OPT_PRE", "OPT_POST",
           "SCALER_PRE", "SCALER_POST", "MEM"]
