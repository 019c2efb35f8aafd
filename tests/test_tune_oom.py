"""--tune over batch size survives out-of-memory (docs/tune.md, "Out of memory"): a trial that
raises torch.OutOfMemoryError is saved as "does not fit", its memory is released, the user's
state comes back, and the search goes on below; an opted-in accumulation field keeps the
effective batch. A fake allocator limit (tests/fake_torch_cuda.py) raises torch's real error."""

from __future__ import annotations

import time

import pytest
import torch

import gpuprof_jupyter as gp
from gpuprof_jupyter.runtime.run_options import RunOptions
from gpuprof_jupyter.runtime.tune.driver import tune_body
from gpuprof_jupyter.runtime.tune.effective_batch import EffectiveBatch
from gpuprof_jupyter.runtime.tune.oom import DOES_NOT_FIT
from gpuprof_jupyter.runtime.tune.search import Coordinate, Search, TrialPlan
from gpuprof_jupyter.runtime.tune.spec import make_spec, parse_opt_in
from gpuprof_jupyter.notebook.tune_view import TuneReport
from tests.fake_torch_cuda import GIB, FakeCuda
from tests.test_tune_search import FakeRunner

WIDTH = 1000  # floats held per sample during a step
SCALE = 100_000  # -> 400 MB per sample on the fake GPU: batch 128 (51 GB) does not fit 40 GiB


# -- the search, with a fake trial runner ------------------------------------------------------
class OomRunner(FakeRunner):
    def __init__(self, limit, **kwargs):
        super().__init__(lambda s: float(s.get("cfg.batch_size", 32)), **kwargs)
        self.limit = limit

    def __call__(self, trial, steps, deadline):
        if trial.settings.get("cfg.batch_size", 32) >= self.limit:
            self.calls.append((dict(trial.settings), steps))
            trial.error, trial.oom, trial.wall_s = "OutOfMemoryError: CUDA out of memory.", True, 1.0
            return trial
        return super().__call__(trial, steps, deadline)


def _search(runner, estimate=None):
    spec = make_spec(["cfg.batch_size=64,128,256"], 20, "5min")
    return Search(spec, "t", runner, TrialPlan(5, None), clock=lambda: runner.now, estimate=estimate)


def test_an_oom_trial_does_not_fit_larger_values_are_skipped_and_the_estimate_is_tried():
    runner = OomRunner(limit=128)
    asked = []

    def estimate(knob, trials):
        asked.append((knob, [t.settings.get(knob) for t in trials]))
        return 96

    search = _search(runner, estimate)
    result = search.run([Coordinate("cfg.batch_size", [64, 128, 256], True)], {"cfg.batch_size": 32},
                        search.baseline())
    verdicts = [(t.label, t.verdict) for t in result.trials[2:]]
    assert verdicts == [("cfg.batch_size 32 -> 64", "kept"), ("cfg.batch_size 64 -> 128", DOES_NOT_FIT),
                        ("cfg.batch_size 64 -> 96", "kept")]
    assert "did not fit" in result.not_tried["cfg.batch_size=256"]
    assert asked == [("cfg.batch_size", [None, None, 64, 128])]
    assert result.best_settings == {"cfg.batch_size": 96} and result.winner.settings == {"cfg.batch_size": 96}


def test_values_listed_downwards_go_on_below_and_other_errors_still_stop():
    runner = OomRunner(limit=128)
    search = _search(runner)
    result = search.run([Coordinate("cfg.batch_size", [256, 128, 64], True)], {"cfg.batch_size": 32},
                        search.baseline())
    assert [t.verdict for t in result.trials[2:]] == [DOES_NOT_FIT, DOES_NOT_FIT, "kept"]

    class Broken(OomRunner):
        def __call__(self, trial, steps, deadline):
            if trial.settings:
                trial.error, trial.wall_s = "ValueError: a bug", 1.0
                return trial
            return super().__call__(trial, steps, deadline)

    runner = Broken(limit=1000)
    search = _search(runner)
    result = search.run([Coordinate("cfg.batch_size", [64, 128], True)], {"cfg.batch_size": 32}, search.baseline())
    assert [t.verdict for t in result.trials[2:]] == ["raised: ValueError: a bug"]  # a bug is not an answer


def test_a_baseline_that_does_not_fit_says_so():
    runner = OomRunner(limit=32)
    search = _search(runner)
    assert search.baseline() is None
    assert "the baseline does not fit in GPU memory" in search.result.stopped


# -- a real training loop ------------------------------------------------------------------------
class Config:
    def __init__(self, batch_size=32, grad_accum=1):
        self.batch_size, self.grad_accum = batch_size, grad_accum


def _batches(n, steps):
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        yield torch.randn(n, 16, generator=g)


def _setup(monkeypatch):
    fake = FakeCuda(total=40 * GIB, scale=SCALE).install(monkeypatch)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cfg = Config()
    seen = []

    def train():
        seen.append((cfg.batch_size, cfg.grad_accum))
        for i, x in enumerate(gp.track(_batches(cfg.batch_size, 20 * cfg.grad_accum))):  # 20 steps: 5 warm-up + 10 measured fit
            acts = fake.hold(torch.empty(cfg.batch_size * WIDTH))  # what the GPU holds for this batch
            model(x).sum().backward()
            time.sleep(0.02)  # the GPU's work for one batch
            del acts
            if (i + 1) % cfg.grad_accum == 0:
                opt.step()
                opt.zero_grad()

    return fake, model, opt, cfg, seen, train


@pytest.mark.process
def test_tuning_batch_size_survives_oom_and_finds_the_largest_that_fits(store_dir, monkeypatch):
    fake, model, opt, cfg, seen, train = _setup(monkeypatch)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    held = []

    def on_trial(trial, done):
        if done:
            held.append((trial.label, fake.allocated, fake.emptied))

    spec = make_spec(["cfg.batch_size=64,128,256"], 10, "5min")
    result = tune_body(train, spec, {"cfg": cfg, "model": model, "opt": opt}, run_name="bs",
                       session_options=RunOptions(source="sim", store=store_dir, interval=0.05), on_trial=on_trial)
    by_label = {t.label: t for t in result.trials}
    assert "cfg.batch_size 64 -> 128" in by_label, [(t.label, t.verdict, t.error, t.gain, result.noise) for t in result.trials]
    oom = by_label["cfg.batch_size 64 -> 128"]
    assert oom.verdict == DOES_NOT_FIT and oom.oom
    saved = gp.load(oom.experiment.meta.id, store=store_dir)
    assert saved.meta.status == "error" and "OutOfMemoryError" in saved.meta.error
    assert saved.meta.context["tune"]["verdict"] == DOES_NOT_FIT
    # released before the next trial: nothing of the failed trial is still held, the cache emptied
    _, allocated, emptied = next(h for h in held if h[0] == oom.label)
    assert allocated == 0 and emptied >= 1
    # the search went on below: the largest batch the trials so far say fits (96), not 256
    assert "cfg.batch_size 64 -> 96" in by_label and by_label["cfg.batch_size 64 -> 96"].error is None
    assert "did not fit" in result.not_tried["cfg.batch_size=256"]
    assert result.best_settings["cfg.batch_size"] == 96
    assert (128, 1) in seen and (256, 1) not in seen
    # the user's state as before tuning
    assert cfg.batch_size == 32 and all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    fit = gp.largest_batch(result)
    assert fit.batch == 96 and gp.largest_batch(TuneReport(result)).batch == 96 and fit.per_sample_bytes == pytest.approx(4 * WIDTH * SCALE, rel=0.01)


@pytest.mark.process
def test_an_opted_in_accumulation_keeps_the_effective_batch(store_dir, monkeypatch):
    _, model, opt, cfg, seen, train = _setup(monkeypatch)
    cfg.batch_size, cfg.grad_accum = 32, 4  # effective batch 128
    spec = make_spec(["cfg.batch_size=64,48,128,256", "cfg.grad_accum=effective"], 10, "5min")
    result = tune_body(train, spec, {"cfg": cfg, "model": model, "opt": opt}, run_name="acc",
                       session_options=RunOptions(source="sim", store=store_dir, interval=0.05))
    assert {b * a for b, a in seen} == {128}  # every trial kept the effective batch
    assert (64, 2) in seen and (128, 1) in seen
    assert "does not divide the effective batch 128" in result.not_tried["cfg.batch_size=48"]
    labels = [t.label for t in result.trials]
    assert "cfg.batch_size 32 -> 64 (cfg.grad_accum 4 -> 2: effective batch 128)" in labels
    assert any(t.verdict == DOES_NOT_FIT for t in result.trials)  # 128 in one batch: 51 GB
    assert (cfg.batch_size, cfg.grad_accum) == (32, 4)


def test_an_accumulation_field_needs_one_batch_field_to_follow():
    current = {"cfg.batch_size": 32, "cfg.grad_accum": 2, "cfg.micro_batch": 8, "cfg.amp": False}
    follow = parse_opt_in("cfg.grad_accum=effective")
    with pytest.raises(ValueError, match="one opted-in batch-size field"):
        EffectiveBatch.from_opt_ins([follow, parse_opt_in("cfg.amp=true")], current)
    with pytest.raises(ValueError, match="one opted-in batch-size field"):
        EffectiveBatch.from_opt_ins([follow, parse_opt_in("cfg.batch_size=64"), parse_opt_in("cfg.micro_batch=4")],
                                    current)
    with pytest.raises(ValueError, match="whole number"):
        EffectiveBatch.from_opt_ins([follow, parse_opt_in("cfg.batch_size=64")], {**current, "cfg.grad_accum": 1.5})
    effective = EffectiveBatch.from_opt_ins([follow, parse_opt_in("cfg.batch_size=64")], current)
    assert effective.follow({"cfg.batch_size": 16}, {}) == ({"cfg.batch_size": 16, "cfg.grad_accum": 4},
                                                           {"cfg.grad_accum": (2, 4)})
    assert effective.largest_divisor(50) == 32 and not effective.fits(48)
