"""Issue 11: a training loop profiled without touching it. Steps from the optimizer, data
waits from the DataLoader, settings from what ran; on the shapes real training code takes."""

from __future__ import annotations

import math
import time

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.data import DataLoader, Dataset, TensorDataset

import gpuprof_jupyter as gp
from gpuprof_jupyter.runtime.hooks import torch_hooks
from gpuprof_jupyter.runtime.hooks.torch_hooks import TrainingHooks
from tests.simexp import sm_util_during_steps

N, BATCH = 64, 8  # 8 batches per epoch


class SlowData(Dataset):
    """Each sample takes ~0.3 ms to load: the data wait is real and measurable."""

    def __init__(self, n: int = N) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(0.0003)
        return self.x[i], self.y[i]


def _compute(model, x, y):
    time.sleep(0.002)  # stands for the GPU's work: the loop is busy, not waiting
    return torch.nn.functional.cross_entropy(model(x), y)


def _profiled(store, fn, name="run"):
    with gp.profile(name, source="sim", store=store, interval=0.02) as p:
        fn()
    return p.experiment


def _steps(exp):
    return exp.summary["steps"]


def _check_common(exp, steps, batches, samples, wait=True):
    s = _steps(exp)
    assert s["count"] == steps and s["batches"] == batches, s
    if samples is None:
        assert s["samples"] is None or math.isnan(s["samples"])  # NaN is saved as null
    else:
        assert s["samples"] == samples
        total = float(exp.steps["duration_s"].sum())
        assert s["samples_per_s"] == pytest.approx(samples / total)
    if wait:
        assert 0.02 < s["data_wait_frac"] < 0.9, s
    else:
        assert s["data_wait_frac"] == 0
    assert exp.meta.params["optimizer"] and exp.meta.params["model.parameters"] > 0
    assert exp.meta.params["model.dtype"] == "float32" and exp.meta.params["amp.autocast"] is False


def _hooks_gone():
    from torch.optim import optimizer
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    return (not optimizer._global_optimizer_pre_hooks and not optimizer._global_optimizer_post_hooks
            and "__next__" in vars(_BaseDataLoaderIter) and vars(_BaseDataLoaderIter)["__next__"].__module__
            == "torch.utils.data.dataloader" and "__iter__" not in {k for k, v in vars(DataLoader).items()
                                                                   if getattr(v, "__module__", "") == torch_hooks.__name__}
            and torch.compile.__module__ != torch_hooks.__name__)


# -- the shapes of real training code ---------------------------------------------------------------
@pytest.mark.process
def test_plain_loop(store_dir):
    def train():
        model = torch.nn.Linear(16, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(SlowData(), batch_size=BATCH)
        for _ in range(2):
            for x, y in loader:
                loss = _compute(model, x, y)
                opt.zero_grad()
                loss.backward()
                opt.step()

    exp = _profiled(store_dir, train)
    _check_common(exp, steps=16, batches=16, samples=2 * N)
    p = exp.meta.params
    assert (p["batch_size"], p["num_workers"], p["pin_memory"], p["dataset"], p["dataset_len"]) == (8, 0, False, "SlowData", 64)
    assert p["optimizer"] == "SGD" and p["model.parameters"] == 16 * 4 + 4
    assert exp.meta.context["steps_from"] == "optimizer" and exp.meta.context["training_hooks"] == "installed"
    assert _hooks_gone()


class Trainer:
    """Builds its loader and optimizer inside a method, as HF Trainer and friends do."""

    def __init__(self, config) -> None:
        self.config = config
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

    def _loader(self):
        return DataLoader(SlowData(), batch_size=self.config["batch_size"], shuffle=True,
                          num_workers=self.config["num_workers"])

    def train(self) -> float:
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        for x, y in self._loader():
            loss = _compute(self.model, x, y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        return loss.item()


@pytest.mark.process
def test_trainer_like_class(store_dir):
    exp = _profiled(store_dir, lambda: Trainer({"batch_size": 16, "num_workers": 0}).train())
    _check_common(exp, steps=4, batches=4, samples=N)
    p = exp.meta.params
    assert (p["batch_size"], p["num_workers"], p["optimizer"]) == (16, 0, "AdamW")
    assert p["model.parameters"] == 16 * 32 + 32 + 32 * 4 + 4


@pytest.mark.process
def test_loader_with_workers(store_dir):
    exp = _profiled(store_dir, lambda: Trainer({"batch_size": 8, "num_workers": 2}).train())
    s = _steps(exp)
    assert (s["count"], s["batches"], s["samples"]) == (8, 8, N)
    assert 0 <= s["data_wait_frac"] < 0.9  # workers prefetch: the wait may vanish, never exceed the run
    p = exp.meta.params
    assert (p["num_workers"], p["prefetch_factor"], p["persistent_workers"]) == (2, 2, False)
    assert exp.meta.context["torch_filled"] == ["prefetch_factor"]  # torch's default, not the user's


@pytest.mark.process
def test_batch_sampler_loader_and_one_batch_ahead(store_dir):
    """HF/accelerate: the loader is built on a batch sampler (torch stores batch_size None) and
    iterated one batch ahead, so the first step holds two batches; both are told as such."""
    from torch.utils.data import BatchSampler, SequentialSampler

    def ahead(loader):  # accelerate's DataLoaderShard: fetch the next batch before yielding this one
        iterator = iter(loader)
        current = next(iterator)
        for following in iterator:
            yield current
            current = following
        yield current

    def train():
        model = torch.nn.Linear(16, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = SlowData()
        loader = DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(data), BATCH, drop_last=False))
        assert loader.batch_size is None
        for x, y in ahead(loader):
            _compute(model, x, y).backward()
            opt.step()

    exp = _profiled(store_dir, train)
    s = _steps(exp)
    assert s["count"] == 8 and s["batches"] == 8 and s["batches_ahead"] == 1
    assert list(exp.steps["n_batches"][:2]) == [2, 1]
    assert exp.meta.params["batch_size"] == BATCH and "torch_filled" not in exp.meta.context
    from gpuprof_jupyter.render.summary_html import render_summary_text

    assert "fetches one batch ahead, so the first step holds two" in render_summary_text(exp)


@pytest.mark.process
def test_sibling_optimizers_are_one_step(store_dir):
    """A GAN: the discriminator's and the generator's optimizer both step once per batch."""
    def train():
        d, g = torch.nn.Linear(16, 1), torch.nn.Linear(16, 16)
        opt_d, opt_g = torch.optim.SGD(d.parameters(), lr=0.01), torch.optim.Adam(g.parameters(), lr=0.01)
        for x, _ in DataLoader(SlowData(), batch_size=BATCH):
            time.sleep(0.002)
            d(x).mean().backward()
            opt_d.step()
            opt_d.zero_grad()
            d(g(x)).mean().backward()
            opt_g.step()
            opt_g.zero_grad()

    exp = _profiled(store_dir, train)
    _check_common(exp, steps=8, batches=8, samples=N)
    assert exp.meta.params["optimizer"] == "SGD,Adam"


@pytest.mark.process
def test_sibling_optimizers_without_a_loader(store_dir):
    """No batch to tell iterations apart: an optimizer stepping again starts the next step."""
    def train():
        a, b = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
        opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.01), torch.optim.SGD(b.parameters(), lr=0.01)
        for _ in range(5):
            x = torch.randn(3, 4)
            a(x).sum().backward()
            b(x).sum().backward()
            opt_a.step()
            opt_b.step()

    exp = _profiled(store_dir, train)
    assert _steps(exp)["count"] == 5 and _steps(exp)["batches"] == 0


class Wrapper(torch.optim.Optimizer):
    """accelerate's AcceleratedOptimizer shape: an Optimizer whose step() calls the inner one's."""

    def __init__(self, inner: torch.optim.Optimizer) -> None:
        self.optimizer = inner
        super().__init__([{"params": []}], {})
        self.param_groups = inner.param_groups

    def step(self, closure=None):
        return self.optimizer.step(closure)


@pytest.mark.process
def test_wrapper_optimizer_is_one_step(store_dir):
    fired = []
    handle = register_optimizer_step_pre_hook(lambda o, a, k: fired.append(type(o).__name__))
    try:
        def train():
            model = torch.nn.Linear(16, 4)
            opt = Wrapper(torch.optim.SGD(model.parameters(), lr=0.1))
            for x, y in DataLoader(SlowData(), batch_size=BATCH):
                _compute(model, x, y).backward()
                opt.step()
                opt.zero_grad()

        exp = _profiled(store_dir, train)
    finally:
        handle.remove()
    assert fired.count("Wrapper") == 8 and fired.count("SGD") == 8  # the global hook fires twice a step
    _check_common(exp, steps=8, batches=8, samples=N)


@pytest.mark.process
def test_grad_scaler_skipped_step_is_counted_not_lost(store_dir):
    def train():
        model = torch.nn.Linear(16, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu")
        for i, (x, y) in enumerate(DataLoader(SlowData(), batch_size=BATCH)):
            loss = _compute(model, x, y)
            if i == 3:
                loss = loss * float("inf")  # inf gradients: the scaler skips optimizer.step()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()

    exp = _profiled(store_dir, train)
    _check_common(exp, steps=8, batches=8, samples=N)
    assert _steps(exp)["skipped"] == 1 and bool(exp.steps["skipped"][3])
    assert exp.steps["duration_s"][3] > 0.002  # its time is a step's, not missing
    assert exp.meta.params["grad_scaler.enabled"] is True and exp.meta.params["grad_scaler.scale"] == 2.0**15


@pytest.mark.process
def test_gradient_accumulation_reports_steps_and_batches(store_dir):
    def train():
        model = torch.nn.Linear(16, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i, (x, y) in enumerate(DataLoader(SlowData(), batch_size=BATCH)):
            (_compute(model, x, y) / 4).backward()
            if i % 4 == 3:
                opt.step()
                opt.zero_grad()

    exp = _profiled(store_dir, train)
    _check_common(exp, steps=2, batches=8, samples=N)
    assert list(exp.steps["n_batches"]) == [4, 4] and list(exp.steps["n_samples"]) == [32, 32]


def _generator(n_batches: int):
    g = torch.Generator().manual_seed(0)
    for _ in range(n_batches):
        time.sleep(0.003)  # reading from somewhere torch does not see
        yield torch.randn(BATCH, 16, generator=g), torch.randint(0, 4, (BATCH,), generator=g)


def _train_on(batches):
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches:
        _compute(model, x, y).backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.process
def test_generator_loop(store_dir):
    """No torch loader: steps from the optimizer, no wait or size known; track() adds both."""
    exp = _profiled(store_dir, lambda: _train_on(_generator(6)))
    _check_common(exp, steps=6, batches=0, samples=None, wait=False)
    exp = _profiled(store_dir, lambda: _train_on(gp.track(_generator(6))), name="tracked")
    _check_common(exp, steps=6, batches=6, samples=6 * BATCH)


# -- the rules: explicit step() wins, nothing counted twice -----------------------------------------
@pytest.mark.process
def test_explicit_step_wins_and_track_around_a_loader_counts_once(store_dir):
    gaps = []  # the loop's own view of each wait: from the end of one body to the start of the next

    def train():
        model = torch.nn.Linear(16, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ended = time.monotonic()  # the activity log's clock
        for x, y in gp.track(DataLoader(SlowData(), batch_size=BATCH)):
            gaps.append(time.monotonic() - ended)
            _compute(model, x, y).backward()
            opt.step()
            opt.zero_grad()
            ended = time.monotonic()
            gp.step()  # no size given: the loader's is used

    exp = _profiled(store_dir, train)
    _check_common(exp, steps=8, batches=8, samples=N)
    assert exp.meta.context["steps_from"] == "step()" and exp.meta.context["optimizer_steps"] == 8
    waits = exp.steps["wait_s"].to_numpy()
    # one wait per batch, not the loader's and track()'s added up: each lies within the gap the
    # loop saw (a doubled wait of >= 2.4 ms would not), however slow the machine made either
    assert len(waits) == len(gaps) and all(w <= g + 1e-4 for w, g in zip(waits, gaps)), (waits, gaps)


@pytest.mark.process
def test_sim_gpu_follows_the_hooked_loop(store_dir):
    def train():
        model = torch.nn.Linear(16, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in DataLoader(TensorDataset(torch.randn(240, 16), torch.randint(0, 4, (240,))), batch_size=8):
            time.sleep(0.01)
            _compute(model, x, y).backward()
            opt.step()

    exp = _profiled(store_dir, train)
    assert any("driven mode" in n for n in exp.meta.notes)
    assert sm_util_during_steps(exp) > 50


# -- settings the run used ---------------------------------------------------------------------------
@pytest.mark.process
def test_autocast_and_flags_recorded_without_param(store_dir):
    def train():
        model = torch.nn.Linear(16, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in DataLoader(SlowData(32), batch_size=BATCH):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = _compute(model, x, y)
            loss.backward()
            opt.step()

    exp = _profiled(store_dir, train)
    p = exp.meta.params
    assert (p["amp.autocast"], p["amp.dtype"], p["amp.device"]) == (True, "bfloat16", "cpu")
    assert p["cudnn.benchmark"] is False and isinstance(p["tf32.matmul"], bool) and p["float32_matmul_precision"]


@pytest.mark.process
def test_explicit_param_wins_over_what_was_seen(store_dir):
    with gp.profile("p", source="sim", store=store_dir, interval=0.02, params={"batch_size": 99}) as p:
        _train_on(DataLoader(SlowData(16), batch_size=BATCH))
    assert p.experiment.meta.params["batch_size"] == 99


# -- cost and safety ----------------------------------------------------------------------------------
def _seeded_training() -> list[torch.Tensor]:
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(7)
    loader = DataLoader(TensorDataset(torch.randn(96, 16, generator=g), torch.randint(0, 4, (96,), generator=g)),
                        batch_size=8, shuffle=True)
    for _ in range(2):
        for x, y in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.process
def test_training_is_bitwise_identical_with_and_without_profiling(store_dir):
    plain = _seeded_training()
    with gp.profile("same", source="sim", store=store_dir, interval=0.02) as p:
        profiled = _seeded_training()
    assert _steps(p.experiment)["count"] == 24  # the hooks were there
    assert all(torch.equal(a, b) for a, b in zip(plain, profiled))


@pytest.mark.process
def test_hooks_removed_after_an_error_and_an_interrupt(store_dir):
    for exc in (ValueError("bad batch"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with gp.profile("boom", source="sim", store=store_dir, interval=0.02):
                from torch.optim import optimizer

                assert optimizer._global_optimizer_pre_hooks and not _hooks_gone()
                raise exc
        assert _hooks_gone()


@pytest.mark.process
def test_a_failing_hook_is_a_note_and_the_run_goes_on(store_dir, monkeypatch):
    def broken(loader):
        raise AttributeError("no batch_size here")

    monkeypatch.setattr(torch_hooks, "loader_settings", broken)
    exp = _profiled(store_dir, lambda: _train_on(DataLoader(SlowData(16), batch_size=BATCH)))
    assert _steps(exp)["count"] == 2 and _steps(exp)["batches"] == 2
    assert any("reading the DataLoader's settings" in n and "AttributeError" in n for n in exp.meta.notes)


@pytest.mark.process
def test_odd_optimizer_is_a_note(store_dir):
    """An optimizer subclass whose param_groups is not the usual list: a note, the steps still count."""
    class Odd(torch.optim.SGD):
        def step(self, closure=None):
            return None

    def train():
        opt = Odd(torch.nn.Linear(2, 2).parameters(), lr=0.1)
        opt.param_groups = None  # kept elsewhere by this odd optimizer
        for _ in range(3):
            opt.step()

    exp = _profiled(store_dir, train)
    assert _steps(exp)["count"] == 3
    assert any("reading the optimizer's parameters" in n for n in exp.meta.notes)
    assert exp.meta.params["optimizer"] == "Odd" and "model.parameters" not in exp.meta.params


def test_no_torch_no_hooks(store_dir):
    hooks = TrainingHooks(activity=None)
    import sys

    saved = sys.modules.pop("torch")
    try:
        hooks.install()
    finally:
        sys.modules["torch"] = saved
    assert not hooks.torch_seen and not hooks._undo
