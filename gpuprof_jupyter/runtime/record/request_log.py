"""Requests folded from events: latency, batch, tokens and time to first token of each serving call.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

The request hooks (``requests.py``) and ``gpuprof_jupyter.request()`` append ``REQ_*`` events
(``events.py``); the ActivityLog hands them here under its lock. Two origins are kept apart, as
steps are: requests marked with ``request()`` and those the hooks found. When the code marks
any, its requests are the requests (``origin == "request()"``); otherwise the hooks'.

A request's latency is its host wall time (``REQ_END`` minus its start), unless its GPU work
was timed with CUDA events: then the time until that work was done (``REQ_GPU``, which may come
drains later), with the host time beside it. A request is handed over once it is complete, and
an open one never holds back those that completed after it started (``take_new``). A request
still open when the run ends is not kept with a partial time: it is counted in one note
(``open_requests_note``), since its latency is unknown.

Times are ``time.monotonic()`` seconds; records hold seconds since the session start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuprof_jupyter.runtime.record.events import (GC_START, REQ_CUDA, REQ_END, REQ_FIRST, REQ_GENERATE, REQ_GPU, REQ_MARKED,
                                                   REQ_MODULE, REQ_PIPELINE, TOKENS_UNIT)
from gpuprof_jupyter.core.format import fmt_unit

NAN = math.nan
NUMBER_MASK = TOKENS_UNIT - 1  # a request event's value: extra + 1 above bit 32, the number below
KIND_NAMES = {REQ_MODULE: "module", REQ_GENERATE: "generate()", REQ_PIPELINE: "pipeline", REQ_MARKED: "request()"}


@dataclass(slots=True)
class RequestRecord:
    t_start_s: float  # seconds since session start
    kind: str  # KIND_NAMES' values
    batch: float  # the first tensor argument's first dimension; NaN when not known
    host_s: float = math.nan  # the call's wall time in the host
    latency_s: float = math.nan  # host_s, or the GPU-measured time when cuda
    tokens: float = math.nan  # generate(): tokens generated (all sequences of the batch)
    ttft_s: float = math.nan  # generate(): time to the first token (host clock)
    gc_s: float = 0.0  # Python's garbage collection while it ran
    wait_s: float = 0.0  # data waits (DataLoader, track()) while it ran
    cuda: bool = False  # latency measured with CUDA events
    waiting_gpu: bool = False  # host side done, the GPU's time not read yet

    @property
    def complete(self) -> bool:
        return not math.isnan(self.host_s) and not self.waiting_gpu

    def as_tuple(self) -> tuple:
        return (self.t_start_s, self.latency_s, self.host_s, self.batch, self.tokens, self.ttft_s, self.gc_s, self.wait_s,
                self.cuda, self.kind)


class _Origin:
    def __init__(self) -> None:
        self.records: list[RequestRecord] = []  # in start order
        self.looked = 0  # records[:looked] were handed over, or are in ``held``
        self.held: list[RequestRecord] = []  # looked at while incomplete (open, or waiting for the GPU), in start order


class RequestLog:
    """Requests of one process's session, folded from its events (``apply``)."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self._marked, self._hooked = _Origin(), _Origin()
        self._by_number: dict[int, RequestRecord] = {}  # requests whose events may still come
        self._gc_started: float | None = None
        self._add_hooked = self._hooked.records.append

    def apply(self, kind: int, t: float, value) -> None:
        # starts and ends first, in few steps: this runs twice per request (benchmarks/bench_hooks.py).
        # Request values are ints (pack_request; the child channel gives them back as ints).
        if kind <= REQ_MARKED:  # a start (REQ_MODULE .. REQ_MARKED)
            extra = value >> 32
            record = RequestRecord(t - self.t0, KIND_NAMES[kind], extra - 1.0 if extra else NAN)
            if kind == REQ_MARKED:
                self._marked.records.append(record)
            else:
                self._add_hooked(record)
            self._by_number[value & NUMBER_MASK] = record
            return
        if kind == REQ_END:
            number = value & NUMBER_MASK
            record = self._by_number.pop(number, None)
            if record is None:
                return
            host = record.host_s = t - self.t0 - record.t_start_s
            if record.latency_s != record.latency_s:  # NaN: no GPU time yet
                record.latency_s = host
            extra = value >> 32
            if extra:
                record.tokens = extra - 1.0
            if record.waiting_gpu:  # its CUDA events are still to be read
                self._by_number[number] = record
            return
        if kind >= GC_START:
            if kind == GC_START:
                self._gc_started = t
            elif self._gc_started is not None:
                self.waited(t - self._gc_started, "gc_s")
                self._gc_started = None
            return
        if value is None:
            return
        number = int(value) & NUMBER_MASK
        record = self._by_number.get(number)
        if record is None:
            return
        if kind == REQ_FIRST:
            if math.isnan(record.ttft_s):
                record.ttft_s = t - self.t0 - record.t_start_s
        elif kind == REQ_CUDA:
            record.waiting_gpu = True
        elif kind == REQ_GPU:
            record.waiting_gpu = False
            if value < TOKENS_UNIT and not math.isnan(t):  # unreadable events (events.py): the host time stands
                record.cuda = True
                record.latency_s = max(t - self.t0 - record.t_start_s, 0.0)
            if not math.isnan(record.host_s):
                del self._by_number[number]

    def waited(self, seconds: float, what: str = "wait_s") -> None:
        """``seconds`` of a data wait (``wait_s``) or a garbage collection (``gc_s``) happened
        while the open requests ran: each of them is told."""
        for record in self._by_number.values():
            if math.isnan(record.host_s):
                setattr(record, what, getattr(record, what) + seconds)

    # -- queries -----------------------------------------------------------------------------------
    @property
    def origin(self) -> str | None:
        """``"request()"``, ``"hooks"`` or None (no requests)."""
        return "request()" if self._marked.records else ("hooks" if self._hooked.records else None)

    @property
    def records(self) -> list[RequestRecord]:
        return self._marked.records if self._marked.records else self._hooked.records

    @property
    def hooked_count(self) -> int:
        return len(self._hooked.records)

    def take_new(self) -> list[tuple]:
        """Complete requests not handed over yet, in start order among themselves. One still
        open (another thread's slow call) or waiting for its GPU time is held and handed over
        once complete; it holds back none of the others. Each call looks at the held ones and
        the new ones only. When ``request()`` starts counting, the hooks' never were."""
        origin = self._marked if self._marked.records else self._hooked
        out, held = [], []
        records = origin.records
        for record in (*origin.held, *records[origin.looked:]):
            if record.complete:
                out.append(record.as_tuple())
            else:
                held.append(record)
        origin.looked, origin.held = len(records), held
        return out

    def all_tuples(self) -> list[tuple]:
        """The complete requests (a run finished without its sampler process); open ones are in
        ``open_requests_note``."""
        return [r.as_tuple() for r in self.records if r.complete]

    def still_open(self) -> list[RequestRecord]:
        """The counted requests that have not returned (their host side), in start order."""
        return [r for r in self.records if math.isnan(r.host_s)]


def open_requests_note(requests: RequestLog) -> str | None:
    """At the run's end: one note counting the requests still open (none is kept with a partial
    time: its latency is not known), or None."""
    still = requests.still_open()
    if not still:
        return None
    return (f"gpuprof: {len(still)} request(s) still open when the run ended, not counted (their latency is not known; "
            f"the oldest started {fmt_unit(still[0].t_start_s, 's', significant=3)} into the run); every request that completed in the run "
            "is counted")


def record_requests_context(context: dict, requests: RequestLog) -> None:
    """Where the run's requests came from, in its context: ``requests_from`` ("request()",
    "hooks" or None) and, when ``request()`` won over requests the hooks also saw, how many."""
    context["requests_from"] = requests.origin
    if requests.origin == "request()" and requests.hooked_count:
        context["hooked_requests"] = requests.hooked_count  # seen, not counted: request() wins


__all__ = ["KIND_NAMES", "RequestLog", "RequestRecord", "open_requests_note", "record_requests_context"]
