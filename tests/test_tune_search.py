"""--tune without a kernel: the spec, the search's decisions, the loader knobs, the restore."""

from __future__ import annotations

import math
import random

import numpy as np
import psutil
import pytest
import torch

from gpuprof_jupyter.runtime.tune.loader_knobs import LoaderKnobs
from gpuprof_jupyter.core.analysis.gain import RateEstimate
from gpuprof_jupyter.runtime.tune.measure import TrialFigures
from gpuprof_jupyter.runtime.tune.opt_ins import OptInValues
from gpuprof_jupyter.runtime.tune.search import Coordinate, Search, TrialPlan, loader_coordinates, order_coordinates
from gpuprof_jupyter.runtime.tune.spec import make_spec, parse_budget, parse_opt_in
from gpuprof_jupyter.runtime.tune.state import Snapshot


# -- the spec ----------------------------------------------------------------------------------
@pytest.mark.parametrize("text, seconds", [("5min", 300), ("90s", 90), ("90", 90), ("1.5h", 5400), (12, 12)])
def test_budget_parses(text, seconds):
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("bad", ["five minutes", "-3s", "0", "5 parsecs"])
def test_a_bad_budget_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="--budget"):
        parse_budget(bad)


def test_opt_in_fields_parse_and_bad_ones_are_named():
    opt = parse_opt_in("train_config.batch_size=32,64")
    assert (opt.variable, opt.path, opt.values, opt.key) == ("train_config", ("batch_size",), (32, 64),
                                                              "train_config.batch_size")
    assert parse_opt_in("cfg.amp=false,true").values == (False, True)
    for bad in ("batch_size=32", "cfg.batch_size", "cfg.=1", "cfg.batch_size="):
        with pytest.raises(ValueError, match="--tune"):
            parse_opt_in(bad)
    with pytest.raises(ValueError, match="twice"):
        make_spec(["c.a=1", "c.a=2"])
    with pytest.raises(ValueError, match="--objective"):
        make_spec(objective="speed")
    with pytest.raises(ValueError, match="--trial-steps"):
        make_spec(trial_steps=1)
    # fewer steady steps than an interval needs is a clear error, not an absurd interval later
    with pytest.raises(ValueError, match=r"--trial-steps must be an integer >= 10: a trial's 95 % interval"):
        make_spec(trial_steps=8)
    assert make_spec(trial_steps=10).trial_steps == 10


# -- the search, with a fake trial runner ------------------------------------------------------
def _figures(score: float, spread: float = 0.01, wait: float = 0.5, checks_failed=()) -> TrialFigures:
    blocks = [score * (1 + spread * d) for d in (-1, -0.5, 0, 0.5, 1)]
    rate = RateEstimate("throughput", steps=20, value=score, blocks=blocks)
    return TrialFigures(steps=20, samples_per_s=score, score=score, rate=rate, data_wait_frac=wait,
                        checks_failed=list(checks_failed), score_ci=rate.interval)


class FakeRunner:
    """Throughput as a function of the settings; the baseline's two runs differ by ``noise``.
    The cell has ``cell_steps`` steps, each ``step_s`` long on the search's clock."""

    def __init__(self, model, noise=0.02, wall_s=1.0, checks=lambda s: (), cell_steps=500, spread=0.01):
        self.model, self.noise, self.wall_s, self.checks, self.calls = model, noise, wall_s, checks, []
        self.cell_steps, self.spread = cell_steps, spread
        self.now = 0.0  # the search's clock

    def __call__(self, trial, steps, deadline):
        self.calls.append((dict(trial.settings), steps))
        score = self.model(trial.settings)
        if not trial.settings and len(self.calls) == 2:
            score *= 1 + self.noise
        want = self.cell_steps if steps is None else min(steps, self.cell_steps)
        step_s = self.wall_s / self.cell_steps
        room = int((deadline - self.now) / step_s) + 1 if deadline is not None else want
        trial.steps_run = min(want, room)
        trial.cut_by_budget = room < want
        trial.figures = _figures(score, self.spread, checks_failed=self.checks(trial.settings))
        trial.wall_s = trial.steps_run * step_s
        self.now += trial.wall_s
        return trial


def _search(runner, budget="5min", opt_ins=(), whole_cell=False):
    spec = make_spec(list(opt_ins), 20, budget)
    plan = TrialPlan(5, None) if whole_cell else TrialPlan(5, 25)
    return Search(spec, "t", runner, plan, clock=lambda: runner.now)


def test_workers_win_prefetch_under_the_noise_stops_that_direction():
    def model(s):
        w = s.get("num_workers", 0)
        return {0: 100.0, 2: 160.0, 4: 161.0}.get(w, 150.0) * (1.01 if s.get("prefetch_factor") == 4 else 1.0)
    runner = FakeRunner(model)
    search = _search(runner)
    reference = search.baseline()
    coords, _ = loader_coordinates({"num_workers": 0}, cpus=4, cuda_in_use=False)
    result = search.run(coords, {"num_workers": 0}, reference)
    verdicts = [(t.label, t.verdict) for t in result.trials]
    assert verdicts[:3] == [("baseline", "baseline"), ("baseline (repeat)", "baseline (noise)"),
                            ("num_workers 0 -> 2", "kept")]
    more = dict(verdicts)["num_workers 2 -> 4"]  # +0.6 %, interval across 0: the direction stops
    assert more.startswith("throughput inconclusive: its 95 % interval") and "includes 0" in more
    assert not any("num_workers 4 -> 8" in label for label, _ in verdicts)
    assert result.best_settings == {"num_workers": 2}
    assert result.winner.settings == {"num_workers": 2}
    assert result.noise == pytest.approx(0.02, rel=0.05)
    assert {steps for _, steps in runner.calls} == {25}  # like for like: every trial the same steps


def test_a_trial_that_fails_the_check_never_wins():
    runner = FakeRunner(lambda s: 200.0 if s.get("num_workers") else 100.0,
                        checks=lambda s: ["sm_util > 60 for >=80%"] if s.get("num_workers") == 2 else ())
    search = _search(runner)
    ref = search.baseline()
    result = search.run([Coordinate("num_workers", [2])], {"num_workers": 0}, ref)
    assert result.trials[-1].verdict == "kept (fails a check)"
    assert result.winner is not None and result.winner.settings == {}  # the baseline passed; the faster one did not


def test_the_budget_ends_the_search_before_a_trial_that_would_not_fit():
    runner = FakeRunner(lambda s: 100.0 + 50 * s.get("num_workers", 0), wall_s=40.0, cell_steps=25)
    search = _search(runner, budget="100s")
    ref = search.baseline()
    result = search.run([Coordinate("num_workers", [2, 4, 8, 16])], {"num_workers": 0}, ref)
    assert "budget" in result.stopped
    assert len(result.trials) < 6
    assert runner.now <= 100.0


def test_an_inconclusive_trial_is_never_a_gain():
    """A noisy trial whose interval includes 0 is "inconclusive" with the reason, not kept."""
    runner = FakeRunner(lambda s: 112.0 if s.get("num_workers") else 100.0, spread=0.4)
    search = _search(runner)
    ref = search.baseline()
    result = search.run([Coordinate("num_workers", [2])], {"num_workers": 0}, ref)
    trial = result.trials[-1]
    assert trial.gain.value == pytest.approx(0.12) and not trial.gain.conclusive
    assert trial.verdict.startswith("throughput inconclusive: its 95 % interval") and "includes 0" in trial.verdict
    assert result.best_settings == {} and result.winner.settings == {}


def test_order_follows_the_diagnosis():
    loader = [Coordinate("num_workers", [2])]
    opt = [Coordinate("cfg.batch_size", [64], True), Coordinate("cfg.amp", [True], True)]
    order, why = order_coordinates(loader, opt, data_wait=0.45)
    assert [c.knob for c in order] == ["num_workers", "cfg.batch_size", "cfg.amp"] and "input-bound" in why
    order, why = order_coordinates(loader, opt, data_wait=0.03)
    assert [c.knob for c in order] == ["cfg.amp", "num_workers", "cfg.batch_size"] and "precision first" in why


def test_opt_in_trials_run_the_whole_cell_and_loader_knobs_need_workers():
    runner = FakeRunner(lambda s: 100.0 * (1.3 if s.get("cfg.amp") else 1.0))
    search = _search(runner, opt_ins=["cfg.amp=true"], whole_cell=True)
    ref = search.baseline()
    coords = [Coordinate("prefetch_factor", [4]), Coordinate("cfg.amp", [True], True)]
    result = search.run(coords, {"num_workers": 0, "cfg.amp": False}, ref)
    assert "needs DataLoader workers" in result.not_tried["prefetch_factor"]
    assert runner.calls == [({}, None), ({}, None), ({"cfg.amp": True}, None)]  # every one the whole cell


def test_an_opted_in_search_on_a_long_cell_runs_like_for_like_within_its_budget():
    """A cell of 500 steps that takes 120 s: a whole-cell baseline would eat the budget, so the
    baseline is cut at a quarter of it and every later trial runs the steps it reached."""
    runner = FakeRunner(lambda s: 100.0 * (1.3 if s.get("cfg.amp") else 1.0), wall_s=120.0, cell_steps=500)
    search = _search(runner, budget="180s", opt_ins=["cfg.amp=true"], whole_cell=True)
    ref = search.baseline()
    result = search.run([Coordinate("num_workers", [2, 4]), Coordinate("cfg.amp", [True], True)],
                        {"num_workers": 0, "cfg.amp": False}, ref)
    reached = result.trials[0].steps_run
    assert reached < 500 and result.plan.steps == reached and "a quarter of the budget" in result.plan.why
    assert runner.calls[0] == ({}, None) and all(steps == reached for _, steps in runner.calls[1:])
    compared = [t for t in result.trials if t.gain is not None]
    assert compared and all(t.steps_run == reached for t in compared)  # no claim from unequal runs
    assert runner.now <= 180.0 and any("plan changed" in line for line in result.plan_text)


def test_loader_coordinates_respect_the_cpus_and_cuda():
    coords, skipped = loader_coordinates({"num_workers": 0}, cpus=2, cuda_in_use=False)
    assert coords[0].knob == "num_workers" and coords[0].values == [2]
    assert "CUDA is not in use" in skipped["pin_memory"]
    coords, skipped = loader_coordinates({"num_workers": 8}, cpus=8, cuda_in_use=True)
    assert "num_workers" in skipped and "pin_memory" in [c.knob for c in coords]


# -- loader knobs ------------------------------------------------------------------------------
class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.tensor([float(i * i)])


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.process
def test_a_loader_built_in_the_trial_gets_every_knob_and_its_workers_are_shut_down():
    before = _children()
    with LoaderKnobs({"num_workers": 2, "prefetch_factor": 4, "persistent_workers": True}) as knobs:
        loader = torch.utils.data.DataLoader(Squares(), batch_size=8)  # the user's code asked for none of it
        assert (loader.num_workers, loader.prefetch_factor, loader.persistent_workers) == (2, 4, True)
        batches = [b for _, b in zip(range(3), loader)]  # abandoned mid-epoch, as a trial stop does
        assert len(batches) == 3
    assert knobs.reached == {"num_workers": "built in the trial", "prefetch_factor": "built in the trial",
                             "persistent_workers": "built in the trial"}
    assert _children() <= before  # no worker left behind
    assert torch.utils.data.DataLoader.__init__.__name__ == "__init__" and "knobs" not in str(
        torch.utils.data.DataLoader.__init__.__code__.co_freevars)


@pytest.mark.process
def test_a_loader_built_before_is_set_then_put_back_and_persistent_workers_is_named():
    loader = torch.utils.data.DataLoader(Squares(), batch_size=8, num_workers=0)
    with LoaderKnobs({"num_workers": 2, "persistent_workers": True}) as knobs:
        assert sum(len(b) for b in loader) == 64
        assert loader.num_workers == 2
    assert loader.num_workers == 0 and loader.persistent_workers is False
    assert "torch forbids changing persistent_workers" in knobs.unreachable["persistent_workers"]
    assert knobs.reached["num_workers"] == "set on a loader built before the cell"


@pytest.mark.process
def test_a_loader_on_a_batch_sampler_keeps_working():
    sampler = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(range(64)), 8, False)
    with LoaderKnobs({"num_workers": 2}):
        loader = torch.utils.data.DataLoader(Squares(), batch_sampler=sampler)
        assert loader.batch_size is None and sum(len(b) for b in loader) == 64


def test_opt_in_values_are_set_and_put_back():
    class Config:
        batch_size, amp = 32, False
    cfg, ns = Config(), {}
    ns["cfg"] = cfg
    with OptInValues(ns, {"cfg.batch_size": 64, "cfg.amp": True}):
        assert (cfg.batch_size, cfg.amp) == (64, True)
    assert (cfg.batch_size, cfg.amp) == (32, False)
    ns["d"] = {"lr": 0.1}
    with OptInValues(ns, {"d.lr": 0.2}):
        assert ns["d"]["lr"] == 0.2
    assert ns["d"] == {"lr": 0.1}


# -- the user's state --------------------------------------------------------------------------
def test_model_optimizer_scheduler_rng_and_bindings_come_back_bitwise():
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    for _ in range(3):  # real optimizer state and a grad
        loss = model(torch.randn(5, 4)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    ns = {"model": model, "opt": opt, "sched": sched, "keep": 1}
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    grads = [p.grad.clone() for p in model.parameters()]
    opt_state = {k: {n: t.clone() for n, t in s.items()} for k, s in opt.state_dict()["state"].items()}
    sched_state = dict(sched.state_dict())
    rng = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state().clone())
    snap = Snapshot(ns)
    for _ in range(4):  # a trial trains on
        opt.zero_grad()
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
        sched.step()
    random.random(), np.random.rand(), torch.rand(1)
    ns["keep"], ns["new"] = 2, 3
    snap.restore()
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    now = opt.state_dict()["state"]
    assert all(torch.equal(opt_state[k][n], now[k][n]) for k in opt_state for n in opt_state[k])
    assert sched.state_dict() == sched_state
    assert random.getstate() == rng[0] and (np.random.get_state()[1] == rng[1]).all()
    assert torch.equal(torch.get_rng_state(), rng[2])
    assert ns == {"model": model, "opt": opt, "sched": sched, "keep": 1}
    assert snap.size_bytes() > 0 and not math.isnan(snap.size_bytes())


def test_a_cell_shorter_than_the_plan_runs_whole_in_every_trial():
    runner = FakeRunner(lambda s: 100.0 + 50 * s.get("num_workers", 0), cell_steps=18)
    search = _search(runner)
    ref = search.baseline()
    result = search.run([Coordinate("num_workers", [2])], {"num_workers": 0}, ref)
    assert result.plan.steps is None and "the cell has 18 steps" in result.plan.why
    assert runner.calls == [({}, 25), ({}, None), ({"num_workers": 2}, None)]
    assert result.trials[-1].verdict == "kept"


def test_a_cell_too_short_to_measure_is_said_and_nothing_is_claimed():
    runner = FakeRunner(lambda s: 100.0, cell_steps=9)
    search = _search(runner)
    assert search.baseline() is None
    assert "the cell ran 9 step(s), fewer than the 5 warm-up + 10 steady steps" in search.result.stopped


def test_a_slower_trial_says_so():
    runner = FakeRunner(lambda s: 60.0 if s.get("num_workers") else 100.0)
    search = _search(runner)
    result = search.run([Coordinate("num_workers", [2])], {"num_workers": 0}, search.baseline())
    assert result.trials[-1].verdict.startswith("slower: -40 % throughput (95 % CI -")
