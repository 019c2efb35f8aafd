"""``%%gpuprofile --trace`` in a real kernel: the window at the right steps, the operator table
in the summary, a bad window refused before the cell runs."""

from __future__ import annotations

import json

import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.cli import main
from tests.kernel_helpers import execute, running_kernel, text_of

pytestmark = pytest.mark.kernel

TRAIN = """\
import torch
from torch.profiler import record_function
torch.manual_seed(0)
model = torch.nn.Linear(32, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(256, 32), torch.randint(0, 4, (256,))), batch_size=32)
for i, (x, y) in enumerate(gpuprof_jupyter.track(loader)):
    with record_function(f"iteration {i}"):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
    gpuprof_jupyter.step(len(x))
"""


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
    annotations = {e["name"] for e in exp.trace["traceEvents"] if e.get("cat") == "user_annotation"}
    assert {"iteration 3", "iteration 4"} <= annotations and "iteration 2" not in annotations
    assert "iteration 5" not in annotations
    assert exp.summary["trace"]["operators"]
    out = tmp_path / "trace.json"
    assert main(["trace", "traced", "--store", str(store), "-o", str(out)]) == 0
    events = json.loads(out.read_text())["traceEvents"]
    assert any(e.get("cat") == "cpu_op" for e in events) and any(e.get("ph") == "C" for e in events)
