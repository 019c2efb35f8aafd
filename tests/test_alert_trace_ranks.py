"""Issue 41 part 2 under ``gpuprof run``: ``--trace on-alert`` traces the offending rank only.

Rules on each rank's steps (``data_wait_frac > 0.3``) name the rank; the run asks that rank's
process over the children's channel; the rank traces its next steps and sends the capture back."""

from __future__ import annotations

import gzip
import json
import socket
import sys
import time

import pytest

from gpuprof_jupyter.core.analysis.live_alerts import LiveAlertEvaluator, parse_alerts
from gpuprof_jupyter.core.analysis.rules import RuleError
from gpuprof_jupyter.core.child_channel import CAPTURE, EVENTS, HELLO, TRACE_REQUEST, encode, pack_events
from gpuprof_jupyter.runtime.hooks.activity import ActivityLog
from gpuprof_jupyter.runtime.hooks.alert_trace import AlertCapture
from gpuprof_jupyter.runtime.hooks.trace_window import parse_trace
from gpuprof_jupyter.runtime.jobs.child_capture import RequestedCaptures
from gpuprof_jupyter.runtime.jobs.children_listener import ChildListener
from gpuprof_jupyter.runtime.record.events import STEP, WAIT_END, WAIT_START
from tests.test_trace_window import FakeProfiler

RULE = "data_wait_frac > 0.3"


# -- the rule names the rank -------------------------------------------------------------------
def test_a_step_figure_rule_is_judged_per_rank_and_names_the_worst():
    evaluator = LiveAlertEvaluator([RULE], 0.1)
    fired, t = [], 0.0
    for i in range(30):
        t += 0.1
        evaluator.add_step(t, 0.1, 0.0, 0)  # rank 0 waits at the all-reduce, inside its step: no data wait
        evaluator.add_step(t, 0.1, 0.08 if i >= 10 else 0.0, 1)  # rank 1 waits for its data from step 10 on
        evaluator.add_step(t, 0.1, 0.07 if i >= 10 else 0.0, 2)  # rank 2 less
        if i % 10 == 9:  # the sampler process judges once a second
            fired += evaluator.evaluate(t)
    (alert,) = fired  # once: the rule's rate limit
    assert alert.rank == 1 and alert.rule == RULE
    assert alert.evidence.startswith("rank 1: data_wait_frac") and "also rank 2" in alert.evidence
    assert alert.to_dict()["rank"] == 1


def test_a_rank_is_judged_once_it_has_three_steps_and_the_own_process_has_no_rank():
    evaluator = LiveAlertEvaluator(["step_time_p50_s > 0.5"], 0.1)
    evaluator.add_step(1.0, 1.0, 0.0)
    evaluator.add_step(2.0, 1.0, 0.0)
    assert evaluator.evaluate(2.0) == []  # two steps: not judged yet
    evaluator.add_step(3.0, 1.0, 0.0)
    (alert,) = evaluator.evaluate(3.0)
    assert alert.rank is None and alert.evidence.startswith("this process: step_time_p50_s")


def test_an_alert_on_another_figure_is_refused_naming_the_step_figures():
    assert [r.metric for r in parse_alerts(["step_time_p95_s > 2", "steps_per_s < 3"])] == ["step_time_p95_s",
                                                                                          "steps_per_s"]
    with pytest.raises(RuleError, match="a figure of each rank's steps .*data_wait_frac"):
        parse_alerts(["samples_per_s < 100"])


# -- the run asks the rank ---------------------------------------------------------------------
class _Children:
    """The run's ChildListener as AlertCapture sees it."""

    def __init__(self, ranks=(0, 1)):
        self.ranks, self.asked = list(ranks), []

    def training(self):
        return self.ranks

    def request_trace(self, rank, steps, name, alert):
        self.asked.append((rank, steps, name, alert["rule"]))
        if rank is None and len(self.ranks) != 1:
            return None, "the alert names no rank"
        return (self.ranks[0] if rank is None else rank), None


def _remote(children, notes, kept):
    capture = AlertCapture(parse_trace("on-alert"), 0.0, 1000.0, notes, ActivityLog(0.0), None, children=children,
                           keep=lambda path, name: (kept.append((path, name)) or name, 4096))
    capture.begin()
    return capture


def test_an_alert_naming_a_rank_asks_that_rank_and_its_capture_comes_back():
    children, notes, kept = _Children(), [], []
    capture = _remote(children, notes, kept)
    assert capture.alert({"rule": RULE, "t_s": 9.0, "span": "window", "evidence": "rank 1: ...", "rank": 1})
    assert children.asked == [(1, 5, "trace-alert1.json.gz", RULE)]
    assert not capture.activity.step_listeners  # nothing traced in the run's own process
    assert not capture.alert({"rule": "cpu_util > 90", "t_s": 9.5, "rank": 0})  # one capture at a time
    window = {"window": "steps=29:34", "status": "complete", "first_step": 29, "end_step": 34, "steps": 5,
              "start_s": 9.6, "end_s": 11.0, "file": "trace-alert1.json.gz", "bytes": 4000,
              "alert": {"rule": RULE, "t_s": 9.0, "rank": 1}}
    capture.captured(1, window, "/tmp/x/trace-alert1.json.gz")
    (record,) = capture.info["captures"]
    assert (record["rank"], record["file"], record["bytes"]) == (1, "trace-alert1.json.gz", 4096)
    assert kept == [("/tmp/x/trace-alert1.json.gz", "trace-alert1.json.gz")]
    assert capture.info["rank"] == 1 and capture.info["file"] == "trace-alert1.json.gz"
    assert capture.alert({"rule": "cpu_util > 90", "t_s": 12.0, "rank": 0})  # free again
    capture.captured(1, dict(window, first_step=50), None)  # a late answer from another rank: kept, rank 0 still due
    assert len(capture.info["captures"]) == 2 and capture.info["captures"][1]["file"] is None
    assert not capture.alert({"rule": "power_w > 300", "t_s": 13.0, "rank": 1})
    capture.close(40)
    capture.finish(None)
    assert any("rank 0 was asked for a trace" in n for n in notes)  # never came back


def test_an_alert_without_a_rank_asks_the_only_training_child_and_is_skipped_among_several():
    children, notes = _Children(ranks=(0,)), []
    capture = _remote(children, notes, [])
    assert capture.alert({"rule": "sm_util < 50", "t_s": 5.0})
    assert children.asked[-1][0] is None
    several = _remote(_Children(ranks=(0, 1)), notes, [])
    assert not several.alert({"rule": "sm_util < 50", "t_s": 5.0})
    several.close(3)
    assert any("names no rank" in n for n in notes)


# -- the channel: a request one way, the capture the other ---------------------------------------
def _connect(listener, rank):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(listener.path)
    sock.sendall(encode(HELLO, pid=12345, rank=rank, world_size=2))
    return sock


def _wait(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_listener_asks_the_rank_and_numbers_its_capture_as_the_run_counts_its_steps():
    t0 = time.monotonic()
    listener = ChildListener(t0, time.time()).start()
    got = []
    listener.on_capture = lambda rank, window, path: got.append((rank, window, path))
    rank0, rank1 = _connect(listener, 0), _connect(listener, 1)
    try:
        steps = [(STEP, t0 + 0.1 * (i + 1), None) for i in range(12)]
        rank1.sendall(encode(EVENTS, **pack_events(steps), as_of=t0 + 1.3))
        _wait(lambda: len(listener.training()) == 2)
        rank, why = listener.request_trace(1, 5, "trace-alert1.json.gz", {"rule": RULE, "t_s": 1.0})
        assert (rank, why) == (1, None)
        rank1.settimeout(10)
        request = json.loads(rank1.makefile("rb").readline())
        assert (request["type"], request["steps"], request["name"]) == (TRACE_REQUEST, 5, "trace-alert1.json.gz")
        with gzip.open(listener._dir + "/trace-alert1.json.gz", "wt") as f:
            json.dump({"traceEvents": []}, f)
        # the child counted its steps from when it was asked: its first traced step was its 1st
        window = {"window": "steps=1:6", "first_step": 1, "end_step": 6, "steps": 5, "start_s": 1.2 + 1e-6,
                  "status": "complete", "file": "trace-alert1.json.gz", "bytes": 10}
        rank1.sendall(encode(CAPTURE, window=window))
        _wait(lambda: got)
        (rank, window, path) = got[0]
        assert rank == 1 and (window["first_step"], window["end_step"], window["window"]) == (12, 17, "steps=12:17")
        assert path == listener._dir + "/trace-alert1.json.gz"
        assert listener.request_trace(5, 5, "x", {})[0] is None  # no such rank
    finally:
        rank0.close()
        rank1.close()
        listener.close(timeout=0)
        listener.remove_files()


def test_a_child_traces_its_next_steps_when_asked_and_sends_the_capture_after_its_events(tmp_path, monkeypatch):
    import gpuprof_jupyter.runtime.jobs.child_capture as child_capture

    log, sent = [], []

    class _Run:  # the ChildRun's parts RequestedCaptures uses
        activity = ActivityLog(0.0)
        path = str(tmp_path / "channel.sock")
        trace_notes: list = []
        _lock = __import__("threading").Lock()

        def send_events(self):
            sent.append(("events", len(self.activity.forward or [])))

        def _send(self, message):
            sent.append(("capture", json.loads(message)))

    original = child_capture.AlertCapture
    monkeypatch.setattr(child_capture, "AlertCapture", lambda *a, **kw: original(
        *a, **kw, make_profiler=lambda: (FakeProfiler(log), ["cpu"])))
    run = _Run()
    captures = RequestedCaptures(run)
    ours, theirs = socket.socketpair()
    try:
        captures.poll(ours)  # nothing asked: nothing happens, nothing waits
        assert captures.capture is None and run.activity.forward is None
        for _ in range(3):
            run.activity.emit((WAIT_START, time.monotonic(), None))
            run.activity.emit((WAIT_END, time.monotonic(), 4))
            run.activity.step()
        theirs.sendall(encode(TRACE_REQUEST, steps=2, name="trace-alert1.json.gz", alert={"rule": RULE, "t_s": 3.0}))
        captures.poll(ours)
        assert len(run.activity.forward) == 9  # it folds its events from now on (and forwards them as they were)
        for _ in range(4):
            run.activity.step()
    finally:
        ours.close()
        theirs.close()
    kinds = [kind for kind, _ in sent]
    assert kinds == ["events", "capture"]  # the steps' events first, then the capture
    window = sent[1][1]["window"]
    assert (window["steps"], window["status"], window["file"]) == (2, "complete", "trace-alert1.json.gz")
    assert (tmp_path / "trace-alert1.json.gz").exists() and window["alert"]["rule"] == RULE
    assert not run.activity.step_listeners  # the window closed: untraced steps again
    assert run.trace_notes and all(n.startswith(f"gpuprof: trace on-alert=2 after {RULE}:") for n in run.trace_notes)


# -- for real: torchrun, two ranks, rank 1 slowed --------------------------------------------------
@pytest.mark.process
def test_gpuprof_run_traces_five_steps_of_the_slowed_rank_only(store_dir, tmp_path, monkeypatch, capsys):
    from gpuprof_jupyter.cli import main
    from gpuprof_jupyter.core.store.directory import Store
    from tests.test_scripts import SCRIPTS

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    rc = main(["run", "--store", str(store_dir), "--source", "sim", "--interval", "0.05", "-n", "slowed",
               "--trace", "on-alert", "--alert", RULE, "--",
               sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "--monitor-interval", "0.1", str(SCRIPTS / "train_ddp.py"), "--steps", "80", "--slow-rank", "1",
               "--slow-from", "20"])
    exp = Store(store_dir).load("slowed")
    assert rc == 0 and exp.status == "ok", (exp.meta.error, exp.meta.notes)
    (capture,) = exp.meta.trace["captures"]  # one: the rule held on, its rate limits held
    assert (capture["rank"], capture["steps"], capture["status"]) == (1, 5, "complete"), capture
    assert capture["alert"]["rank"] == 1 and capture["first_step"] >= 20  # after the slowdown, on rank 1
    assert capture["window"] == f"steps={capture['first_step']}:{capture['first_step'] + 5}"
    assert all(a.get("rank") == 1 for a in exp.meta.alerts if a["rule"] == RULE) and exp.meta.alerts
    trace = exp.trace  # rank 1's process, and only its
    assert trace["distributedInfo"]["rank"] == 1
    assert sum(1 for e in trace["traceEvents"] if e.get("name") == "ProfilerStep#" or e.get("cat") == "cpu_op") > 0
    assert exp.summary["trace"]["steps"] == 5
    assert "traced: rank 1, steps" in capsys.readouterr().out
    assert main(["trace", "slowed", "--store", str(store_dir), "-o", str(tmp_path / "merged.json")]) == 0
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert any(e.get("name") == f"alert: {RULE}" for e in merged["traceEvents"])
