"""The merged trace: torch's events and our counters on one clock, checked against a known event;
``gpuprof trace`` writes it; the report links it."""

from __future__ import annotations

import json
import time

import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.cli import main
from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.render.chrome_trace import PID, NoTrace, merged_trace

KNOWN_S = 0.08


def _traced_run(store_dir):
    import torch
    from torch.profiler import record_function

    model, x = torch.nn.Linear(32, 32), torch.randn(16, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    known = {}
    with gp.profile(name="traced", source="sim", store=store_dir, interval=0.01, trace="steps=3:5"):
        for i in range(7):
            loss = model(x).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i == 3:  # a known event inside the window: the wall clock around its start and end
                before = time.time()
                with record_function("known event"):
                    inside = time.time()
                    time.sleep(KNOWN_S)
                known["wall"] = (before, inside, time.time())
            gp.step(16)
    return Store(store_dir).load("traced"), known["wall"]


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    store_dir = tmp_path_factory.mktemp("trace") / "store"
    exp, wall = _traced_run(store_dir)
    return store_dir, exp, wall


@pytest.mark.process
def test_torch_events_and_counters_share_one_clock(traced):
    store_dir, exp, known_wall = traced
    trace = json.loads(json.dumps(merged_trace(exp)))  # plain JSON
    events = trace["traceEvents"]
    base = trace["baseTimeNanoseconds"] / 1e9
    known = next(e for e in events if e.get("name") == "known event")
    before, inside, after = known_wall  # torch's clock is wall time: its start between the reads around it
    assert before - 0.003 <= base + known["ts"] / 1e6 <= inside + 0.003, (before, base + known["ts"] / 1e6, inside)
    assert KNOWN_S - 0.003 <= known["dur"] / 1e6 <= after - before + 0.003, (known["dur"], after - before)
    # our step 3 (activity log, placed through the session's start) encloses the known event
    step3 = next(e for e in events if e.get("pid") == PID and e.get("name") == "step 3")
    assert step3["ts"] - 3000 <= known["ts"] and known["ts"] + known["dur"] <= step3["ts"] + step3["dur"] + 3000
    # counters: each sample placed through its own wall_time, some inside the known event
    counters = [e for e in events if e.get("ph") == "C" and e["name"] == "gpu0 sm_util (%)"]
    frame = exp.device_frame("gpu0", ["wall_time", "sm_util"])
    walls, values = frame["wall_time"].to_numpy(), frame["sm_util"].to_numpy()
    assert counters
    for c in counters:
        nearest = abs(walls - (base + c["ts"] / 1e6)).argmin()
        assert abs(walls[nearest] - (base + c["ts"] / 1e6)) < 1e-5  # at its sample's wall_time (float us)
        assert values[nearest] == pytest.approx(c["args"]["sm_util"])
    inside = [c for c in counters if known["ts"] <= c["ts"] <= known["ts"] + known["dur"]]
    assert len(inside) >= 3  # 10 ms sampling during an 80 ms event
    names = {e["name"] for e in events if e.get("ph") == "C"}
    assert {"gpu0 sm_util (%)", "gpu0 mem_bw_util (%)", "gpu0 power_w (W)", "host cpu_util (%)",
            "data wait (share of step)"} <= names
    assert any(e.get("cat") == "cpu_op" for e in events)
    assert trace["gpuprof"]["activities"] == ["cpu"]


@pytest.mark.process
def test_gpuprof_trace_command_writes_chrome_trace_json(traced, tmp_path, capsys):
    store_dir, exp, _ = traced
    out = tmp_path / "trace.json"
    assert main(["trace", "traced", "--store", str(store_dir), "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert isinstance(data["traceEvents"], list) and all("ph" in e for e in data["traceEvents"])
    assert {"C", "X", "M"} <= {e["ph"] for e in data["traceEvents"]}
    assert "perfetto" in capsys.readouterr().out


@pytest.mark.process
def test_gpuprof_trace_without_a_window_is_a_usage_error(store_dir, tmp_path, capsys):
    with gp.profile(name="plain", source="sim", store=store_dir):
        pass
    assert main(["trace", "plain", "--store", str(store_dir), "-o", str(tmp_path / "t.json")]) == 2
    assert "has no trace" in capsys.readouterr().err
    with pytest.raises(NoTrace):
        merged_trace(Store(store_dir).load("plain"))


@pytest.mark.process
def test_report_links_the_merged_trace(traced, tmp_path):
    from gpuprof_jupyter.export.report import report

    store_dir, exp, _ = traced
    path = report("traced", path=tmp_path / "report.html", store=store_dir)
    html = path.read_text()
    name = f"report-{exp.id}.trace.json"
    assert f"href='{name}'" in html and "ui.perfetto.dev" in html and "traced window" in html
    assert json.loads((tmp_path / name).read_text())["traceEvents"]
