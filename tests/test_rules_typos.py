"""Rules a typo cannot pass (issue 36): an unknown metric is a usage error with close
suggestions only; a figure the run lacks says what kind of run records it, never "log it
yourself"; a unit where a bare number would be misread; finite thresholds; ASCII digits."""

from __future__ import annotations

import pytest

from gpuprof_jupyter.cli import main
from gpuprof_jupyter.core.analysis.compare import experiment_figures
from gpuprof_jupyter.core.analysis.rules import RuleError, evaluate_rule, parse_rule
from gpuprof_jupyter.core.analysis.summary import summary_of
from gpuprof_jupyter.core.store.directory import Store
from tests.simexp import requests_frame, sim_experiment, steps_frame


def _saved(store_dir, run):
    store = Store(store_dir)
    summary_of(run)
    store.create(run.meta)
    store.save_meta(run.meta)
    return run


@pytest.mark.parametrize("accept", [[], ["--accept-unjudged"]])
def test_a_mistyped_metric_is_a_usage_error_even_with_accept_unjudged(store_dir, capsys, accept):
    _saved(store_dir, sim_experiment("compute-bound", name="run"))
    assert main(["check", "run", "--store", str(store_dir), "--rule", "foo_bar < 3", *accept]) == 2
    err = capsys.readouterr().err
    assert "unknown metric 'foo_bar'" in err and "did you mean" not in err, err


def test_an_unknown_name_suggests_close_names_only():
    run = sim_experiment("compute-bound", user_metrics={"loss": 0.3})
    result = evaluate_rule(run, "accuracy >= 0.9")
    assert result.unknown and not result.passed and result.verdict == "CANNOT JUDGE"
    assert "sm_occupancy" not in result.detail + result.to_judge, result.detail
    assert "logged: loss" in result.detail
    assert "did you mean sm_util_mean?" in evaluate_rule(run, "sm_util_maen > 3").detail
    assert "did you mean loss?" in evaluate_rule(run, "losss < 1").detail
    assert not evaluate_rule(run, "loss < 1").unknown  # logged: known in this run


def test_every_figure_a_run_can_have_is_a_known_name():
    from gpuprof_jupyter.core.analysis.rules import known_names

    serving = sim_experiment("compute-bound", requests=requests_frame([0.01] * 40, tokens=[5.0] * 40),
                             steps=steps_frame(10, 2.0, 0.1))
    assert set(experiment_figures(serving)) - known_names() == set()


@pytest.mark.parametrize("rule, recorded_by", [
    ("latency_p99 < 50 ms", "a serving run"),
    ("requests_per_s > 200", "a serving run"),
    ("peak_memory < 70 GiB", "memory probe"),
])
def test_a_figure_the_run_lacks_says_what_run_records_it_never_to_log_it(rule, recorded_by):
    result = evaluate_rule(sim_experiment("compute-bound"), rule)  # no requests, no memory record
    assert result.verdict == "CANNOT JUDGE" and not result.unknown
    said = result.detail + " " + result.to_judge
    assert recorded_by in said and "gpuprof_jupyter.log(" not in said, said


@pytest.mark.parametrize("text, said", [
    ("memory_headroom > 10", "write its unit, % (e.g. 10 %)"),
    ("memory_headroom > 0.1", "write its unit, %"),
    ("latency_p99 < 50", "write its unit, ms or s"),
    ("peak_memory < 70", "write its unit, GiB or MiB"),
    ("data_wait_frac < 30", "a share from 0 to 1"),
    ("latency_p99 < 1e400 ms", "a threshold is a finite number"),
    ("sm_util > 1e400", "a threshold is a finite number"),
    ("peak_memory < 1e300 GiB", "a threshold is a finite number"),
    ("sm_util > \u0666\u0660", "digits are ASCII"),
    ("sm_util > 60 for \u0668\u0660%", "digits are ASCII"),
    ("sm_util > \uff16\uff10", "digits are ASCII"),
])
def test_thresholds_a_typo_would_misread_are_refused(text, said):
    with pytest.raises(RuleError, match=said.replace("(", r"\(").replace(")", r"\)")):
        parse_rule(text)


@pytest.mark.parametrize("accepted, value, refused", [
    ("memory_headroom_frac > 0.1", 0.1, "memory_headroom > 0.1"), ("latency_p99_s < 0.05", 0.05, "latency_p99 < 0.05"),
    ("data_wait_frac < 0.3", 0.3, "data_wait_frac < 30"), ("duration_s < 10", 10.0, "duration_s < 1e999"),
    ("sm_util > 60", 60.0, "sm_util > \u0666\u0660"),
])
def test_names_that_carry_their_unit_take_a_bare_number_their_short_names_do_not(accepted, value, refused):
    assert parse_rule(accepted).value == pytest.approx(value)
    with pytest.raises(RuleError):
        parse_rule(refused)
