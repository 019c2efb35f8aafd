"""The kernel-side event buffer: what the training loop's hooks append, drained in batches.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

Every event the profiled code produces (a step, the start and end of a data wait, an
optimizer step) is one tuple ``(kind, time, value)`` appended to an ``EventBuffer``. An
append is one ``deque.append`` (atomic under the GIL, no lock, ~0.1 us); nothing is sent,
written or computed per event. Consumers take whole batches with ``drain()``: the
ActivityLog folds them into steps and busy/wait transitions when the sampler ticks, when a
view asks, and when the session stops (docs/events.md).

``drain()``'s batches are plain tuples of ints, floats and None, so a batch crosses to another
process as it is: a job's child processes send theirs raw to the run (``runtime/jobs/child.py``).
"""

from __future__ import annotations

from collections import deque

# Event kinds (first field). value: see each kind.
STEP = 1  # explicit gpuprof_jupyter.step(n): value = n_samples or None
WAIT_START = 2  # a batch is being waited for (track(), DataLoader.__next__): value None
WAIT_END = 3  # the batch came: value = its sample count, None when unknown, NO_BATCH when none came
NO_BATCH = -1  # WAIT_END's value when the wait ended without a batch (StopIteration, an error)
LOOP_END = 4  # an iteration ran out (StopIteration): the loop is idle
OPT_PRE = 5  # optimizer.step() entered: value = id(optimizer)
OPT_POST = 6  # optimizer.step() returned: value = id(optimizer)
SCALER_PRE = 7  # GradScaler.step(optimizer) entered: value = id(optimizer)
SCALER_POST = 8  # GradScaler.step(optimizer) returned: value = id(optimizer)
MEM = 9  # torch's allocator peak since the last boundary, read before the step's own event: value = bytes
# requests (runtime/hooks/requests.py): the outermost serving call. Each request has a number,
# its place among this process's requests (0, 1, ...), so events of requests that overlap (threads)
# pair up. value = ``pack_request(number, extra)``: the number, and a count where the kind has one.
REQ_MODULE = 10  # a top-level torch.nn.Module called with gradients disabled; extra: the batch size
REQ_GENERATE = 11  # a transformers generate() call; extra: the batch size
REQ_PIPELINE = 12  # a transformers pipeline call; extra: the batch size
REQ_MARKED = 13  # gpuprof_jupyter.request() entered; extra: the batch size
REQ_END = 14  # the request returned (host side); extra: tokens generated (generate())
REQ_FIRST = 15  # generate(): its model's first forward pass returned (the first token)
REQ_CUDA = 16  # the request's GPU work is timed with CUDA events: a REQ_GPU follows
REQ_GPU = 17  # the request's GPU work was done at this time (the events read later); value = its number, or
# ``pack_request(number, 0)`` when its events could not be read: then at the host's end, whose time stands
GC_START = 18  # Python's garbage collector started (requests.py's gc callback): value = the generation
GC_END = 19  # ... and finished: the open requests count the pause as theirs
TOKENS_UNIT = 1 << 32  # numbers stay below it; counts below 2**20 keep the float64 value exact (the child channel)


def pack_request(number: int, extra: int | None = None) -> int:
    """One number for a request event's value (the child channel carries one float64)."""
    return number if extra is None else number + (extra + 1) * TOKENS_UNIT



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


__all__ = ["EventBuffer", "STEP", "WAIT_START", "WAIT_END", "NO_BATCH", "LOOP_END", "OPT_PRE", "OPT_POST",
           "SCALER_PRE", "SCALER_POST", "MEM", "REQ_MODULE", "REQ_GENERATE", "REQ_PIPELINE", "REQ_MARKED", "REQ_END",
           "REQ_FIRST", "REQ_GPU", "REQ_CUDA", "GC_START", "GC_END", "TOKENS_UNIT",
           "pack_request"]
