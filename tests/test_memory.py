"""Memory per step and where it goes (docs/memory.md): torch's allocator peak read and reset at
each step's end on the training thread (never creating a CUDA context), and one sampled step's
breakdown counted from the tensors' own sizes (CPU tensors here: exact)."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

import gpuprof_jupyter as gp
from tests.fake_nvml import sampler_process_env
from tests.fake_torch_cuda import GIB, FakeCuda

BATCHES = [8, 32, 8, 32, 8, 32]  # a peak that is never reset would stay at the 32-batch peak
WIDTH = 1000  # fake activation floats per sample


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _train(model, opt, batches, fake=None, steps_call=False):
    for b in batches:
        x, y = torch.randn(b, 16), torch.randint(0, 4, (b,))
        if fake is not None:  # what the GPU would hold during this step's forward/backward
            acts = fake.hold(torch.empty(b * WIDTH))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if fake is not None:
            del acts
        opt.step()
        opt.zero_grad()
        if steps_call:
            gp.step(b)


def _run(store, batches, fake=None, name="mem", optimizer=torch.optim.Adam, steps_call=False, source="sim"):
    model = _model()
    opt = optimizer(model.parameters(), lr=1e-3)
    with gp.profile(name, source=source, store=store, interval=0.05) as p:
        _train(model, opt, batches, fake, steps_call)
    return p.experiment, model, opt


@pytest.fixture
def fake(monkeypatch):
    f = FakeCuda().install(monkeypatch)
    f.weights = f.hold(torch.empty(250_000))  # 1 MB of "weights" held for the whole run
    f.hold(torch.empty(10_000_000))  # 40 MB freed before the run: not any step's peak
    return f


@pytest.mark.process
def test_each_step_has_its_own_allocator_peak(store_dir, fake, fresh_sampler):
    # NVML (fake) sees this kernel hold 2 GiB: 2 MiB reserved by torch, the rest outside PyTorch
    fresh_sampler(sampler_process_env({"gpus": [{"kind": "a100", "processes": [[os.getpid(), 2 * GIB]]}]}))
    exp, *_ = _run(store_dir, BATCHES * 3, fake, source="nvml")
    peaks = exp.steps["peak_memory_bytes"].to_numpy()
    expected = [1_000_000 + 4 * WIDTH * b for b in BATCHES * 3]
    assert list(peaks) == expected  # reset at each step's end: small steps show small peaks
    assert fake.resets >= len(BATCHES)
    memory = exp.summary["memory"]
    assert memory["step_peak_max_bytes"] == max(expected)
    assert memory["step_peak_p50_bytes"] == float(np.median(expected))
    assert memory["peak_bytes"] >= max(expected)
    # the per-step peaks also reach the samples (the live plot, Prometheus) with their provenance
    assert exp.meta.provenance["gpu0"]["step_peak_memory_bytes"] == "torch.cuda.step_peak"
    assert exp.summary["devices"]["gpu0"]["step_peak_memory_peak_bytes"] == max(expected)
    samples = exp.samples
    column = samples.loc[samples["device"] == "gpu0", "step_peak_memory_bytes"].dropna()
    assert len(column) and set(column) <= set(expected)
    assert memory["outside_torch_bytes"] == 2 * GIB - fake.reserved
    assert memory["device_total_bytes"] == exp.summary["devices"]["gpu0"]["gpu_mem_total_bytes"]
    assert memory["headroom_frac"] == pytest.approx(1 - memory["peak_bytes"] / memory["device_total_bytes"])


@pytest.mark.process
def test_step_calls_and_sibling_optimizers_keep_one_peak_per_step(store_dir, fake):
    exp, *_ = _run(store_dir, BATCHES, fake, steps_call=True)
    assert list(exp.steps["peak_memory_bytes"]) == [1_000_000 + 4 * WIDTH * b for b in BATCHES]


@pytest.mark.process
def test_a_cpu_run_never_touches_cuda(store_dir, monkeypatch):
    def forbidden(*a, **k):
        raise AssertionError("the profiler read torch.cuda statistics without an initialised CUDA")

    for name in ("max_memory_allocated", "reset_peak_memory_stats", "memory_allocated", "memory_reserved"):
        monkeypatch.setattr(torch.cuda, name, forbidden)
    exp, *_ = _run(store_dir, BATCHES)
    assert not torch.cuda.is_initialized()
    assert exp.steps["peak_memory_bytes"].isna().all()
    assert not any("memory" in n for n in exp.meta.notes), exp.meta.notes


def _tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.process
def test_breakdown_is_exact_on_cpu_tensors(store_dir):
    exp, model, opt = _run(store_dir, [16] * 4)
    memory = exp.summary["memory"]
    breakdown = memory["breakdown"]
    params = list(model.parameters())
    assert breakdown["parameters"] == _tensor_bytes(params)
    assert breakdown["gradients"] == 0 or breakdown["gradients"] == _tensor_bytes(params)
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    assert breakdown["optimizer_state"] == _tensor_bytes(state)
    assert breakdown["activations"] > 0
    assert "other" not in breakdown  # no allocator: nothing measures it, so it is unknown, never 0
    assert memory["peak_bytes"] == sum(breakdown.values()) and memory["counts"] == "cpu_tensors"


@pytest.mark.process
def test_gradients_are_counted_while_they_exist(store_dir):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with gp.profile("grads", source="sim", store=store_dir, interval=0.05) as p:
        for _ in range(3):
            opt.zero_grad()  # zeroed before backward: the gradients live at the step's end
            torch.nn.functional.cross_entropy(model(torch.randn(8, 16)), torch.randint(0, 4, (8,))).backward()
            opt.step()
    breakdown = p.experiment.summary["memory"]["breakdown"]
    params = list(model.parameters())
    assert breakdown["gradients"] == _tensor_bytes(params)
    assert breakdown["optimizer_state"] == _tensor_bytes(params)  # one momentum buffer per parameter


@pytest.mark.process
def test_activations_scale_with_the_batch_and_skip_parameters(store_dir):
    runs = {b: _run(store_dir, [b] * 4, name=f"b{b}") for b in (8, 16, 32)}
    acts = {b: run[0].summary["memory"]["breakdown"]["activations"] for b, run in runs.items()}
    assert acts[32] - acts[16] == 2 * (acts[16] - acts[8])  # linear in the batch
    fixed = 2 * acts[8] - acts[16]  # what does not grow with the batch: the loss's scalars only
    params = runs[8][0].summary["memory"]["breakdown"]["parameters"]
    assert 0 <= fixed < 64 < params  # a parameter counted among the saved tensors would show here


@pytest.mark.process
def test_breakdown_other_is_the_rest_of_the_allocator_peak(store_dir, fake):
    exp, *_ = _run(store_dir, [32] * 4, fake)
    memory = exp.summary["memory"]
    breakdown = memory["breakdown"]
    counted = sum(v for k, v in breakdown.items() if k != "other")
    assert memory["peak_bytes"] == 1_000_000 + 4 * WIDTH * 32
    assert breakdown["other"] == pytest.approx(memory["peak_bytes"] - counted)
    assert sum(breakdown.values()) == pytest.approx(memory["peak_bytes"])


def test_memory_figures_of_an_old_run_are_absent_not_zero():
    from gpuprof_jupyter.core.analysis.memory import memory_summary
    from gpuprof_jupyter.core.store.columns import Columns

    old_steps = Columns({"t_end_s": np.ones(2), "duration_s": np.ones(2), "wait_s": np.zeros(2), "n_samples": np.ones(2)})
    assert memory_summary({}, old_steps, {}) == {}
    assert memory_summary({}, old_steps, {"gpu0": {"gpu_mem_total_bytes": 16e9}}) == {}  # no figure of the run
    per_device = {"gpu0": {"own_gpu_mem_peak_bytes": 5e9, "torch_mem_reserved_peak_bytes": 4e9,
                           "gpu_mem_total_bytes": 16e9}}
    out = memory_summary({}, old_steps, per_device)
    assert out == {"device_total_bytes": 16e9, "outside_torch_bytes": 1e9}
    for damaged in ({"counted": ["parameters", 3]}, {"counted": {"parameters": "3 GB"}}, {"counted": {"x": -1.0}},
                    {"counted": {"parameters": math.nan}}, "not a record", {"sampled_peak_bytes": "x"}):
        assert memory_summary({"memory": damaged}, old_steps, {}) == {}, damaged


@pytest.mark.process
def test_a_script_under_gpuprof_run_gets_its_breakdown(store_dir, monkeypatch):
    import sys
    from pathlib import Path

    from gpuprof_jupyter.cli import main
    from gpuprof_jupyter.core.store.directory import Store

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    script = Path(__file__).resolve().parent / "data" / "scripts" / "train_plain.py"
    rc = main(["run", "--store", str(store_dir), "--source", "sim", "--interval", "0.05", "-n", "script",
               "--", sys.executable, str(script), "--steps", "4"])
    assert rc == 0
    memory = Store(store_dir).load("script").summary["memory"]
    assert memory["breakdown"]["parameters"] > 0 and memory["breakdown"]["activations"] > 0


@pytest.mark.process
def test_a_saved_tensor_without_a_storage_is_counted_apart_and_training_goes_on(store_dir, monkeypatch):
    from gpuprof_jupyter.runtime.hooks import memory_hooks

    original = memory_hooks._SavedTensorCounter._pack
    calls = []

    def pack(self, tensor):  # the first saved tensor behaves like a sparse or subclass tensor
        calls.append(1)
        if len(calls) == 1:
            broken = type("NoStorage", (), {"untyped_storage": lambda s: (_ for _ in ()).throw(RuntimeError("none"))})()
            original(self, broken)
            return tensor
        return original(self, tensor)

    monkeypatch.setattr(memory_hooks._SavedTensorCounter, "_pack", pack)
    exp, *_ = _run(store_dir, [8] * 4)
    assert exp.summary["steps"]["count"] == 4
    assert exp.summary["memory"]["uncounted_saved_tensors"] == 1
    assert exp.summary["memory"]["breakdown"]["activations"] > 0


@pytest.mark.process
def test_sibling_optimizers_are_one_step_with_the_higher_peak(store_dir, fake):
    torch.manual_seed(0)
    d, g = torch.nn.Linear(16, 1), torch.nn.Linear(16, 16)
    opt_d, opt_g = torch.optim.SGD(d.parameters(), lr=0.1), torch.optim.SGD(g.parameters(), lr=0.1)
    batches = [torch.randn(b, 16) for b in BATCHES]
    with gp.profile("gan", source="sim", store=store_dir, interval=0.05) as p:
        for x in gp.track(batches):
            held = fake.hold(torch.empty(len(x) * WIDTH // 4))
            d(x).sum().backward()
            del held  # freed before the boundary: a peak counts from what is held when it is reset
            opt_d.step()
            held = fake.hold(torch.empty(len(x) * WIDTH))  # the generator's step, joined to it, holds more
            d(g(x)).sum().backward()
            del held
            opt_g.step()
    assert list(p.experiment.steps["peak_memory_bytes"]) == [1_000_000 + 4 * WIDTH * b for b in BATCHES]


def test_only_the_devices_the_parameters_live_on_are_read_each_step(monkeypatch):
    from types import SimpleNamespace

    from gpuprof_jupyter.runtime.hooks import memory_hooks
    from gpuprof_jupyter.runtime.hooks.activity import ActivityLog

    FakeCuda().install(monkeypatch)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    read = []
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda i: read.append(i) or 0)
    class Optimizer:  # as torch.optim's: param_groups, state
        param_groups = [{"params": [SimpleNamespace(device=torch.device("cuda", 3))]}]  # the model is on GPU 3 of 8
        state: dict = {}

    optimizer = Optimizer()
    probe = memory_hooks.StepMemory(ActivityLog(0.0))
    probe.record = {}  # the breakdown done: the per-step read only
    probe.boundary(optimizer)
    probe.boundary(optimizer)
    assert read == [3, 3]
    probe.boundary()  # step() before any optimizer: every device (nothing says which)
    assert read == [3, 3, 3]
    memory_hooks.StepMemory(ActivityLog(0.0)).boundary()
    assert read[3:] == list(range(8))
