"""``%%gpuprofile --trace`` in a real kernel: the window at the right steps, the operator table
in the summary, a bad window refused before the cell runs."""

from __future__ import annotations

import json

import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.cli import main
from tests.kernel_helpers import execute, running_kernel, text_of
from tests.test_magic_kernel import TRAIN  # 8 steps of a torch CPU loop

pytestmark = pytest.mark.kernel



def test_trace_steps_3_to_5_in_a_kernel(tmp_path):
    store = tmp_path / "store"
    with running_kernel(tmp_path, {"GPUPROF_STORE": str(store)}) as (km, kc):
        reply, _ = execute(kc, "%load_ext gpuprof_jupyter\nimport gpuprof_jupyter")
        assert reply["status"] == "ok"
        reply, messages = execute(kc, "%%gpuprofile --source sim -n traced --no-live --trace steps=3:5\n" + TRAIN)
        assert reply["status"] == "ok", reply
        text = text_of(messages)
        assert "traced window" in text and "steps=3:5: complete, 2 step(s)" in text
        assert "CPU activities only" in text and "self CPU time" in text
        reply, messages = execute(kc, "%%gpuprofile --source sim -n bad --trace steps=5:2\nran = True")
        assert reply["ename"] == "UsageError" and "--trace" in reply["evalue"]
        reply, messages = execute(kc, "print('ran' in dir())")
        assert "False" in text_of(messages)
    exp = gp.load("traced", store=store)
    info = exp.meta.trace
    assert (info["first_step"], info["end_step"], info["status"]) == (3, 5, "complete")
    # every operator the profiler saw ran inside steps 3 and 4 (our step log, on the wall clock)
    steps, base = exp.steps, exp.trace["baseTimeNanoseconds"] / 1e9
    first = info["wall0"] + steps["t_end_s"][3] - steps["duration_s"][3]
    last = info["wall0"] + steps["t_end_s"][4]
    ops = [e for e in exp.trace["traceEvents"] if e.get("cat") == "cpu_op"]
    assert ops and all(first - 0.002 <= base + e["ts"] / 1e6 <= last + 0.002 for e in ops)
    assert sum(e["name"] == "aten::linear" for e in ops) == 2  # one forward per traced step
    assert exp.summary["trace"]["operators"]
    out = tmp_path / "trace.json"
    assert main(["trace", "traced", "--store", str(store), "-o", str(out)]) == 0
    events = json.loads(out.read_text())["traceEvents"]
    assert any(e.get("cat") == "cpu_op" for e in events) and any(e.get("ph") == "C" for e in events)
