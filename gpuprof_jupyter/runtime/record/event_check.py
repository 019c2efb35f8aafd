"""Every field of an event checked before it is folded: what a child process sends is input.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

The fold (``hooks/activity.py``, ``request_log.py``) trusts its events, as it may for the hooks
of its own process: a request start whose value is None raised ``TypeError`` inside the
hand-over. A child's events come over a socket (``core/child_channel.py``: values as float64,
ints back where exact, None for NaN), so the run checks each of them before folding it
(``runtime/jobs/children_listener.py``): a kind of ``events.py``, a finite time, and the value that kind
takes. A bad event is dropped and counted; the child's other events are kept.
"""

from __future__ import annotations

import math

from gpuprof_jupyter.runtime.record.events import (GC_END, GC_START, LOOP_END, MEM, NO_BATCH, OPT_POST, OPT_PRE, REQ_CUDA,
                                                   REQ_END, REQ_FIRST, REQ_GENERATE, REQ_GPU, REQ_MARKED, REQ_MODULE,
                                                   REQ_PIPELINE, SCALER_POST, SCALER_PRE, STEP, WAIT_END, WAIT_START)

EXACT = 1 << 53  # counts, ids and packed request values the channel's float64 carries exactly


def _count(value) -> bool:
    return (type(value) is int or type(value) is float) and math.isfinite(value) and 0 <= value < EXACT


def _whole(value) -> bool:
    return type(value) is int and 0 <= value < EXACT


def _none(value) -> bool:
    return value is None


def _count_or_none(value) -> bool:
    return value is None or _count(value)


def _batch_end(value) -> bool:
    return value is None or value == NO_BATCH or _count(value)


def _whole_or_none(value) -> bool:
    return value is None or _whole(value)


# kind -> (its name, the check of its value, what the value may be)
VALUES = {
    STEP: ("STEP", _count_or_none, "a sample count or None"),
    WAIT_START: ("WAIT_START", _none, "None"),
    WAIT_END: ("WAIT_END", _batch_end, "a sample count, -1 or None"),
    LOOP_END: ("LOOP_END", _none, "None"),
    OPT_PRE: ("OPT_PRE", _whole, "an optimizer's id"),
    OPT_POST: ("OPT_POST", _whole, "an optimizer's id"),
    SCALER_PRE: ("SCALER_PRE", _whole, "an optimizer's id"),
    SCALER_POST: ("SCALER_POST", _whole, "an optimizer's id"),
    MEM: ("MEM", _count, "a number of bytes"),
    **{kind: (name, _whole, "a request's packed number") for kind, name in (
        (REQ_MODULE, "REQ_MODULE"), (REQ_GENERATE, "REQ_GENERATE"), (REQ_PIPELINE, "REQ_PIPELINE"),
        (REQ_MARKED, "REQ_MARKED"), (REQ_END, "REQ_END"), (REQ_FIRST, "REQ_FIRST"), (REQ_CUDA, "REQ_CUDA"),
        (REQ_GPU, "REQ_GPU"))},
    GC_START: ("GC_START", _whole_or_none, "a generation or None"),
    GC_END: ("GC_END", _whole_or_none, "a generation or None"),
}


def problem(kind, t, value) -> str | None:
    """What is wrong with the event ``(kind, t, value)``, or None when it may be folded."""
    known = VALUES.get(kind) if type(kind) is int else None
    if known is None:
        return f"event of unknown kind {kind!r}"
    name, valid, what = known
    if not ((type(t) is float or type(t) is int) and math.isfinite(t)):
        return f"event {name} at time {t!r}"
    if not valid(value):
        return f"event {name} whose value is {value!r} (it takes {what})"
    return None


def keep_valid(events: list) -> tuple[list, int, str | None]:
    """``events`` without the bad ones: (the good ones in order, how many were dropped, what
    was wrong with the first dropped)."""
    good, first, dropped, values = [], None, 0, VALUES
    for event in events:
        kind, t, value = event
        known = values.get(kind)
        if known is not None and type(t) is float and t - t == 0.0 and known[1](value):  # problem(), the usual case
            good.append(event)
            continue
        wrong = problem(kind, t, value)
        if wrong is None:
            good.append(event)
        else:
            dropped += 1
            first = first or wrong
    return good, dropped, first


__all__ = ["VALUES", "keep_valid", "problem"]
