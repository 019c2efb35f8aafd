"""Issue 41 part 2: --trace on-alert, a bounded torch.profiler window over the steps after a live alert."""

from __future__ import annotations

import threading
import time

import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.runtime.hooks.activity import ActivityLog
from gpuprof_jupyter.runtime.hooks.alert_trace import AlertCapture
from gpuprof_jupyter.runtime.hooks.trace_window import parse_trace
from gpuprof_jupyter.runtime.run_options import RunOptions
from tests.test_trace_window import FakeProfiler


def _capture(log, notes, saved, **kw):
    activity = ActivityLog(0.0)

    def save(trace, name):
        saved.append((name, trace))
        return name, 1000

    capture = AlertCapture(parse_trace("on-alert"), 0.0, 1000.0, notes, activity, save,
                           make_profiler=lambda: (FakeProfiler(log), ["cpu"]), **kw)
    capture.begin()
    return capture, activity


def _alert(rule="sm_util < 50 for >30% within step", t_s=10.0):
    return {"rule": rule, "t_s": t_s, "span": "step", "evidence": "sm_util < 50 % for 60 % of step 3"}


@pytest.mark.parametrize("text, steps", [("on-alert", 5), ("on-alert=3", 3), (" on-alert = 12 ", 12)])
def test_parse_on_alert(text, steps):
    spec = parse_trace(text)
    assert (spec.kind, spec.stop, str(parse_trace(str(spec)))) == ("on-alert", steps, str(spec))


@pytest.mark.parametrize("text", ["on-alert=0", "on-alert=1000", "on-alert=x", "onalert"])
def test_parse_on_alert_rejects(text):
    with pytest.raises(ValueError, match="--trace"):
        parse_trace(text)


def test_on_alert_needs_an_alert_rule():
    with pytest.raises(ValueError, match="--alert"):
        RunOptions("x", source="sim", trace="on-alert")
    assert RunOptions("x", source="sim", trace="on-alert", alerts=["sm_util < 50"]).trace.kind == "on-alert"


def test_no_step_is_traced_before_an_alert_and_five_after_it():
    log, notes, saved = [], [], []
    capture, activity = _capture(log, notes, saved)
    for _ in range(7):
        activity.step()
    assert not log and not activity.step_listeners  # untraced steps: no listener at all
    assert capture.alert(_alert())
    for _ in range(10):
        activity.step()
    assert [e for e, _ in log] == ["start", "stop"]
    (record,) = capture.info["captures"]
    assert (record["first_step"], record["end_step"], record["steps"], record["status"]) == (8, 13, 5, "complete")  # from the next step boundary
    assert record["alert"]["rule"] == "sm_util < 50 for >30% within step" and record["file"] == "trace-alert1.json.gz"
    assert [name for name, _ in saved] == ["trace-alert1.json.gz"]
    assert capture.info["file"] == "trace-alert1.json.gz" and capture.info["spec"] == "on-alert=5"
    assert not activity.step_listeners  # the capture is over: steps cost what they cost untraced


def test_one_capture_per_rule_per_interval_and_one_at_a_time():
    log, notes, saved = [], [], []
    capture, activity = _capture(log, notes, saved, interval_s=600.0)
    assert capture.alert(_alert(t_s=10.0))
    assert not capture.alert(_alert("cpu_util > 90", t_s=11.0))  # another capture is running
    for _ in range(6):
        activity.step()
    assert not capture.alert(_alert(t_s=300.0))  # the same rule within 10 min
    assert capture.alert(_alert("cpu_util > 90", t_s=301.0))  # another rule: its own interval
    for _ in range(6):
        activity.step()
    assert capture.alert(_alert(t_s=611.0))  # 10 min later
    for _ in range(6):
        activity.step()
    capture.close(18)
    assert [r["alert"]["t_s"] for r in capture.info["captures"]] == [10.0, 301.0, 611.0]
    assert any("2 alert(s) not traced" in n for n in notes)


def test_no_capture_once_the_run_spent_its_trace_budget():
    log, notes, saved = [], [], []
    capture, activity = _capture(log, notes, saved, interval_s=0.0, max_bytes=1500)
    assert capture.alert(_alert(t_s=1.0))
    for _ in range(6):
        activity.step()
    assert capture.alert(_alert(t_s=2.0))  # 1000 bytes saved: under the cap
    for _ in range(6):
        activity.step()
    assert not capture.alert(_alert(t_s=3.0))  # 2000 bytes: over it
    capture.close(12)
    assert len(capture.info["captures"]) == 2 and any("captures reached 1 KiB" in n for n in notes)  # not "0 MiB"


def test_a_run_ending_inside_a_capture_keeps_it_partial():
    log, notes, saved = [], [], []
    capture, activity = _capture(log, notes, saved)
    capture.alert(_alert())
    for _ in range(3):
        activity.step()
    capture.close(3)
    (record,) = capture.info["captures"]
    assert (record["status"], record["steps"]) == ("partial", 2)


def test_steps_from_another_thread_take_no_capture():
    log, notes, saved = [], [], []
    capture, activity = _capture(log, notes, saved)
    capture.alert(_alert())
    thread = threading.Thread(target=lambda: [activity.step() for _ in range(3)])
    thread.start()
    thread.join()
    assert not log and not capture.info["captures"] and any("another thread" in n for n in notes)
    assert capture.alert(_alert(t_s=700.0))  # the next alert may try again


def _batches(n: int, slow_from: int):
    for i in range(n):
        time.sleep(0.15 if i >= slow_from else 0.0)  # the planted slowdown: the data stops coming in time
        yield 32


@pytest.mark.process
def test_a_live_alert_on_a_planted_slowdown_traces_five_steps(store_dir):
    import torch

    model, opt = torch.nn.Linear(16, 16), None
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 16)
    rule = "sm_util < 50 for >50% within step"
    with gp.profile(name="slowed", source="sim:compute-bound", store=store_dir, interval=0.02, alerts=[rule],
                    trace="on-alert") as p:
        for i, _ in enumerate(gp.track(_batches(60, slow_from=8))):
            with torch.profiler.record_function(f"iteration {i}"):
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
            time.sleep(0.1)
            gp.step(32)
            if p.session.trace_window.info["captures"] and i > p.session.trace_window.info["captures"][0]["end_step"] + 2:
                break
    exp = Store(store_dir).load("slowed")
    (capture,) = exp.meta.trace["captures"]  # one capture: the rule fired more than once, traced once
    assert capture["steps"] == 5 and capture["status"] == "complete" and capture["alert"]["rule"] == rule
    first = capture["first_step"]
    assert first >= 8  # after the slowdown, not before
    names = {e["name"] for e in exp.trace["traceEvents"] if e.get("cat") == "user_annotation"}
    traced = {n for n in names if n.startswith("iteration ")}
    assert traced == {f"iteration {i}" for i in range(first, first + 5)}  # those 5 steps only
    assert exp.meta.alerts and any(a["rule"] == rule and a["t_s"] == capture["alert"]["t_s"] for a in exp.meta.alerts)
    assert exp.summary["trace"]["steps"] == 5
    (window,) = exp.summary["trace"]["breakdowns"]  # where the capture's time went (issue 41 part 4)
    assert window["alert"] == rule and window["ranks"][0]["kind"] == "cpu"


def test_a_capture_that_fails_to_start_is_said_and_the_next_alert_may_try():
    log, notes = [], []
    activity = ActivityLog(0.0)
    capture = AlertCapture(parse_trace("on-alert"), 0.0, 1000.0, notes, activity, lambda trace, name: (name, 1),
                           make_profiler=lambda: (FakeProfiler(log, fail_start=True), ["cpu"]))
    capture.begin()
    assert capture.alert(_alert())
    activity.step()
    assert capture.info["status"] == "failed" and any("did not start" in n for n in notes)
    assert not activity.step_listeners and capture.alert(_alert("cpu_util > 90"))


class _Traces:
    """A store's trace reader, from a dict of file name -> trace."""

    def __init__(self, traces):
        self.traces = traces

    def trace(self, name=None):
        return self.traces[name or "trace-alert1.json.gz"]


def _capture_record(k, start_s, rule):
    return {"window": f"steps={k * 10}:{k * 10 + 5}", "status": "complete", "first_step": k * 10,
            "end_step": k * 10 + 5, "steps": 5, "start_s": start_s, "end_s": start_s + 3.0,
            "file": f"trace-alert{k}.json.gz", "alert": {"rule": rule, "t_s": start_s - 1.0, "evidence": "e"}}


def test_every_capture_is_merged_into_the_trace_and_named_beside_its_alert():
    from gpuprof_jupyter.render.chrome_trace import PID, TID_ALERTS, merged_trace
    from gpuprof_jupyter.render.findings_html import analysis_html, analysis_text
    from tests.simexp import sim_experiment, steps_frame

    exp = sim_experiment(seconds=30, steps=steps_frame(30, 30.0, 0.5))
    wall0 = 1_700_000_000.0
    first, second = _capture_record(1, 5.0, "sm_util < 50"), _capture_record(2, 20.0, "power_w > 300")
    exp.meta.trace = {"spec": "on-alert=5", "trigger": "alert", "wall0": wall0, "activities": ["cpu"],
                      **{k: first[k] for k in ("status", "start_s", "end_s", "file", "steps")},
                      "captures": [first, second]}
    exp.meta.alerts = [{"rule": "sm_util < 50", "t_s": 4.0, "span": "step", "measured": 0.6, "measured_s": 1.0,
                        "evidence": "sm low"}]
    op = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100.0, "dur": 5.0}
    exp._loader = _Traces({f"trace-alert{k}.json.gz": {"baseTimeNanoseconds": int((wall0 + s) * 1e9),
                                                        "traceEvents": [dict(op)]} for k, s in ((1, 5.0), (2, 20.0))})
    events = merged_trace(exp)["traceEvents"]
    ops = sorted(e["ts"] for e in events if e.get("name") == "aten::mm")
    assert ops == pytest.approx([100.0, 100.0 + 15e6])  # the second capture on the first one's clock
    spans = [e for e in events if e.get("pid") == PID and e.get("tid") == TID_ALERTS and e.get("ph") == "X"]
    assert [s["name"] for s in spans] == ["alert: sm_util < 50", "alert: power_w > 300"]
    assert "traced: steps 10 to 14 (complete), trace-alert1.json.gz" in "\n".join(analysis_text(exp))
    assert "gpuprof-alert-trace" in analysis_html(exp)
