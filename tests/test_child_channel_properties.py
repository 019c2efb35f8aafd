"""Property tests of the children's channel parser (``core/child_channel.parse``) and of a
listener's reader (``runtime/jobs/children_listener.ChildListener``): whatever another process
writes, only ``Malformed`` comes out of the parser, and a reader fed any bytes ends with at
most one note while another child's steps stay as they were. Fast: a few seconds."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.property_budget import examples

from gpuprof_jupyter.core.child_channel import (CAPTURE, EVENTS, FINAL, HELLO, Batch, Capture, Final, Hello, Malformed,
                                                encode, pack_events, parse)
from gpuprof_jupyter.runtime.jobs.children_listener import ChildListener, _Reader
from gpuprof_jupyter.runtime.record.events import STEP

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
field_names = st.sampled_from(["type", "pid", "rank", "local_rank", "world_size", "argv", "process_index",
                               "forked_from", "kinds", "times", "values", "as_of", "params", "phases", "notes",
                               "user_metrics", "trace", "error", "device", "torch_filled", "window"])
capture_windows = st.dictionaries(st.sampled_from(["file", "bytes", "start_s", "end_s", "first_step", "end_step",
                                                   "steps", "events", "status", "window", "activities", "alert"]),
                                  json_values, max_size=6)
messages = st.dictionaries(field_names, json_values | st.sampled_from([HELLO, EVENTS, FINAL, CAPTURE]), max_size=8)
lines = st.one_of(
    st.binary(max_size=200).map(lambda b: b + b"\n"),
    messages.map(lambda m: (json.dumps(m) + "\n").encode()),
    st.builds(lambda kind, m: (json.dumps({**m, "type": kind}) + "\n").encode(),
              st.sampled_from([HELLO, EVENTS, FINAL, CAPTURE]), messages),
    capture_windows.map(lambda w: encode(CAPTURE, window=w)),
    st.integers(1, 3000).map(lambda depth: b"[" * depth + b"]" * (depth % 2) * depth + b"\n"),
)


@settings(max_examples=examples(200), deadline=None)
@given(lines)
def test_parse_gives_a_checked_record_or_malformed_and_nothing_else(line):
    try:
        record = parse(line)
    except Malformed:
        return
    assert isinstance(record, (Hello, Batch, Final, Capture))
    if isinstance(record, Hello):
        assert isinstance(record.pid, int) and record.pid > 0 and all(isinstance(a, str) for a in record.argv)
    if isinstance(record, Batch):
        assert all(isinstance(t, float) for _, t, _ in record.events)
    if isinstance(record, Final):
        assert all(isinstance(p["name"], str) for p in record.phases)
    if isinstance(record, Capture):  # what the run renumbers and the views print, each of its kind
        w = record.window
        assert all(w.get(k) is None or (type(w[k]) is int and w[k] >= 0) for k in ("first_step", "end_step", "steps"))
        assert all(w.get(k) is None or type(w[k]) in (int, float) for k in ("start_s", "end_s"))
        assert all(w.get(k) is None or isinstance(w[k], str) for k in ("status", "window"))


GOOD_CAPTURE = {"file": "trace-alert1.json.gz", "bytes": 19_000, "first_step": 3, "end_step": 8, "steps": 5,
                "start_s": 1.5, "end_s": 2.5, "status": "complete", "window": "steps=3:8", "activities": ["cpu"],
                "alert": {"rule": "data_wait_frac > 0.3", "t_s": 1.2}}


@pytest.mark.parametrize("bad", [{"first_step": "3"}, {"first_step": True}, {"end_step": -1}, {"start_s": "1.5"},
                                 {"start_s": float("nan")}, {"events": 1.5}, {"status": 3}, {"window": ["steps"]},
                                 {"activities": [1]}, {"alert": "rule"}, {"file": "../x.json.gz"}, {"bytes": "1 KB"}])
def test_a_capture_with_a_value_of_another_kind_is_malformed(bad):
    assert isinstance(parse(encode(CAPTURE, window=GOOD_CAPTURE)), Capture)
    with pytest.raises(Malformed, match="Capture.window"):
        parse(encode(CAPTURE, window={**GOOD_CAPTURE, **bad}))


@pytest.fixture(scope="module")
def listener():
    made = ChildListener(time.monotonic(), time.time())  # never started: readers are called directly
    yield made
    made.remove_files()


def _read(listener: ChildListener, data: bytes) -> None:
    """What one connection that sends ``data`` leaves: the reader runs here, to its end."""
    ours, theirs = socket.socketpair()
    sender = threading.Thread(target=lambda: (theirs.sendall(data), theirs.close()))
    sender.start()
    listener._read(_Reader(ours, None))
    sender.join()


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(lines, min_size=1, max_size=6))
def test_a_reader_fed_anything_notes_at_most_once_and_leaves_the_other_childs_steps(listener, sent):
    if not listener.children:  # an honest child, read once for all examples
        _read(listener, encode(HELLO, pid=1, rank=0)
              + encode(EVENTS, **pack_events([(STEP, listener.t0 + i, None) for i in range(1, 6)]), as_of=1.0))
    honest = listener.children[0]
    notes_before, failed_before = len(listener.notes), listener._failed_reads
    _read(listener, b"".join(sent))  # raises nothing: every failure is a note
    assert listener._failed_reads - failed_before <= 1
    assert len(listener.notes) - notes_before <= 1
    assert listener.children[0] is honest and len(honest.activity.steps) == 5
