"""A child's events checked to the value before the run folds them (runtime/record/event_check.py,
runtime/jobs/children_listener.py): a bad event is dropped and counted in one note naming its child; the
run's own steps and the other children's are kept; a hand-over that fails is a note, never
swallowed; a child never sends a NaN time (core/child_channel.pack_sendable, the request hook's
unreadable CUDA events)."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.property_budget import examples

from gpuprof_jupyter.core.child_channel import (CHANNEL_ENV, EVENTS, FINAL, HELLO, encode, pack_events, pack_sendable,
                                                unpack_events)
from gpuprof_jupyter.runtime.hooks.activity import ActivityLog
from gpuprof_jupyter.runtime.jobs.children_listener import ChildListener, _Reader
from gpuprof_jupyter.runtime.record.event_check import VALUES, problem
from gpuprof_jupyter.runtime.record.events import (MEM, OPT_POST, OPT_PRE, REQ_CUDA, REQ_END, REQ_GPU, REQ_MODULE, STEP,
                                                   WAIT_END, WAIT_START, pack_request)
from gpuprof_jupyter.runtime.session import ProfileSession

NAN = math.nan


def _read(listener: ChildListener, data: bytes) -> None:
    """One connection that sends ``data``, read here to its end (the reader runs on this thread)."""
    ours, theirs = socket.socketpair()
    sender = threading.Thread(target=lambda: (theirs.sendall(data), theirs.close()))
    sender.start()
    listener._read(_Reader(ours, 4242))
    sender.join()


def _batch(events: list[tuple]) -> bytes:
    return encode(EVENTS, **pack_events(events), as_of=1.0)


def _child(rank: int, *batches: list[tuple]) -> bytes:
    return (encode(HELLO, pid=4242 + rank, rank=rank) + b"".join(_batch(b) for b in batches)
            + encode(FINAL, params={}))


def _steps(t0: float, n: int) -> list[tuple]:
    return [(STEP, t0 + 0.001 * (i + 1), None) for i in range(n)]


def _session(tmp_path, listener: ChildListener, own_steps: int) -> ProfileSession:
    """A session's hand-over without its sampler process: the run's own steps, its children."""
    session = ProfileSession("checked", source="sim", store=tmp_path / "store")
    session.t0, session.activity, session.children = listener.t0, ActivityLog(listener.t0), listener
    for event in _steps(listener.t0, own_steps):
        session.activity.emit(event)
    return session


def _handed(session: ProfileSession) -> tuple[list, list]:
    events = session.handover()
    return events.steps, events.requests


@pytest.mark.parametrize("event, wrong", [
    ((REQ_MODULE, 1.0, None), "event REQ_MODULE whose value is None"),
    ((REQ_END, 1.0, 2.5), "event REQ_END whose value is 2.5"),
    ((STEP, NAN, None), "event STEP at time nan"),
    ((STEP, math.inf, 8), "event STEP at time inf"),
    ((MEM, 1.0, None), "event MEM whose value is None"),
    ((WAIT_END, 1.0, -7), "event WAIT_END whose value is -7"),
    ((OPT_POST, 1.0, -1), "event OPT_POST whose value is -1"),
    ((0, 1.0, None), "event of unknown kind 0"),
    ((200, 1.0, None), "event of unknown kind 200"),
])
def test_a_bad_field_is_named(event, wrong):
    assert problem(*event).startswith(wrong)


@pytest.mark.parametrize("event", [(STEP, 1.0, None), (STEP, 1.0, 32), (WAIT_START, 1.0, None), (WAIT_END, 1.0, -1),
                                   (WAIT_END, 1.0, 16.0), (OPT_PRE, 1.0, 140_000_000_000_000), (MEM, 1.0, 2 ** 40),
                                   (REQ_MODULE, 1.0, pack_request(3, 8)), (REQ_GPU, 1.0, pack_request(3, 0))])
def test_what_the_hooks_make_is_kept(event):
    assert problem(*event) is None


def test_nan_and_none_request_values_beside_a_good_child_cost_only_themselves(tmp_path):
    """The reproduction: a valid batch whose request values are NaN (None on arrival) or None
    raised TypeError in the hand-over after the run's steps were marked as sent."""
    listener = ChildListener(time.monotonic(), time.time())
    try:
        session = _session(tmp_path, listener, own_steps=30)
        t0 = listener.t0
        _read(listener, _child(0, _steps(t0, 20)))
        bad = [(REQ_MODULE, t0 + 0.01, None), (REQ_END, t0 + 0.02, NAN), *_steps(t0 + 0.02, 4),
               (REQ_MODULE, t0 + 0.03, pack_request(0, 2)), (REQ_END, t0 + 0.04, 0), (REQ_CUDA, t0 + 0.05, None)]
        _read(listener, _child(1, bad, _steps(t0 + 0.1, 3)))  # its later batch is still read: not cut off
        steps, requests = _handed(session)
        assert sum(len(s) == 7 for s in steps) == 30  # the run's own (no rank)
        assert [len([s for s in steps if len(s) == 8 and s[-1] == r]) for r in (0, 1)] == [20, 7]
        assert len(requests) == 1 and requests[0][-1] == 1  # its good request is kept
        listener.close(timeout=0)
        named = [n for n in listener.notes if "rank 1 (pid 4243)" in n]
        assert len(named) == 1 and "3 event(s) with a wrong field were dropped" in named[0], listener.notes
        assert "event REQ_MODULE whose value is None" in named[0]
        assert not [n for n in listener.notes if "rank 0" in n] and not session.notes
    finally:
        listener.remove_files()


def test_a_nan_time_drops_that_event_not_the_child():
    """An unreadable CUDA event's NaN time cut the child off with its whole batch."""
    listener = ChildListener(time.monotonic(), time.time())
    try:
        t0 = listener.t0
        _read(listener, _child(0, [*_steps(t0, 3), (REQ_GPU, NAN, 0), *_steps(t0 + 0.01, 2)]))
        child, = listener.children
        assert len(child.activity.steps) == 5 and not child.dropped
    finally:
        listener.close(timeout=0)
        listener.remove_files()


def test_a_failing_hand_over_is_a_note_and_the_other_parts_go(tmp_path, monkeypatch):
    listener = ChildListener(time.monotonic(), time.time())
    try:
        session = _session(tmp_path, listener, own_steps=5)
        _read(listener, _child(0, _steps(listener.t0, 4)))

        def broken():
            raise RuntimeError("a bug of ours")

        monkeypatch.setattr(session.activity, "take_requests", broken)
        steps, requests = _handed(session)
        steps2, _ = _handed(session)
        assert len(steps) == 9 and steps2 == [] and requests == []
        assert session.notes == ["gpuprof: handing the run's requests to the sampler process failed (RuntimeError: "
                                 "a bug of ours); the rest was handed over, and it is tried again at each hand-over"]
    finally:
        listener.close(timeout=0)
        listener.remove_files()


def test_the_link_tells_the_session_when_its_hand_over_raises():
    from gpuprof_jupyter.runtime.link import SamplerLink

    link, told = SamplerLink(), []

    def handover():
        raise RuntimeError("boom")

    link.handover, link.on_handover_failed = handover, told.append
    link._hand_over()
    assert [str(e) for e in told] == ["boom"]


def test_a_bad_event_of_the_runs_own_process_is_dropped_in_the_fold_and_counted():
    activity = ActivityLog(0.0)
    for event in [(STEP, 1.0, None), (REQ_MODULE, 1.5, None), (STEP, 2.0, None)]:
        activity.emit(event)
    assert len(activity.steps) == 2
    assert activity.unfolded == 1 and "TypeError" in activity.unfolded_note("the run's own process")


def test_a_child_never_sends_a_nan_time_or_a_value_that_is_no_number():
    events = [(STEP, 1.0, None), (REQ_GPU, NAN, 3), (STEP, math.inf, None), (STEP, 2.0, "eight"), (STEP, 3.0, 4)]
    fields, unsent = pack_sendable(events)
    assert unsent == 3 and unpack_events(**fields) == [(STEP, 1.0, None), (STEP, 3.0, 4)]
    assert pack_sendable(events[:1]) == (pack_events(events[:1]), 0)


def test_an_unreadable_cuda_event_gives_the_host_time_and_no_nan(monkeypatch):
    from gpuprof_jupyter.runtime.hooks.requests import RequestTimer

    class Unreadable:
        def __init__(self, enable_timing=False) -> None:
            pass

        def record(self) -> None:
            pass

        def query(self) -> bool:
            raise RuntimeError("CUDA error: an illegal memory access")

    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", Unreadable)
    activity = ActivityLog(0.0)
    timer = RequestTimer(activity.emit, activity.clock)
    token = timer.begin(REQ_MODULE, 2)
    timer.end(token)
    timer.poll()
    events = list(activity.events._queue)
    assert all(math.isfinite(t) for _, t, _ in events) and pack_sendable(events)[1] == 0
    for kind, t, value in unpack_events(**pack_events(events)):  # as the run folds a child's
        activity.requests.apply(kind, t, value)
    request, = activity.requests.records
    assert request.complete and not request.cuda and request.latency_s == request.host_s
    assert timer.notes() and "illegal memory access" in timer.notes()[0]


# -- any field value: the run's other data intact, one note per bad child ----------------------------
kinds = st.sampled_from(sorted(VALUES)) | st.integers(0, 255)
times = st.floats(allow_nan=True, allow_infinity=True) | st.floats(0.0, 1.0)
values = (st.none() | st.floats(allow_nan=True, allow_infinity=True) | st.integers(-2 ** 62, 2 ** 62)
          | st.sampled_from([-1, 0, 3, pack_request(0, 2), pack_request(1), 2 ** 53]))


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(kinds, times, values), max_size=30))
def test_any_event_of_a_child_costs_the_run_nothing_else(tmp_path, sent):
    listener = ChildListener(time.monotonic(), time.time())
    try:
        session = _session(tmp_path, listener, own_steps=30)
        t0 = listener.t0
        shifted = [(k, t0 + t if 0.0 <= t <= 1.0 else t, v) for k, t, v in sent]
        _read(listener, _child(0, _steps(t0, 20)))
        _read(listener, _child(1, shifted))
        steps, _ = _handed(session)
        listener.close(timeout=0)
        steps += session.handover().steps
        assert sum(len(s) == 7 for s in steps) == 30
        assert len([s for s in steps if len(s) == 8 and s[-1] == 0]) == 20
        assert all(c.activity.unfolded == 0 for c in listener.children)  # what passed the check folds
        assert not session.notes and not [n for n in listener.notes if "rank 0" in n]
        named = [n for n in listener.notes if "rank 1 (pid 4243)" in n]
        bad = [e for e in unpack_events(**pack_events(shifted)) if problem(*e)]
        assert len(named) == (1 if bad else 0), listener.notes
        if any(not math.isfinite(t) or k not in VALUES for k, t, _ in shifted):
            assert named
    finally:
        listener.remove_files()


@pytest.mark.process
def test_a_child_sending_nan_and_none_values_beside_a_good_child_loses_nothing_else(store_dir):
    import gpuprof_jupyter as gp

    with gp.profile("nan-values", source="sim", store=store_dir, interval=0.05) as p:
        for _ in range(30):
            gp.step()
        t = time.monotonic()
        bad = [(REQ_MODULE, t, None), (REQ_END, t, NAN), *[(STEP, t + 0.001 * i, None) for i in range(1, 4)]]
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as hostile:
            hostile.connect(os.environ[CHANNEL_ENV])
            hostile.sendall(encode(HELLO, pid=os.getpid(), rank=5) + _batch(bad) + encode(FINAL, params={}))
        good = subprocess.run([sys.executable, "-c", "import gpuprof_jupyter as gp\nfor _ in range(20): gp.step()"],
                              timeout=120)
        assert good.returncode == 0
        time.sleep(1.5)  # a hand-over or two while both are there
    exp = p.experiment
    assert exp.status == "ok" and exp.summary["steps"]["count"] == 30, exp.meta.notes
    ranks = exp.meta.context["ranks"]
    assert ranks["0"]["steps"] == 20 and ranks["5"]["steps"] == 3, ranks
    named = [n for n in exp.meta.notes if "rank 5" in n and "wrong field" in n]
    assert len(named) == 1 and "2 event(s)" in named[0], exp.meta.notes
    assert not [n for n in exp.meta.notes if "handing" in n], exp.meta.notes
