"""The --trace window: when it starts and stops, what it records, and that it never breaks a run."""

from __future__ import annotations

import json
import threading

import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.runtime.hooks.trace_window import MAX_STEPS, TraceWindow, cap_events, parse_trace
from gpuprof_jupyter.core.store.directory import Store


class FakeProfiler:
    def __init__(self, log, fail_start=False):
        self.log, self.fail_start = log, fail_start

    def start(self):
        if self.fail_start:
            raise RuntimeError("kineto says no")
        self.log.append(("start", threading.get_ident()))

    def stop(self):
        self.log.append(("stop", threading.get_ident()))

    def export_chrome_trace(self, path):
        with open(path, "w") as f:
            json.dump({"baseTimeNanoseconds": 0, "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm",
                                                                   "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0}]}, f)


def window(spec, log, notes, fail_start=False):
    return TraceWindow(parse_trace(spec), t0=0.0, wall0=1000.0, notes=notes,
                       make_profiler=lambda: (FakeProfiler(log, fail_start), ["cpu"]))


@pytest.mark.parametrize("text, kind, start, stop", [
    ("steps=20:25", "steps", 20, 25), ("steps = 0:1", "steps", 0, 1), ("seconds=30:5", "seconds", 30.0, 5.0),
    ("seconds=0.5:0.25", "seconds", 0.5, 0.25),
])
def test_parse_trace(text, kind, start, stop):
    spec = parse_trace(text)
    assert (spec.kind, spec.start, spec.stop) == (kind, start, stop)


@pytest.mark.parametrize("text", ["steps=5:5", "steps=5:3", "steps=1.5:3", "seconds=3:0", "step=1:2", "20:25", ""])
def test_parse_trace_rejects(text):
    with pytest.raises(ValueError, match="--trace"):
        parse_trace(text)


def test_steps_window_starts_and_stops_at_the_right_boundaries():
    log, notes = [], []
    w = window("steps=3:5", log, notes)
    w.begin()
    for count in range(1, 9):  # after step count-1 ended
        w.on_step(count, float(count))
        started = any(e == "start" for e, _ in log)
        stopped = any(e == "stop" for e, _ in log)
        assert started == (count >= 3) and stopped == (count >= 5), count
    assert w.info["first_step"] == 3 and w.info["end_step"] == 5 and w.info["steps"] == 2
    assert w.info["status"] == "complete" and (w.info["start_s"], w.info["end_s"]) == (3.0, 5.0)
    assert [e for e, _ in log] == ["start", "stop"]
    assert all(tid == threading.get_ident() for _, tid in log)  # on the training thread


def test_step_zero_starts_with_the_session():
    log, notes = [], []
    w = window("steps=0:2", log, notes)
    w.begin()
    assert [e for e, _ in log] == ["start"]
    w.on_step(1, 0.1)
    w.on_step(2, 0.2)
    assert [e for e, _ in log] == ["start", "stop"] and w.info["first_step"] == 0


def test_seconds_window_applies_at_step_boundaries():
    log, notes = [], []
    w = window("seconds=1:0.5", log, notes)
    w.begin()
    for count, now in enumerate([0.4, 0.9, 1.2, 1.5, 1.69, 1.8, 2.5], start=1):
        w.on_step(count, now)
    assert w.info["first_step"] == 3 and w.info["start_s"] == 1.2  # first boundary past 1 s
    assert w.info["end_step"] == 6 and w.info["end_s"] == 1.8  # first boundary 0.5 s later


def test_partial_window_is_kept_and_said_so(tmp_path):
    log, notes = [], []
    w = window("steps=2:10", log, notes)
    w.begin()
    for count in range(1, 5):
        w.on_step(count, float(count))
    w.close(4)
    info = w.finish(lambda trace: "trace.json.gz")
    assert info["status"] == "partial" and info["steps"] == 2 and info["file"] == "trace.json.gz"
    assert any("partial window" in n and "steps 2 to 3" in n for n in notes)
    assert any("CPU activities only" in n for n in notes)


def test_window_never_reached_is_a_note():
    log, notes = [], []
    w = window("steps=50:60", log, notes)
    w.begin()
    w.on_step(1, 1.0)
    w.close(1)
    assert w.finish(lambda trace: "x")["status"] == "not reached" and not log
    assert any("ended before the window" in n for n in notes)


def test_window_is_capped():
    log, notes = [], []
    w = window(f"steps=0:{MAX_STEPS * 10}", log, notes)
    w.begin()
    for count in range(1, MAX_STEPS + 5):
        w.on_step(count, count * 0.001)
    assert w.info["status"] == "capped" and w.info["steps"] == MAX_STEPS
    assert any("capped" in n for n in notes)


def test_start_failure_is_a_note_and_the_loop_goes_on():
    log, notes = [], []
    w = window("steps=1:3", log, notes, fail_start=True)
    w.begin()
    for count in range(1, 5):
        w.on_step(count, float(count))  # never raises
    assert w.info["status"] == "failed" and any("did not start" in n and "kineto says no" in n for n in notes)


def test_steps_from_another_thread_leave_the_window_unstarted():
    log, notes = [], []
    w = window("steps=0:3", log, notes)
    w.begin()  # step 0 starts with the session, on this thread
    t = threading.Thread(target=lambda: w.on_step(1, 1.0))
    t.start()
    t.join()
    assert any("another thread" in n for n in notes)
    assert [e for e, _ in log] == ["start"]  # never stopped from the other thread (that crashes torch)


def test_cap_events_keeps_metadata_and_the_earliest():
    trace = {"traceEvents": [{"ph": "M", "name": "process_name"}]
             + [{"ph": "X", "ts": float(i), "dur": 1.0} for i in range(10, 0, -1)]}
    assert cap_events(trace, 4) == 6
    assert [e.get("ts") for e in trace["traceEvents"]] == [None, 1.0, 2.0, 3.0, 4.0]


TRAIN = """
import torch
from torch.profiler import record_function
torch.manual_seed(0)
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(32, 64)
"""


def _loop(steps):
    ns: dict = {}
    exec(TRAIN, ns)
    for i in range(steps):
        with ns["record_function"](f"iteration {i}"):
            loss = ns["model"](ns["x"]).sum()
            ns["opt"].zero_grad()
            loss.backward()
            ns["opt"].step()
        gp.step(32)


@pytest.mark.process
def test_cpu_torch_loop_traces_steps_3_to_4(store_dir):
    with gp.profile(name="traced", source="sim", store=store_dir, trace="steps=3:5") as p:
        _loop(8)
    exp = Store(store_dir).load("traced")
    info = exp.meta.trace
    assert (info["status"], info["first_step"], info["end_step"], info["activities"]) == ("complete", 3, 5, ["cpu"])
    names = {e["name"] for e in exp.trace["traceEvents"] if e.get("cat") == "user_annotation"}
    assert {"iteration 3", "iteration 4"} <= names
    assert not names & {f"iteration {i}" for i in (0, 1, 2, 5, 6, 7)}  # only the window's steps
    table = exp.summary["trace"]
    assert table["operator_time"] == "cpu" and table["steps"] == 2
    assert table["operators"] and table["operators"][0]["self_s"] > 0
    assert {"aten::addmm", "aten::mm"} & {r["name"] for r in table["operators"]}
    assert table["overhead"]["step_p50_in_s"] > 0 and table["overhead"]["slowdown"] > 0
    phases = [ph["name"] for ph in exp.meta.phases if ph.get("source") == "record_function"]
    assert phases == ["iteration 3", "iteration 4"]  # record_function ranges inside the window
    assert p.experiment.meta.trace["file"] == "trace.json.gz"


@pytest.mark.process
def test_a_trace_that_fails_to_start_never_breaks_the_run(store_dir, monkeypatch):
    from gpuprof_jupyter.runtime.hooks import trace_window

    def broken():
        raise OSError("no profiler here")

    monkeypatch.setattr(trace_window, "_torch_profiler", broken)
    with gp.profile(name="untraced", source="sim", store=store_dir, trace="steps=1:3"):
        _loop(4)
    exp = Store(store_dir).load("untraced")
    assert exp.status == "ok" and exp.meta.trace["status"] == "failed"
    assert any("did not start" in n for n in exp.meta.notes)
    assert exp.trace is None and exp.summary["trace"]["status"] == "failed"


def test_bad_trace_spec_is_refused_before_anything_starts(store_dir):
    with pytest.raises(ValueError, match="--trace"):
        gp.profile(name="x", source="sim", store=store_dir, trace="steps=5:2").__enter__()


@pytest.mark.process
def test_experiments_without_a_trace_still_load(store_dir):
    with gp.profile(name="old", source="sim", store=store_dir):
        pass
    store = Store(store_dir)
    meta_path = store.directory(store.resolve("old")) / "meta.json"
    data = json.loads(meta_path.read_text())
    data.pop("trace")  # as written before --trace existed
    data["summary"] = {}
    meta_path.write_text(json.dumps(data))
    exp = store.load("old")
    assert exp.meta.trace == {} and exp.trace is None and "trace" not in exp.summary
    from gpuprof_jupyter.render.summary_html import render_summary_html

    assert "traced window" not in render_summary_html(exp)
