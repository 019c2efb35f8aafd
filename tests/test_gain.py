"""The one estimator of a rate and its gain (core/analysis/gain.py), on the edges a user meets."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.property_budget import examples

from gpuprof_jupyter.core.analysis.gain import MIN_STEADY_STEPS, RateEstimate, estimate, gain, run_gain
from tests.simexp import sim_experiment, steps_frame


def _run(name: str, count: int, seconds: float, batch: float = 32.0, jitter: float = 0.0, warmup: int = 0):
    steps = steps_frame(count, seconds, 0.1, batch)
    if jitter:  # alternate slow and fast blocks of steps: a wide interval
        scale = np.where((np.arange(count) // max(1, count // 5)) % 2, 1 + jitter, 1 - jitter)
        steps["duration_s"] = steps["duration_s"] * scale
    run = sim_experiment("input-bound", seconds=seconds, name=name, steps=steps)
    if warmup:
        run.meta.context["tune"] = {"warmup_steps": warmup, "objective": "throughput"}
    return run


def test_a_run_too_short_for_an_interval_is_inconclusive_with_the_reason():
    short, base = _run("short", 5 + MIN_STEADY_STEPS - 2, 1.0, warmup=5), _run("base", 40, 4.0)
    rate = estimate(short)
    assert rate.steps == MIN_STEADY_STEPS - 2 and math.isfinite(rate.value)
    assert rate.reason == "only 8 steady step(s) in short; an interval needs at least 10 (5 blocks of 2)"
    found = run_gain(short, base)
    assert not found.conclusive and found.reason == rate.reason
    assert found.text() == f"throughput inconclusive: {rate.reason}"


def test_the_warm_up_a_trial_saved_is_left_out_everywhere():
    run = _run("trial", 30, 3.0, warmup=5)
    run.steps.loc[:4, "duration_s"] = 1.0  # five slow warm-up steps
    assert estimate(run).steps == 25
    assert estimate(run).value == pytest.approx(32 * 25 / float(run.steps["duration_s"].iloc[5:].sum()))


def test_identical_runs_and_noisy_runs_are_no_gain():
    a, b = _run("a", 40, 4.0), _run("b", 40, 4.0)
    same = run_gain(b, a)
    assert same.value == pytest.approx(0.0) and not same.conclusive and "includes 0" in same.reason
    noisy = run_gain(_run("noisy", 40, 3.8, jitter=0.6), a)
    assert noisy.value > 0 and not noisy.conclusive and "includes 0" in noisy.reason


def test_a_clear_gain_has_its_interval_and_reads_the_same_from_rates():
    slow, fast = _run("slow", 40, 4.0, jitter=0.05), _run("fast", 40, 2.0, jitter=0.05)
    found = gain(estimate(fast), estimate(slow))
    assert found.conclusive and found.value == pytest.approx(1.0) and found.low < 1.0 < found.high
    assert found.text().startswith("+100 % throughput (95 % CI +")
    assert run_gain(fast, slow) == found


def test_a_run_without_steps_gives_no_rate():
    empty = sim_experiment("input-bound", seconds=1.0, name="empty")
    found = run_gain(empty, _run("base", 40, 4.0))
    assert not found.conclusive and found.reason == "no steady steps in empty"


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.floats(0.1, 1e4), min_size=5, max_size=5), st.lists(st.floats(0.1, 1e4), min_size=5, max_size=5))
def test_a_gain_is_called_only_when_its_interval_excludes_zero(a_blocks, b_blocks):
    a = RateEstimate("throughput", steps=10, value=sum(a_blocks) / 5, blocks=a_blocks)
    b = RateEstimate("throughput", steps=10, value=sum(b_blocks) / 5, blocks=b_blocks)
    found = gain(b, a)
    assert not gain(a, a).conclusive  # a run against itself is never a gain
    if found.conclusive:
        assert found.low <= found.value <= found.high and not found.low <= 0.0 <= found.high
        assert found.text().startswith(("+", "-")) and "inconclusive" not in found.text()
    else:
        assert found.text().startswith("throughput inconclusive: ") and found.reason
