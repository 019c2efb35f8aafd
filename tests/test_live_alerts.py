"""Issue 10 part 8: the seeds' alert ('within step') beside their gate ('per step'), judged at
stop and live (analysis.live_alerts): exact boundaries, gaps excluded, the sliding window, the
rate limit, the evidence and next step, parse errors, the config, the magic and the views."""

from __future__ import annotations

import json
import pickle
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from IPython.core.error import UsageError

from gpuprof_jupyter.core.analysis import diagnosis
from gpuprof_jupyter.core.analysis.live_alerts import MIN_REPEAT_S, Alert, LiveAlertEvaluator, parse_alerts
from gpuprof_jupyter.core.analysis.rules import RuleError, evaluate_rule, parse_rule, step_time_shares
from gpuprof_jupyter.core.config import ConfigError, load_config
from gpuprof_jupyter.core.store.experiment import ExperimentMeta
from gpuprof_jupyter.render.alerts_html import alert_header_html, alert_text
from gpuprof_jupyter.render.findings_html import analysis_html, analysis_text
from gpuprof_jupyter.notebook.cell_options import session_options
from gpuprof_jupyter.notebook.magic import parse_line
from tests.simexp import frame_experiment

ALERT = "sm_util < 50 for >30% within step"
GATE = "sm_util > 60 for >=80% per step"


def feed(evaluator, t, sm, device="gpu0", cpu=None):
    for k, (tt, v) in enumerate(zip(t, sm)):
        evaluator.add_row(float(tt), device, {"sm_util": float(v), "power_w": 200.0})
        if cpu is not None:
            evaluator.add_row(float(tt), "host", {"cpu_util": cpu})


# -- the grammar ------------------------------------------------------------------------------
def test_within_step_parses_beside_per_step():
    alert, gate = parse_rule(ALERT), parse_rule(GATE)
    assert alert.within_step and not alert.per_step and alert.share_op == ">" and alert.share == Fraction(3, 10)
    assert gate.per_step and not gate.within_step
    assert parse_rule("sm_util < 50 for >30% within iterations").within_step


@pytest.mark.parametrize("text, message", [
    ("sm_util < 50 for >30% within batch", "expected 'step' after 'within'"),
    ("sm_util < 50 within step", "'within step' is a share of each step's time: add 'for >N%'"),
    ("sm_util < 50 for >30% within step per step", "exclude each other"),
    ("sm_util < 50 for >30% inside step", "'per step' or 'within step'"),
])
def test_within_step_parse_errors(text, message):
    with pytest.raises(RuleError, match=message):
        parse_rule(text)


@pytest.mark.parametrize("text, message", [
    ("accuracy < 0.9", "alerts watch a sampled metric"),
    (GATE, "'per step' is a share of the run's steps"),
    ("sm_util < 50 for >30% in phase train", "'in phase' is not judged live"),
    ("sm_util < lots", "expected a number"),
])
def test_alert_parse_errors(text, message):
    with pytest.raises(RuleError, match=message):
        parse_alerts([text])


# -- the 30 % boundary within a step, at stop and live -----------------------------------------
def one_step_of(below: int, steps: int = 1):
    """Steps of 1 s sampled every 0.1 s; in each, the first ``below`` samples read 20 %, the rest 90 %."""
    t = np.arange(10 * steps) * 0.1
    sm = np.tile(np.r_[np.full(below, 20.0), np.full(10 - below, 90.0)], steps)
    frame = pd.DataFrame({"t_end_s": np.arange(1, steps + 1) * 1.0, "duration_s": np.ones(steps),
                          "wait_s": np.full(steps, 0.5), "n_samples": np.full(steps, 32.0)})
    return t, sm, frame


@pytest.mark.parametrize("below, fires", [(2, False), (3, False), (4, True)])  # 20 %, exactly 30 %, 40 %
def test_within_step_boundary_at_stop(below, fires):
    t, sm, steps = one_step_of(below, steps=3)
    result = evaluate_rule(frame_experiment(t, sm, interval=0.1, steps=steps), ALERT)
    assert result.kind == "step-time-share" and result.passed is fires, result.detail
    assert result.measured == (1.0 if fires else 0.0)
    assert [share for _, _, share in step_time_shares(frame_experiment(t, sm, interval=0.1, steps=steps),
                                                      parse_rule(ALERT))] == [Fraction(below, 10)] * 3
    assert evaluate_rule(frame_experiment(t, sm, interval=0.1, steps=steps),
                         "sm_util < 50 for >=30% within step").passed is (below >= 3)


@pytest.mark.parametrize("below, fires", [(2, False), (3, False), (4, True)])
def test_within_step_boundary_live(below, fires):
    t, sm, _ = one_step_of(below)
    ev = LiveAlertEvaluator([ALERT], interval_s=0.1)
    feed(ev, np.r_[t, 1.0], np.r_[sm, 90.0])
    ev.add_step(1.0, 1.0, 0.5)
    alerts = ev.evaluate(1.05)
    assert len(alerts) == int(fires)
    if fires:
        assert alerts[0].span == "step" and alerts[0].measured == pytest.approx(0.4)
        assert alerts[0].measured_s == pytest.approx(1.0)


def test_a_step_is_judged_on_its_own_time_with_gaps_excluded():
    # one step [0, 1): samples every 0.1 s; the sampler paused from 0.3 to 0.7 (recorded gap).
    # Below 50 at 0.0 and 0.1 only; 0.3 reads 90 and stands for no time (the gap's start).
    t = [0.0, 0.1, 0.2, 0.3, 0.7, 0.8, 0.9, 1.0]
    sm = [20, 20, 90, 90, 90, 90, 90, 90]
    steps = pd.DataFrame({"t_end_s": [1.0], "duration_s": [1.0], "wait_s": [0.0], "n_samples": [1.0]})
    exp = frame_experiment(t, sm, interval=0.1, steps=steps, gaps=[[0.3, 0.7]])
    assert step_time_shares(exp, parse_rule(ALERT))[0][2] == Fraction(2, 6)  # 0.2 s of 0.6 s measured
    assert evaluate_rule(exp, ALERT).passed
    no_gap = frame_experiment(t, sm, interval=0.1, steps=steps)  # the 0.3 sample would stand for 0.4 s: 2/10
    assert not evaluate_rule(no_gap, ALERT).passed
    ev = LiveAlertEvaluator([ALERT], interval_s=0.1)
    feed(ev, t, sm)
    ev.add_gap(0.3, 0.7)
    ev.add_step(1.0, 1.0, 0.0)
    (alert,) = ev.evaluate(1.1)
    assert alert.measured == pytest.approx(2 / 6) and alert.measured_s == pytest.approx(0.6)


def test_a_step_shorter_than_the_interval_uses_the_reading_in_effect():
    ev = LiveAlertEvaluator([ALERT], interval_s=1.0)
    feed(ev, [0.0, 1.0, 2.0], [90, 20, 90])
    ev.add_step(1.6, 0.2, 0.0)  # [1.4, 1.6): inside the 20 % reading at t=1
    (alert,) = ev.evaluate(2.0)
    assert alert.measured == 1.0 and "step 1 (0.20 s, ended at t=1.6 s)" in alert.evidence


def test_live_step_shares_match_the_stop_evaluation():
    rng = np.random.default_rng(7)
    t = np.arange(200) * 0.05
    sm = rng.uniform(0, 100, size=200)
    ends = np.cumsum(rng.uniform(0.3, 0.9, size=12))
    ends = ends[ends < 9.9]
    durations = np.diff(np.r_[0.0, ends])
    steps = pd.DataFrame({"t_end_s": ends, "duration_s": durations, "wait_s": np.zeros(len(ends)),
                          "n_samples": np.ones(len(ends))})
    rule = "sm_util < 50 for >0% within step"  # fires whenever any time is below: share is then reported
    stop = [float(s) for _, _, s in step_time_shares(frame_experiment(t, sm, interval=0.05, steps=steps),
                                                     parse_rule(rule))]
    ev = LiveAlertEvaluator([rule], interval_s=0.05, min_repeat_s=0.0)
    feed(ev, t, sm)
    for end, duration in zip(ends, durations):
        ev.add_step(end, duration, 0.0)
    live = [a.measured for a in ev.evaluate(10.0)]
    assert live == pytest.approx([s for s in stop if s > 0])


# -- the sliding window, evidence and next step -----------------------------------------------
def input_bound_run(ev, seconds: float, wait_frac: float = 0.48, cpu: float = 30.0):
    """sm below 50 for the first 3.1 s of every 5 s (62 %), 1 s steps waiting ``wait_frac``."""
    t = np.arange(int(round(seconds * 10))) * 0.1
    sm = np.where((np.arange(len(t)) % 50) < 31, 20.0, 90.0)
    feed(ev, t, sm, cpu=cpu)
    for end in range(1, int(seconds) + 1):
        ev.add_step(float(end), 1.0, wait_frac)


def test_sliding_window_alert_with_evidence_and_next_step():
    ev = LiveAlertEvaluator(["sm_util < 50 for >30%"], interval_s=0.1, params={"num_workers": 0})
    input_bound_run(ev, 60)
    (alert,) = ev.evaluate(60.0)
    assert alert.span == "window" and alert.measured == pytest.approx(0.62) and alert.measured_s == pytest.approx(60)
    assert alert.evidence == "sm_util < 50 % for 62 % of the last minute; data wait 48 %"
    assert alert.finding == "input-bound"
    assert alert.next_step == diagnosis.input_advice(0, 30.0) and "(num_workers=0 now)" in alert.next_step
    assert alert.text == f"{alert.evidence} -> {alert.next_step}"


def test_window_needs_half_its_time_measured():
    ev = LiveAlertEvaluator(["sm_util < 50 for >30%"], interval_s=0.1)
    input_bound_run(ev, 25)
    assert ev.evaluate(25.0) == []  # 25 s of a 60 s window
    ev2 = LiveAlertEvaluator(["sm_util < 50 for >30%"], interval_s=0.1)
    input_bound_run(ev2, 35)
    (alert,) = ev2.evaluate(35.0)
    assert "(35 s measured)" in alert.evidence


def test_window_slides_past_an_old_slump():
    ev = LiveAlertEvaluator(["sm_util < 50 for >30%"], interval_s=1.0, window_s=30.0)
    feed(ev, np.arange(40.0), np.full(40, 10.0))
    assert ev.evaluate(40.0)
    feed(ev, np.arange(40.0, 120.0), np.full(80, 90.0))
    assert ev.evaluate(120.0) == []  # the last 30 s were all busy


@pytest.mark.parametrize("wait, cpu, steps, finding, advice", [
    (0.05, 30.0, True, "gpu-underused", diagnosis.UNDERUSED_IN_STEP_ADVICE),
    (None, 30.0, False, "gpu-underused", diagnosis.NO_STEPS_ADVICE),
    (None, 95.0, False, "input-bound", diagnosis.input_advice(None, 95.0)),
])
def test_next_step_follows_the_diagnosis(wait, cpu, steps, finding, advice):
    ev = LiveAlertEvaluator(["sm_util < 50 for >30%"], interval_s=0.1)
    if steps:
        input_bound_run(ev, 60, wait_frac=wait, cpu=cpu)
    else:
        feed(ev, np.arange(600) * 0.1, np.full(600, 20.0), cpu=cpu)
    (alert,) = ev.evaluate(60.0)
    assert (alert.finding, alert.next_step) == (finding, advice)


def test_other_metrics_get_evidence_without_advice():
    ev = LiveAlertEvaluator(["power_w > 150", "sm_util > 10 for >=50%"], interval_s=1.0)
    feed(ev, np.arange(60.0), np.full(60, 90.0))
    by_rule = {a.rule: a for a in ev.evaluate(60.0)}
    assert by_rule["power_w > 150"].evidence == "power_w averaged 200 W over the last minute (alert when > 150 W)"
    assert by_rule["power_w > 150"].next_step is None and by_rule["power_w > 150"].measured == 200.0
    assert by_rule["sm_util > 10 for >=50%"].next_step is None  # a high reading is not a held-back GPU


def test_per_tick_mean_across_gpus():
    ev = LiveAlertEvaluator(["sm_util < 50 for >=50%"], interval_s=1.0)
    t = np.arange(60.0)
    feed(ev, t, np.full(60, 90.0), device="gpu0")
    feed(ev, t, np.r_[np.full(30, 0.0), np.full(30, 90.0)], device="gpu1")  # mean 45 for the first 30 s
    (alert,) = ev.evaluate(60.0)
    assert alert.measured == pytest.approx(0.5)


# -- the rate limit ---------------------------------------------------------------------------
def test_a_window_rule_fires_at_most_once_per_min_repeat():
    ev = LiveAlertEvaluator(["sm_util < 50 for >30%"], interval_s=1.0)
    fired = []
    for now in range(1, 121):
        feed(ev, [now - 1.0], [10.0])
        fired += [a.t_s for a in ev.evaluate(float(now))]
    assert fired == [30.0, 60.0, 90.0, 120.0]  # first once half the window is measured, then every 30 s
    assert MIN_REPEAT_S == 30.0 and [a["t_s"] for a in ev.record()] == fired


def test_a_step_rule_counts_the_steps_it_held_back():
    ev = LiveAlertEvaluator([ALERT], interval_s=0.1)
    for k in range(61):
        feed(ev, np.arange(10) * 0.1 + k, np.full(10, 10.0))
        ev.add_step(k + 1.0, 1.0, 0.0)
        ev.evaluate(k + 1.0)  # the step ending now waits for the sample at its end (or 2 s)
    ev.evaluate(61.0 + 2.0)
    alerts = [Alert.from_dict(d) for d in ev.record()]
    assert [a.t_s for a in alerts] == [1.0, 31.0, 61.0]
    assert [a.repeats for a in alerts] == [0, 29, 29]
    assert "step 31 (1.00 s, ended at t=31.0 s), and in 29 step(s) since the last alert" in alerts[1].evidence


# -- bounded memory, plain data ----------------------------------------------------------------
def test_only_the_window_is_kept():
    ev = LiveAlertEvaluator(["sm_util < 50 for >30%"], interval_s=0.1, window_s=60.0)
    t = np.arange(20000) * 0.1  # 2000 s
    feed(ev, t, np.full(len(t), 90.0), cpu=10.0)
    for k in range(2000):
        ev.add_gap(k + 0.05, k + 0.06)
        ev.add_step(k + 1.0, 1.0, 0.0)
    ev.evaluate(2000.0)
    assert all(len(s) <= 605 for s in ev._series.values())
    assert len(ev._gaps) <= 61 and len(ev._steps) <= 61


def test_alerts_are_plain_data_and_old_experiments_load():
    ev = LiveAlertEvaluator(["sm_util < 50 for >30%"], interval_s=0.1)
    input_bound_run(ev, 60)
    (alert,) = ev.evaluate(60.0)
    assert pickle.loads(pickle.dumps(alert)) == alert
    record = json.loads(json.dumps(ev.record()))
    assert Alert.from_dict(record[0]) == alert
    meta = ExperimentMeta(id="x", name="x", alerts=record)
    assert ExperimentMeta.from_json(json.loads(json.dumps(meta.to_json()))).alerts == record
    old = {"id": "old", "name": "old", "schema_version": 1}  # written before meta.alerts existed
    assert ExperimentMeta.from_json(old).alerts == []


# -- views ------------------------------------------------------------------------------------
def test_header_and_summary_render_escaped_alerts():
    evil = Alert("sm_util < 50 for >30%", 61.0, "window", 0.62, 60.0, "<script>x</script>", "raise <b>", None)
    html = alert_header_html([evil.to_dict(), evil])
    assert "<script>" not in html and "&lt;script&gt;" in html and "raise &lt;b&gt;" in html
    assert html.count("gpuprof-alert") == 2 and alert_header_html([]) == ""
    assert alert_text(evil) == "alert at t=61.0 s [sm_util < 50 for >30%]: <script>x</script> -> raise <b>"
    exp = frame_experiment(np.arange(5.0), np.full(5, 90.0))
    exp.meta.alerts = [evil.to_dict()]
    assert alert_text(evil) in analysis_text(exp) and "alerts while it ran" in analysis_html(exp)


# -- the magic and the config -------------------------------------------------------------------
def test_magic_alert_is_repeatable_and_quotes_are_stripped():
    options = session_options(parse_line(f'--alert "{ALERT}" --alert \'sm_util < 50 for >30%\' -n a'))
    assert [r.text for r in options.alerts] == [ALERT, "sm_util < 50 for >30%"]
    assert session_options(parse_line("-n b")).alerts == []


@pytest.mark.parametrize("rule, message", [
    ("sm_util < lots for >30% within step", "expected a number"),
    ("accuracy < 0.9", "alerts watch a sampled metric"),
])
def test_magic_malformed_alert_is_a_usage_error(rule, message):
    with pytest.raises(UsageError, match=message):
        session_options(parse_line(f'--alert "{rule}"'))


def test_config_alerts_file_and_environment(tmp_path):
    (tmp_path / "gpuprof.toml").write_text(f'alerts = ["{ALERT}"]\nchecks = "{GATE}"\n')
    config = load_config(tmp_path, environ={})
    assert config.alerts == [ALERT] and config.checks == [GATE]
    env = load_config(tmp_path, environ={"GPUPROF_ALERTS": "sm_util < 50 for >30% ; power_w > 300"})
    assert env.alerts == ["sm_util < 50 for >30%", "power_w > 300"]
    (tmp_path / "gpuprof.toml").write_text("alerts = 3\n")
    with pytest.raises(ConfigError, match="alerts must be a list of rule strings"):
        load_config(tmp_path, environ={})


def test_readings_out_of_order_merge_into_their_tick():
    ev = LiveAlertEvaluator(["sm_util < 50 for >=50%"], interval_s=1.0)
    for k in range(60):  # gpu1's readings arrive a tick late, one of them (t=30.5) between ticks
        ev.add_row(float(k), "gpu0", {"sm_util": 90.0})
        if k:
            ev.add_row(float(k - 1), "gpu1", {"sm_util": 0.0 if k <= 30 else 90.0})
    ev.add_row(30.5, "gpu1", {"sm_util": float("nan")})  # a tick no GPU measured: NaN, no weight
    ev.add_row(59.0, "gpu1", {"sm_util": 90.0})
    t, values = ev._series["sm_util"].arrays()
    assert list(t[:3]) == [0.0, 1.0, 2.0] and 30.5 in t and np.isnan(values[t == 30.5]).all()
    (alert,) = ev.evaluate(60.0)
    assert alert.measured == pytest.approx(30 / 59.5)  # mean 45 for 30 s; t=30.5 (NaN) stands for no time


def test_the_final_evaluation_judges_the_last_step():
    ev = LiveAlertEvaluator([ALERT], interval_s=0.1)
    feed(ev, np.arange(10) * 0.1, np.full(10, 10.0))  # the last sample (0.9) is before the step's end
    ev.add_step(1.0, 1.0, 0.0)
    assert ev.evaluate(1.0) == []  # waits for a sample at its end
    (alert,) = ev.evaluate(1.0, final=True)
    assert alert.t_s == 1.0 and alert.measured == 1.0 and ev.record() == [alert.to_dict()]
