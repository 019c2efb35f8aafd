"""The magic end to end in a real kernel: normal, raising, interrupted cells, restart, bad args."""

from __future__ import annotations

import re

import pytest

import gpuprof_jupyter as gp
from tests.kernel_helpers import execute, running_kernel, text_of, wait_for_output

pytestmark = pytest.mark.kernel

TRAIN = """\
import torch
torch.manual_seed(0)
model = torch.nn.Linear(32, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(256, 32), torch.randint(0, 4, (256,))), batch_size=32)
for x, y in gpuprof_jupyter.track(loader):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    gpuprof_jupyter.step(len(x))
final_loss = loss.item()
round(final_loss, 3)
"""


@pytest.fixture
def kernel(tmp_path):
    with running_kernel(tmp_path, {"GPUPROF_STORE": str(tmp_path / "store")}) as (km, kc):
        reply, _ = execute(kc, "%load_ext gpuprof_jupyter\nimport gpuprof_jupyter")
        assert reply["status"] == "ok"
        yield km, kc, tmp_path


def test_normal_cell_runs_like_without_the_magic_and_is_saved(kernel):
    km, kc, tmp_path = kernel
    reply, messages = execute(kc, "%%gpuprofile --source sim -n baseline --no-live --param lr=0.1 --capture final_loss\n" + TRAIN)
    assert reply["status"] == "ok"
    results = [m for m in messages if m["msg_type"] == "execute_result"]
    assert len(results) == 1  # the last expression is displayed, as without the magic
    text = text_of(messages)
    assert "baseline" in text and "SIMULATED" in text and "SM util" in text
    reply, messages = execute(kc, "print(type(model).__name__, final_loss > 0)")
    assert "Linear True" in text_of(messages)  # variables kept in the user namespace
    frame = gp.experiments(tmp_path / "store")
    row = frame.iloc[0]
    assert (row["name"], row["status"], row["lr"], row["batch_size"], row["num_workers"]) == ("baseline", "ok", 0.1, 32, 0)
    exp = gp.load("baseline", store=tmp_path / "store")
    assert exp.meta.captured["final_loss"] > 0
    assert exp.summary["steps"]["count"] == 8
    assert "import torch" in exp.meta.context["cell_source"]


def test_raising_cell_saves_error_status_and_propagates_user_exception(kernel):
    km, kc, tmp_path = kernel
    reply, messages = execute(kc, "%%gpuprofile --source sim -n broken --no-live\nx = 1\nraise ValueError('bad batch')")
    assert reply["status"] == "error"
    assert reply["ename"] == "ValueError" and reply["evalue"] == "bad batch"
    assert "[error]" in text_of(messages)  # the summary is still shown
    exp = gp.load("broken", store=tmp_path / "store")
    assert exp.status == "error" and "bad batch" in exp.meta.error


def test_interrupted_cell_is_saved_as_interrupted(kernel):
    km, kc, tmp_path = kernel
    msg_id = kc.execute("%%gpuprofile --source sim -n stopped --no-live\nimport time\nprint('looping', flush=True)\n"
                        "while True: time.sleep(0.05)")  # ends only at the interrupt
    wait_for_output(kc, msg_id, "looping")  # the session runs and the cell is in its loop
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=60)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    exp = gp.load("stopped", store=tmp_path / "store")
    assert exp.status == "interrupted"


def test_bad_arguments_raise_usage_error_and_the_cell_does_not_run(kernel):
    km, kc, tmp_path = kernel
    for args, expected in [
        ("--interval fast", "invalid float value"),
        ("--source cuda", "unknown source 'cuda'"),
        ("--param batch_size", "is not KEY=VALUE"),
        ("--devices a,b", "--devices"),
        ("--bogus", "unrecognized arguments"),
        ("--interval 0", "--interval must be"),
        ("--alert 'sm_util < lots for >30% within step'", "expected a number"),
        ("--alert 'accuracy < 0.9'", "alerts watch a sampled metric"),
    ]:
        reply, messages = execute(kc, f"%%gpuprofile {args}\nran = True")
        assert reply["status"] == "error" and reply["ename"] == "UsageError", args
        assert expected in reply["evalue"], (args, reply["evalue"])
    reply, messages = execute(kc, "print('ran' in dir())")
    assert "False" in text_of(messages)
    assert gp.experiments(tmp_path / "store").empty


def test_help_and_line_commands(kernel):
    km, kc, tmp_path = kernel
    reply, messages = execute(kc, "%%gpuprofile?")
    assert reply["status"] == "ok"
    payload = " ".join(p.get("data", {}).get("text/plain", "") for p in reply.get("payload", []))
    assert "--interval" in payload and "--source" in payload
    execute(kc, "%%gpuprofile --source sim -n first --quiet\npass")
    reply, messages = execute(kc, "%gpuprofile list")
    assert "first" in text_of(messages)
    reply, messages = execute(kc, "%gpuprofile show nope")
    assert reply["ename"] == "UsageError" and "no experiment named 'nope'" in reply["evalue"]
    reply, messages = execute(kc, "%gpuprofile status")
    assert "NVML" in text_of(messages) and "nothing running" in text_of(messages)
    reply, messages = execute(kc, "%gpuprofile delete first")
    assert "deleted experiment 'first'" in text_of(messages)
    reply, messages = execute(kc, "%gpuprofile frobnicate")
    assert reply["ename"] == "UsageError"


def test_experiments_listed_after_kernel_restart(kernel):
    km, kc, tmp_path = kernel
    reply, _ = execute(kc, "%%gpuprofile --source sim -n baseline --no-live\n" + TRAIN)
    assert reply["status"] == "ok"
    km.restart_kernel(now=True)
    kc.wait_for_ready(timeout=90)
    code = (
        "import gpuprof_jupyter\nf = gpuprofile_frame = gpuprof_jupyter.experiments()\n"
        "print(list(f['name']), list(f['status']))\n"
        "needed = ['id','name','status','started_at','duration_s','devices','source','sm_util_mean','sm_util_p50',"
        "'sm_util_p95','sm_low_frac','mem_bw_util_mean','power_mean_w','energy_j','energy_kwh',"
        "'gpu_mem_peak_bytes','cpu_util_mean','batch_size','num_workers']\n"
        "print('missing', [c for c in needed if c not in f.columns])"
    )
    reply, messages = execute(kc, code)
    text = text_of(messages)
    assert "['baseline'] ['ok']" in text and "missing []" in text


def _results(messages):
    return [m["content"] for m in messages if m["msg_type"] == "execute_result"]


def test_cell_runs_as_ipython_runs_it(kernel):
    """Issue 10 part 2: top-level await, ! and % lines, the displayed last value, _ and Out,
    the execution count and tracebacks are those of the same cell without the magic."""
    km, kc, tmp_path = kernel
    reply, messages = execute(kc, "%%gpuprofile --source sim -n async --quiet\nimport asyncio\n"
                                  "await asyncio.sleep(0.1)\n!echo from-shell\n%time y = 21\ny * 2")
    assert reply["status"] == "ok", reply
    count = reply["execution_count"]
    assert [r["data"]["text/plain"] for r in _results(messages)] == ["42"]
    assert _results(messages)[0]["execution_count"] == count
    assert "from-shell" in text_of(messages) and "Wall time" in text_of(messages)
    assert gp.load("async", store=tmp_path / "store").meta.duration_s >= 0.1
    reply, messages = execute(kc, f"print(_, Out[{count}], _ih[{count}].count('gpuprof'))")
    assert "42 42 1" in text_of(messages) and reply["execution_count"] == count + 1
    reply, messages = execute(kc, "%%gpuprofile --source sim -n raising --quiet\nx = 1\n\nraise KeyError('k')")
    assert reply["status"] == "error" and reply["ename"] == "KeyError"
    trace = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(reply["traceback"]))
    assert "----> 4" in trace and "raise KeyError" in trace  # the user's own line numbers
    reply, messages = execute(kc, "%%gpuprofile --source sim -n awaiting-error --quiet\nimport asyncio\n"
                                  "await asyncio.sleep(0.05)\n1 / 0")
    assert reply["status"] == "error" and reply["ename"] == "ZeroDivisionError"
    assert gp.load("awaiting-error", store=tmp_path / "store").status == "error"


def test_failing_capture_never_wedges_and_quotes_are_stripped(kernel):
    """Defects 1 and 3 as a new user meets them."""
    km, kc, tmp_path = kernel
    execute(kc, "import torch\nx = torch.ones(3)")
    reply, messages = execute(kc, '%%gpuprofile --source sim -n "amp run" --capture x --quiet --param note="a b"\nx.sum()')
    assert reply["status"] == "ok", text_of(messages)
    exp = gp.load("amp run", store=tmp_path / "store")
    assert exp.meta.captured["x"] == "Tensor(shape=(3,), dtype=torch.float32)" and exp.params["note"] == "a b"
    reply, messages = execute(kc, "import threading\nprint([t.name for t in threading.enumerate() "
                                  "if t.name.startswith('gpuprof')])\n%gpuprofile status")
    # only the link to the sampler process, which lives as long as the kernel
    assert "['gpuprof-link']" in text_of(messages) and "nothing running" in text_of(messages)
    reply, messages = execute(kc, "SRC = 'sim:compute-bound'")
    reply, messages = execute(kc, "%%gpuprofile --source $SRC -n next --quiet\n1")  # $var as in any magic
    assert reply["status"] == "ok"
    assert gp.load("next", store=tmp_path / "store").meta.source == "sim:compute-bound"


def test_fail_on_check_makes_the_cell_an_error(kernel):
    km, kc, tmp_path = kernel
    reply, messages = execute(kc, "%%gpuprofile --source sim -n gated --quiet --check 'accuracy >= 0.9' "
                                  "--fail-on-check\ngpuprof_jupyter.log(accuracy=0.5)")
    assert reply["status"] == "error" and reply["ename"] == "RuleFailed", reply
    assert gp.load("gated", store=tmp_path / "store").meta.checks[0]["passed"] is False


def test_a_gate_without_a_gpu_cannot_judge_and_late_torch_is_named(kernel):
    """--source host: the GPU gate shows CANNOT JUDGE (never PASS) and --fail-on-check raises for
    it; torch first imported inside the cell is the one case where "an earlier cell" is advised."""
    km, kc, tmp_path = kernel
    reply, messages = execute(kc, "%%gpuprofile --source host -n no-gpu --no-live --check 'sm_util > 60 for >=80%' "
                                  "--fail-on-check\nimport time\ntime.sleep(0.5)")
    assert reply["status"] == "error" and reply["ename"] == "RuleFailed", reply
    assert "1 cannot be judged" in reply["evalue"] and "read no GPU" in reply["evalue"], reply["evalue"]
    text = text_of(messages)
    assert "CANNOT JUDGE sm_util > 60 for >=80%: sm_util was not measured" in text and "PASS" not in text, text
    assert gp.load("no-gpu", store=tmp_path / "store").meta.checks[0]["judged"] is False
    reply, messages = execute(kc, "%%gpuprofile --source sim:input-bound -n late --no-live\nimport torch\n"
                                  "import time\ntime.sleep(1.5)")
    assert reply["status"] == "ok", reply
    exp = gp.load("late", store=tmp_path / "store")
    assert exp.meta.context.get("torch_imported_late") == "cell", exp.meta.notes
    underused = [f for f in gp.diagnose(exp) if f.id == "gpu-underused"]
    assert underused and underused[0].next_step.startswith("torch was imported inside the profiled cell"), underused
    assert "import it in an earlier cell" in underused[0].next_step
