"""``%%gpuprofile --tune`` in a real kernel, on the quickstart's workload, under load.

One kernel for the module: the quickstart's set-up (calibrated decoding, the modelled GPU
step), a model/optimizer/scheduler built in an earlier cell whose bits must survive every
tuning run, then the baseline cell tuned three times in a row with a busy process per core.
"""

from __future__ import annotations

import json
import queue
import time

import pytest

from tests.kernel_helpers import execute, running_kernel, text_of, wait_for_output

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(600)]

# What docs/tune.md says of the quickstart's baseline cell under --tune ("the data wait falls
# from over 40 % to under 30 % of each step", with a busy process per core: 55 % -> 20 % measured
# under load by a helper): the bounds the search below is held to.
BASELINE_WAIT_OVER, TUNED_WAIT_UNDER = 0.40, 0.30

SETUP = r"""
%load_ext gpuprof_jupyter
import warnings, hashlib, threading, psutil, torch, gpuprof_jupyter
from gpuprof_jupyter import demo
torch.manual_seed(0); torch.set_num_threads(1)
PASSES = demo.calibrate()
warnings.filterwarnings('ignore', message='This DataLoader will create')
images = demo.SlowImages(4352, PASSES)

def train(loader, amp=False, epochs=2):
    model = demo.make_model(); opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(epochs):
        correct = seen = 0
        for x, y in loader:
            with demo.gpu_step(len(y), amp):
                with torch.autocast('cpu', dtype=torch.bfloat16, enabled=amp):
                    out = model(x)
                loss = torch.nn.functional.cross_entropy(out.float(), y)
                opt.zero_grad(); loss.backward(); opt.step()
            correct += (out.argmax(1) == y).sum().item(); seen += len(y)
    return correct / seen

# built in an earlier cell: must come back bitwise after tuning
net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(sgd, 1, gamma=0.5)
for _ in range(3):
    sgd.zero_grad(); net(torch.randn(4, 8)).sum().backward(); sgd.step(); sched.step()

def fingerprint():
    h = hashlib.sha256()
    for t in [*net.state_dict().values(), *[s for st in sgd.state_dict()['state'].values() for s in st.values()]]:
        h.update(t.numpy().tobytes())
    h.update(repr(sched.state_dict()).encode()); h.update(torch.get_rng_state().numpy().tobytes())
    return h.hexdigest()

def leftovers():
    kids = [p for p in psutil.Process().children(recursive=True)
            if p.status() != psutil.STATUS_ZOMBIE and 'sampler_process' not in ' '.join(p.cmdline())]
    threads = [t.name for t in threading.enumerate() if t.name.startswith('gpuprof-') and t.name != 'gpuprof-link']
    hooked = torch.utils.data.DataLoader.__init__.__qualname__ != 'DataLoader.__init__'
    return {'processes': len(kids), 'threads': threads, 'hooked': hooked}

BEFORE = fingerprint()
print('ready')
"""

TUNE_BASELINE = """%%gpuprofile --tune --source sim -n {name} --budget 150s --trial-steps 16 --check 'sm_util > 60 for >=80%'
loader = torch.utils.data.DataLoader(images, batch_size=32, num_workers=0)
accuracy = train(loader)
"""

REPORT = """
r = gpuprof_jupyter.last_tune()
w = r.winner
print(json.dumps({'winner': None if w is None else {'settings': w.settings, 'checks_failed': w.figures.checks_failed,
                  'name': w.name, 'data_wait_frac': w.figures.data_wait_frac},
                  'baseline_wait': r.result.baseline[0].figures.data_wait_frac, 'elapsed': r.result.elapsed_s, 'trials': len(r.result.trials),
                  'last_started': r.result.elapsed_s - r.result.trials[-1].wall_s,
                  'last_cut': r.result.trials[-1].cut_by_budget,
                  'same': fingerprint() == BEFORE, 'left': leftovers(), 'stopped': r.result.stopped,
                  'loader_bound': 'loader' in globals(), 'simulated': r.simulated}))
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tune")
    with running_kernel(folder, {"GPUPROF_STORE": str(folder / ".gpuprof")}) as (km, kc):
        reply, messages = execute(kc, SETUP + "\nimport json", timeout=240)
        assert reply["status"] == "ok", text_of(messages)
        yield km, kc, folder


def _report(kc) -> dict:
    reply, messages = execute(kc, REPORT)
    assert reply["status"] == "ok", text_of(messages)
    return json.loads(text_of(messages).strip().splitlines()[-1])


def test_tune_on_the_baseline_cell_finds_workers_and_passes_the_gate_under_load(kernel, busy_cores):
    km, kc, folder = kernel
    run = 0  # once (a search takes minutes): its verdicts are what this checks
    reply, messages = execute(kc, TUNE_BASELINE.format(name=f"tune{run}"), timeout=300)
    text = text_of(messages)
    assert reply["status"] == "ok", text
    assert "SIMULATED GPU" in text and "gpuprof --tune" in text and "Next:" in text
    facts = _report(kc)
    assert facts["winner"] is not None, text
    assert int(facts["winner"]["settings"].get("num_workers") or 0) > 0, text
    assert facts["winner"]["checks_failed"] == [], text
    assert facts["baseline_wait"] > BASELINE_WAIT_OVER and facts["winner"]["data_wait_frac"] < TUNED_WAIT_UNDER, facts
    # the budget holds: no trial started after it, and one still running when it ran out was cut
    assert facts["last_started"] <= 150 and (facts["elapsed"] <= 150 or facts["last_cut"]), facts
    assert facts["same"], "the model, optimizer, scheduler or RNG changed"
    assert facts["left"] == {"processes": 0, "threads": [], "hooked": False}, facts
    assert not facts["loader_bound"], "a variable the cell created stayed in the namespace"
    assert facts["simulated"]
    # every trial is an experiment like any other
    reply, messages = execute(kc, "print(sorted(gpuprof_jupyter.experiments()['name'])[:3])")
    assert "tune0-t1" in text_of(messages)


def test_a_trial_that_raises_and_a_loader_built_before_and_a_trainer_that_builds_its_own(kernel):
    km, kc, folder = kernel
    code = """
prebuilt = torch.utils.data.DataLoader(images, batch_size=32, num_workers=0)
class TinyTrainer:  # builds its DataLoader inside train(), as HF's Trainer does
    def __init__(self, dataset): self.dataset = dataset
    def train(self):
        loader = torch.utils.data.DataLoader(self.dataset, batch_size=32)
        if loader.num_workers == 4: raise RuntimeError('boom at 4 workers')
        return train(loader, epochs=1)
"""
    reply, messages = execute(kc, code)
    assert reply["status"] == "ok", text_of(messages)
    reply, messages = execute(kc, "%%gpuprofile --tune --source sim -n prebuilt --trial-steps 10 --budget 90s\n"
                                  "acc = train(prebuilt, epochs=1)\n", timeout=240)
    text = text_of(messages)
    assert reply["status"] == "ok", text
    assert "torch forbids changing persistent_workers" in text, text
    reply, messages = execute(kc, "print(prebuilt.num_workers, prebuilt.prefetch_factor, prebuilt.persistent_workers)")
    assert text_of(messages).split() == ["0", "None", "False"]
    reply, messages = execute(kc, "import os; os.sched_setaffinity(0, set(range(os.cpu_count())))\n"
                                  "import gpuprof_jupyter.runtime.tune.driver as d; d.allowed_cpus = lambda: 4\n")
    reply, messages = execute(kc, "%%gpuprofile --tune --source sim -n trainer --trial-steps 10 --budget 90s\n"
                                  "TinyTrainer(images).train()\n", timeout=240)
    text = text_of(messages)
    assert reply["status"] == "ok", text
    assert "raised: RuntimeError: boom at 4 workers" in text, text
    facts = _report(kc)
    assert facts["same"] and facts["left"] == {"processes": 0, "threads": [], "hooked": False}, facts
    assert facts["winner"]["settings"].get("num_workers") == 2, facts


def test_ctrl_c_in_a_trial_restores_and_shows_the_trials_so_far(kernel):
    km, kc, folder = kernel
    msg_id = kc.execute("%%gpuprofile --tune --source sim -n interrupted --trial-steps 200 --budget 120s\n"
                        "acc = train(torch.utils.data.DataLoader(images, batch_size=32), epochs=4)\n")
    messages, deadline, interrupted, second = [], time.monotonic() + 200, False, None
    while time.monotonic() < deadline:
        try:
            msg = kc.get_iopub_msg(timeout=0.5)
        except queue.Empty:
            msg = None
        if msg is not None and msg["parent_header"].get("msg_id") == msg_id:
            messages.append(msg)
        if second is None and "trial 2 [baseline (repeat)] running" in text_of(messages):
            second = time.monotonic()
        if not interrupted and second is not None and time.monotonic() > second + 3:
            km.interrupt_kernel()  # inside the second trial's cell
            interrupted = True
        if msg is None or msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    text = text_of(messages)
    assert interrupted and "KeyboardInterrupt" in text, text
    assert "interrupted (Ctrl-C)" in text and "interrupted-t1" in text, text
    facts = _report(kc)
    assert facts["same"] and facts["left"] == {"processes": 0, "threads": [], "hooked": False}, facts
    reply, messages = execute(kc, "print(gpuprof_jupyter.load('interrupted-t2').status)")
    assert text_of(messages).strip() == "interrupted"


def test_opted_in_batch_size_reports_the_users_metric_and_bad_arguments_are_usage_errors(kernel):
    km, kc, folder = kernel
    reply, messages = execute(kc, "%%gpuprofile --tune --budget fivemin\npass\n")
    assert reply["status"] == "error" and "--budget" in text_of(messages)
    reply, messages = execute(kc, "%%gpuprofile --tune nosuch.batch_size=64 --source sim\npass\n")
    assert reply["status"] == "error" and "no variable 'nosuch'" in text_of(messages)
    code = ("class Cfg: batch_size = 32\ncfg = Cfg()\n")
    execute(kc, code)
    reply, messages = execute(kc, "%%gpuprofile --tune cfg.batch_size=64 --source sim -n bs --trial-steps 10 --budget 120s\n"
                                  "loader = torch.utils.data.DataLoader(demo.SlowImages(1024, PASSES), batch_size=cfg.batch_size, num_workers=2)\n"
                                  "gpuprof_jupyter.log(accuracy=train(loader, epochs=1))\n", timeout=300)
    text = text_of(messages)
    assert reply["status"] == "ok", text
    assert "cfg.batch_size 32 -&gt; 64" in text or "cfg.batch_size 32 -> 64" in text, text
    assert "accuracy=" in text, text
    reply, messages = execute(kc, "print(cfg.batch_size)")
    assert text_of(messages).strip() == "32"


FROZEN_MODEL = """
import os
frozen_net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
frozen_net.eval(); frozen_net[0].requires_grad_(False)  # evaluated, first layer frozen
frozen_opt = torch.optim.SGD(frozen_net.parameters(), lr=0.5)
head, history, big, seen = frozen_net[3], {'loss': []}, list(range(200_000)), torch.zeros(1)
"""

# the cell trains, unfreezes, swaps the head, logs into namespace containers and the environment
MESS_UP = """frozen_net.train(); frozen_net[0].requires_grad_(True); frozen_net[3] = torch.nn.Linear(8, 2)
history['loss'].append(1.0); big.append(0); os.environ['GPUPROF_TUNE_LEFT'] = '1'; seen.add_(1)
frozen_net.register_forward_hook(lambda *a: None)
print('changed', flush=True)
"""

STATE = """
x = torch.randn(4, 8); w0, w3 = frozen_net[0].weight.clone(), frozen_net[3].weight.clone()
frozen_opt.zero_grad(); frozen_net(x).sum().backward(); frozen_opt.step()
print(json.dumps({'eval': not any(m.training for m in frozen_net.modules()),
                  'frozen': not frozen_net[0].weight.requires_grad and torch.equal(frozen_net[0].weight, w0),
                  'head': frozen_net[3] is head, 'head_trained': not torch.equal(frozen_net[3].weight, w3),
                  'history': history, 'env': os.environ.get('GPUPROF_TUNE_LEFT'),
                  'hooks': len(frozen_net._forward_hooks)}))
"""

RESTORED = {"eval": True, "frozen": True, "head": True, "head_trained": True, "history": {"loss": []}, "env": None,
            "hooks": 0}


def _state(kc) -> dict:
    reply, messages = execute(kc, STATE)
    assert reply["status"] == "ok", text_of(messages)
    return json.loads(text_of(messages).strip().splitlines()[-1])


def test_a_raising_or_interrupted_trial_leaves_eval_mode_frozen_layers_and_the_optimizers_head(kernel):
    km, kc, folder = kernel
    reply, messages = execute(kc, FROZEN_MODEL)
    assert reply["status"] == "ok", text_of(messages)
    reply, messages = execute(kc, "%%gpuprofile --tune --source sim -n frozen --trial-steps 10 --budget 60s\n"
                                  + MESS_UP + "raise RuntimeError('boom in the cell')\n", timeout=120)
    text = text_of(messages)
    assert reply["status"] == "ok" and "the baseline trial raised" in text and "changed" in text, text
    assert "not restored: big (list, over 100,000 items in all) was not kept for restore; changed by the trials" in text
    assert "not restored: seen (a tensor) was changed in place by the trials" in text, text
    assert _state(kc) == RESTORED  # and the optimizer's step trained the model's own head
    msg_id = kc.execute("%%gpuprofile --tune --source sim -n frozen-stop --trial-steps 10 --budget 60s\n"
                        + MESS_UP + "import time\nfor _ in range(1200): time.sleep(0.05)\n")
    wait_for_output(kc, msg_id, "changed")  # inside the baseline trial, after the changes
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=60)
    assert reply["parent_header"]["msg_id"] == msg_id and reply["content"]["ename"] == "KeyboardInterrupt"
    assert _state(kc) == RESTORED
