"""Rules: parsing (valid and invalid), share arithmetic with gaps, phases, steps, user metrics."""

from __future__ import annotations

import os
import time

import numpy as np
import pandas as pd
import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.core.analysis.rules import RuleError, RuleFailed, evaluate_rule, parse_rule
from gpuprof_jupyter.render.findings_html import checks_text
from tests.simexp import frame_experiment, sim_experiment, steps_frame


# -- parsing --------------------------------------------------------------------------------
@pytest.mark.parametrize("text, fields", [
    ("sm_util > 60 for >=80%", dict(metric="sm_util", op=">", value=60, share_op=">=", share=0.8)),
    ("sm_util < 50 for <=30%", dict(metric="sm_util", op="<", value=50, share_op="<=", share=0.3)),
    ("sm_util>60 for 80 %", dict(op=">", value=60, share_op=">=", share=0.8)),
    ("sm_util > 60% for >= 80% in phase train", dict(phase="train", value=60)),
    ("sm_util > 60 for >=80% in phase 'data loading' per step", dict(phase="data loading", per_step=True)),
    ("sm_util > 60 for >=80% per step in phase train", dict(phase="train", per_step=True)),
    ("accuracy >= 0.92", dict(metric="accuracy", op=">=", value=0.92, share_op=None)),
    ("loss < 1e-2", dict(metric="loss", value=0.01)),
    ("sm_low_frac <= 30%", dict(metric="sm_low_frac", value=0.3)),
    ("power_w <= 350 in phase train", dict(metric="power_w", phase="train", share_op=None)),
])
def test_valid_rules(text, fields):
    rule = parse_rule(text)
    for key, value in fields.items():
        got = getattr(rule, key)
        assert got == pytest.approx(value) if isinstance(value, float) else got == value, (key, got)
    assert str(rule) == text.strip()


@pytest.mark.parametrize("text, message", [
    ("", "empty rule"),
    ("sm_util", "expected a comparison"),
    ("> 60", "expected a metric name"),
    ("sm_util > sixty", "expected a number after '>'"),
    ("sm_util >> 60", "expected a number after '>'"),
    ("sm_util => 60", "use >="),
    ("sm_util = 60", "use =="),
    ("sm_util > 60 for", "expected a share in percent after 'for'"),
    ("sm_util > 60 for 180%", "between 0 and 100"),
    ("sm_util > 60 for == 80%", "a share takes"),
    ("sm_util > 60 for 80% for 90%", "'for' given twice"),
    ("sm_util > 60 during train", "unexpected 'during'"),
    ("sm_util > 60 for 80% in train", "expected 'phase NAME' after 'in'"),
    ("sm_util > 60 for 80% in phase", "expected a phase name"),
    ("sm_util > 60 for 80% per batch", "expected 'step' after 'per'"),
    ("sm_utl > 60 for 80%", "did you mean sm_util?"),
    ("accuracy >= 0.9 for 80%", "needs a sampled metric"),
    ("sm_util > 60 per step", "add 'for >=N%'"),
])
def test_malformed_rules_name_what_is_wrong(text, message):
    with pytest.raises(RuleError) as info:
        parse_rule(text)
    assert message in str(info.value)
    if text:
        assert repr(text.strip()) in str(info.value)  # the message quotes the rule


# -- share arithmetic -----------------------------------------------------------------------
def gap_experiment(**kw):
    # interval 1 s; samples at 0..4 then 8, 9: the sample at t=4 is followed by a gap (8-4 > 2 intervals),
    # so it stands for no time. Weights: t0..t3 = 1, t4 = 0, t8 = 1, t9 = 1 (last: one interval) -> 6 s.
    t = [0, 1, 2, 3, 4, 8, 9]
    sm = [80, 80, 80, 20, 90, 20, 80]
    return frame_experiment(t, sm, interval=1.0, gaps=[[4.0, 8.0]], **kw)


def test_share_is_time_weighted_with_gaps_excluded():
    exp = gap_experiment()
    result = evaluate_rule(exp, "sm_util > 60 for >=66%")
    assert result.measured == pytest.approx(4 / 6)  # t0, t1, t2, t9 out of 6 measured seconds
    assert result.measured_s == pytest.approx(6.0)
    assert result.passed and result.kind == "time-share"
    assert not evaluate_rule(exp, "sm_util > 60 for >=67%").passed
    assert evaluate_rule(exp, "sm_util < 50 for <=34%").measured == pytest.approx(2 / 6)
    assert "66.7 % of 6.0 s measured" in result.detail


def test_share_strict_and_boundaries():
    exp = gap_experiment()
    assert evaluate_rule(exp, "sm_util >= 80 for 66.6%").passed
    assert evaluate_rule(exp, "sm_util > 80 for <1%").passed  # 90 at t=4 has no weight
    assert evaluate_rule(exp, "sm_util > 10 for 100%").passed


def test_multi_gpu_share_uses_per_tick_average():
    t = np.arange(10.0)
    exp = frame_experiment(t, None, gpus_sm=[np.full(10, 90.0), np.r_[np.full(5, 10.0), np.full(5, 90.0)]])
    # per-tick mean: 50 for t0..4, 90 for t5..9
    assert evaluate_rule(exp, "sm_util > 60 for >=50%").measured == pytest.approx(0.5)


def test_in_phase_restricts_the_time():
    phases = [{"name": "train", "start_s": 0.0, "end_s": 3.0}, {"name": "eval", "start_s": 3.0, "end_s": 10.0}]
    exp = gap_experiment(phases=phases)
    assert evaluate_rule(exp, "sm_util > 60 for 100% in phase train").measured == pytest.approx(1.0)
    r = evaluate_rule(exp, "sm_util > 60 for >=80% in phase eval")
    assert r.measured == pytest.approx(1 / 3) and not r.passed  # t3 (20), t8 (20), t9 (80); t4 has no weight
    missing = evaluate_rule(exp, "sm_util > 60 for 80% in phase warmup")
    assert missing.verdict == "CANNOT JUDGE" and not missing.passed
    assert "no phase named 'warmup'" in missing.detail and "train" in missing.detail
    assert "gpuprof_jupyter.phase('warmup')" in missing.to_judge
    assert evaluate_rule(exp, "sm_util >= 80 in phase train").measured == pytest.approx(80.0)


def test_per_step_counts_steps():
    t = np.arange(10.0)
    sm = np.array([90, 90, 20, 20, 90, 90, 90, 90, 30, 90], dtype=float)
    steps = pd.DataFrame({"t_end_s": [2.0, 4.0, 6.0, 8.0, 10.0], "duration_s": [2.0] * 5, "wait_s": [0.0] * 5,
                          "n_samples": [32.0] * 5})
    exp = frame_experiment(t, sm, steps=steps)
    # step means: [90, 20, 90, 90, 60] -> 3 of 5 above 60 (60 is not > 60)
    r = evaluate_rule(exp, "sm_util > 60 for >=80% per step")
    assert r.kind == "step-share" and r.measured == pytest.approx(0.6) and not r.passed
    assert "3 of 5 steps" in r.detail
    assert evaluate_rule(exp, "sm_util > 50 for >=80% per step").passed
    none = evaluate_rule(frame_experiment(t, sm), "sm_util > 60 for 80% per step")
    assert none.verdict == "CANNOT JUDGE" and not none.passed and "needs reported steps" in none.detail
    assert "gpuprof_jupyter.step(n_samples)" in none.to_judge


def test_steps_shorter_than_the_interval_cannot_be_judged_per_step():
    """Three 0.2 s steps under 1 s samples: each step's value is a reading shared with its
    neighbours, so the gate says CANNOT JUDGE (never PASS) and how to make it judgeable."""
    t = np.arange(4.0)
    steps = pd.DataFrame({"t_end_s": [1.2, 1.4, 2.6], "duration_s": [0.2, 0.2, 0.2], "wait_s": [0.0] * 3,
                          "n_samples": [1.0] * 3})
    exp = frame_experiment(t, [10, 90, 30, 30], steps=steps)
    for rule in ("sm_util > 60 for 60% per step", "sm_util > 5 for 10% per step", "sm_util < 50 for >30% within step"):
        r = evaluate_rule(exp, rule)
        assert (r.verdict, r.passed, r.judged, r.measured) == ("CANNOT JUDGE", False, False, None), (rule, r)
        assert "steps last 0.2 s (median)" in r.detail and "at least 1 s" in r.to_judge, r
        assert "without 'per step'" in r.to_judge
        line, = checks_text([r])
        assert line.startswith("CANNOT JUDGE ") and "PASS" not in line and "to judge it: make each" in line


def test_a_long_step_among_short_ones_uses_the_reading_in_effect():
    """A few steps shorter than the interval (median long enough): each takes the reading in
    effect at its middle."""
    t = np.arange(8.0)
    steps = pd.DataFrame({"t_end_s": [1.2, 3.5, 5.5, 7.5], "duration_s": [0.2, 2.0, 2.0, 2.0], "wait_s": [0.0] * 4,
                          "n_samples": [1.0] * 4})
    exp = frame_experiment(t, [10, 90, 30, 30, 90, 90, 90, 90], steps=steps)
    r = evaluate_rule(exp, "sm_util > 60 for 50% per step")
    assert r.verdict == "PASS" and r.measured == pytest.approx(3 / 4), r  # 90 (t=1), 30, 90, 90


def test_value_rules_on_user_metrics_and_figures():
    exp = sim_experiment("compute-bound", seconds=3, user_metrics={"accuracy": 0.923, "loss": 0.4})
    ok = evaluate_rule(exp, "accuracy >= 0.92")
    assert ok.passed and ok.measured == pytest.approx(0.923) and "0.923" in ok.detail
    assert not evaluate_rule(exp, "accuracy >= 0.95").passed
    assert evaluate_rule(exp, "duration_s < 10").passed
    assert evaluate_rule(exp, "sm_low_frac <= 30%").passed
    assert evaluate_rule(exp, "sm_util > 80").passed  # time-weighted mean
    missing = evaluate_rule(exp, "acuracy >= 0.9")
    assert missing.verdict == "CANNOT JUDGE" and "did you mean accuracy?" in missing.detail
    assert "gpuprof_jupyter.log(acuracy=...)" in missing.to_judge


def test_share_rule_on_unmeasured_metric_cannot_be_judged_saying_so():
    r = evaluate_rule(gap_experiment(), "tensor_util > 10 for 50%")
    assert r.verdict == "CANNOT JUDGE" and not r.passed and "not measured" in r.detail
    assert "gave no tensor_util reading" in r.to_judge


def test_step_figures_gate_any_source():
    """steps, step times, throughput and data wait: the gates CPU-only CI can judge."""
    exp = sim_experiment("compute-bound", seconds=3, steps=steps_frame(30, 3.0, 0.25, batch=8))
    assert [evaluate_rule(exp, rule).verdict for rule in (
        "steps >= 30", "step_time_p50_s < 0.2", "steps_per_s > 5", "samples_per_s > 50", "data_wait_frac < 30%",
        "steps > 30", "data_wait_frac < 20%")] == ["PASS"] * 5 + ["FAIL"] * 2
    none = evaluate_rule(sim_experiment("compute-bound", seconds=3), "step_time_p50_s < 0.2")
    assert none.verdict == "CANNOT JUDGE" and "gpuprof_jupyter.step(n_samples)" in none.to_judge, none


# -- at stop, stored, --fail-on-check ---------------------------------------------------------
@pytest.mark.process
def test_rules_evaluated_at_stop_and_stored(store_dir):
    with gp.profile(name="gated", source="sim:compute-bound", store=store_dir, interval=0.02,
                    checks=["sm_util > 60 for >=80%", "sm_util < 50 for <=30%"]) as p:
        time.sleep(0.2)  # 10 sample intervals: long enough to judge sm_util (analysis.provenance.MIN_WINDOWS)
        gp.log(accuracy=0.93)
    stored = gp.load("gated", store=store_dir).meta.checks
    assert [c["passed"] for c in stored] == [True, True]
    assert stored[0]["rule"] == "sm_util > 60 for >=80%" and stored[0]["measured"] == pytest.approx(1.0)
    assert [r.passed for r in gp.check("gated", "accuracy >= 0.92", store=store_dir)] == [True]
    assert p.experiment.meta.checks == stored


@pytest.mark.process
def test_fail_on_check_raises_after_saving(store_dir):
    with pytest.raises(RuleFailed) as info:
        with gp.profile(name="gate-fails", source="sim:input-bound", store=store_dir, interval=0.02,
                        checks=["sm_util > 60 for >=80%"], fail_on_check=True):
            time.sleep(0.5)  # the scenario is busy 40 % of each second
    assert "gate-fails" in str(info.value) and "sm_util > 60 for >=80%" in str(info.value)
    assert gp.load("gate-fails", store=store_dir).meta.checks[0]["passed"] is False  # saved first


@pytest.mark.process
def test_fail_on_check_raises_for_a_rule_that_cannot_be_judged(store_dir):
    """No GPU (host source): a GPU gate is not a pass, so --fail-on-check / fail_on_check raises,
    saying the rule cannot be judged and how to make it judgeable."""
    with pytest.raises(RuleFailed) as info:
        with gp.profile(name="no-gpu", source="host", store=store_dir, interval=0.02,
                        checks=["sm_util > 60 for >=80%", "duration_s >= 0"], fail_on_check=True):
            time.sleep(0.1)
    message = str(info.value)
    assert "1 rule(s) did not pass (1 cannot be judged)" in message and "CANNOT JUDGE sm_util > 60" in message
    assert "to judge it: sm_util is a GPU metric" in message and "duration_s" not in message
    assert [c["judged"] for c in gp.load("no-gpu", store=store_dir).meta.checks] == [False, True]  # saved first


def test_malformed_rule_fails_before_profiling(store_dir):
    with pytest.raises(RuleError, match="expected a number"):
        with gp.profile(name="x", source="sim", store=store_dir, checks=["sm_util > lots for 80%"]):
            pass
    assert not store_dir.exists() or not gp.Store(store_dir).list()


# -- sample= and GPUPROF_DISABLE ------------------------------------------------------------------
@pytest.mark.process
def test_sample_profiles_one_call_in_ten(store_dir):
    calls = []

    @gp.profile(name="sampled", source="sim", store=store_dir, interval=0.05, sample=0.1)
    def work(i):
        calls.append(i)
        return i * 2

    assert [work(i) for i in range(21)] == [i * 2 for i in range(21)]
    assert len(calls) == 21
    assert len(gp.Store(store_dir).list()) == 3  # calls 1, 11 and 21


def test_sample_must_be_a_share():
    with pytest.raises(ValueError, match="sample must be"):
        gp.profile(sample=0)
    with pytest.raises(ValueError, match="sample must be"):
        gp.profile(sample=2)


@pytest.mark.process
def test_disable_costs_nothing(store_dir, monkeypatch):
    monkeypatch.setenv("GPUPROF_DISABLE", "1")

    def work():
        return 42

    assert gp.profile(name="off", source="sim", store=store_dir)(work) is work  # the function itself
    with gp.profile(name="off", source="sim", store=store_dir) as p:
        pass
    assert p.session is None and p.experiment is None
    assert not store_dir.exists()
    monkeypatch.setenv("GPUPROF_DISABLE", "0")
    with gp.profile(name="on", source="sim", store=store_dir, interval=0.05) as p:
        pass
    assert p.experiment is not None and os.path.isdir(store_dir)


# -- exact boundaries (issue 10, part 5) ----------------------------------------------------
_SHARE_OPS = {">=": lambda s, b: s >= b, ">": lambda s, b: s > b, "<=": lambda s, b: s <= b, "<": lambda s, b: s < b}


@pytest.mark.parametrize("share_op", list(_SHARE_OPS))
@pytest.mark.parametrize("above", [79, 80, 81])  # below, on and above the 80 % boundary
def test_time_share_boundaries_are_exact_for_every_operator(share_op, above):
    t = np.arange(100) * 0.1  # float spacings that do not sum exactly (0.30000000000000004 - 0.2 ...)
    sm = np.r_[np.full(above, 90.0), np.full(100 - above, 10.0)]
    result = evaluate_rule(frame_experiment(t, sm, interval=0.1), f"sm_util > 60 for {share_op}80%")
    assert result.passed is _SHARE_OPS[share_op](above, 80), (share_op, above, result.detail)


@pytest.mark.parametrize("share_op", list(_SHARE_OPS))
@pytest.mark.parametrize("above", [3, 4, 5])  # 3/5, 4/5 (exactly 80 %), 5/5 of the steps
def test_step_share_boundaries_are_exact_for_every_operator(share_op, above):
    t = np.arange(50) * 0.1
    sm = np.concatenate([np.full(10, 90.0 if k < above else 10.0) for k in range(5)])
    steps = pd.DataFrame({"t_end_s": np.arange(1, 6) * 1.0, "duration_s": np.full(5, 1.0),
                          "wait_s": np.zeros(5), "n_samples": np.full(5, 32.0)})
    result = evaluate_rule(frame_experiment(t, sm, interval=0.1, steps=steps), f"sm_util > 60 for {share_op}80% per step")
    assert result.passed is _SHARE_OPS[share_op](above, 4), (share_op, above, result.detail)


def test_fractional_share_threshold_is_exact():
    t = np.arange(1000) * 0.01
    sm = np.r_[np.full(805, 90.0), np.full(195, 10.0)]  # 80.5 % of the time
    exp = frame_experiment(t, sm, interval=0.01)
    assert evaluate_rule(exp, "sm_util > 60 for >=80.5%").passed
    assert not evaluate_rule(exp, "sm_util > 60 for >80.5%").passed


def test_a_quoted_rule_is_a_malformed_rule():
    """Quotes belong to the magic's argument syntax and are stripped there, in one place."""
    with pytest.raises(RuleError):
        parse_rule('"sm_util > 60 for >=80%"')
