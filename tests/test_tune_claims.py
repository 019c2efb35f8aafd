"""--tune claims only what like-for-like runs show: every trial runs the same way, one
estimator gives a gain the same everywhere (the tune table, the HTML report, compare() and
pipeline.yaml), and an interval across 0 is "inconclusive", never a gain."""

from __future__ import annotations

import html
import re
import time

import pytest
from ruamel.yaml import YAML

import gpuprof_jupyter as gp
from gpuprof_jupyter.core.analysis.compare import compare_experiments, effect_text
from gpuprof_jupyter.render.report import render_report

CELL_STEPS = 500


def _cell(cfg: dict, pattern=None):
    """A training loop of CELL_STEPS steps that logs its accuracy at the end; a bigger batch does
    more samples in the same step time."""
    def train():
        for i in range(cfg.get("steps", CELL_STEPS)):
            time.sleep(pattern(i) if pattern else 0.0005)
            gp.step(cfg["batch_size"])
        gp.log(accuracy=0.5 + cfg["batch_size"] / 1000)
    return train


@pytest.fixture(scope="module")
def opted_in(tmp_path_factory):
    """``--tune cfg.batch_size=32`` on a cell of 500 steps."""
    store = tmp_path_factory.mktemp("store")
    cfg = {"batch_size": 8}
    plan: list[str] = []
    report = gp.tune(_cell(cfg), name="bs", tune=["cfg.batch_size=32"], namespace={"cfg": cfg}, source="sim",
                     store=store, budget="3min", on_plan=plan.append)
    return report, plan, store, cfg


@pytest.mark.process
def test_an_opted_in_search_runs_every_trial_as_the_whole_cell(opted_in):
    report, plan, _, cfg = opted_in
    assert cfg == {"batch_size": 8}  # put back
    # said before the first trial: what runs, how, and how the time is bounded; then the figures
    assert plan[0].startswith("plan: the baseline twice, then ") and "the opted-in cfg.batch_size 32" in plan[0]
    assert "each the whole cell (an opted-in field" in plan[0] and plan[1].startswith("estimated time: at most")
    assert any(line.startswith("estimated time: ") and re.search(r" m?s = ", line) for line in plan[2:])
    assert any(line.startswith("trying cfg.batch_size: at most 1 more trial(s)") for line in plan)
    trials = report.result.trials
    assert [t.steps_run for t in trials] == [CELL_STEPS] * 3  # the baseline, its repeat, the trial: like for like
    assert trials[-1].user_metrics == {"accuracy": pytest.approx(0.532)}  # what the whole cell logs is there
    assert report.result.stopped == "", report.result.stopped  # nothing cut the search short, the budget included
    # the same 500 steps, but 4x the samples: the totals are shown as totals, the gain is the rate's
    comparison = compare_experiments([trials[0].experiment, trials[-1].experiment])
    assert comparison.metric("duration_s").label == "duration (total)"
    assert comparison.metric("duration_s").verdicts[1] is None and comparison.gains[1].conclusive


@pytest.mark.process
def test_the_tune_table_report_comparison_and_pipeline_give_the_same_gain(opted_in, tmp_path):
    report, _, store, _ = opted_in
    winner, base = report.winner, report.result.baseline[0]
    assert winner is not None and winner.changed == {"cfg.batch_size": (8, 32)}
    said = report.winner_gain().text()
    assert said.startswith("+") and "% throughput (95 % CI" in said
    row = next(r for r in report.rows() if r[0] == winner.name)
    assert row[4] == f"{said} vs {base.name}"  # the table's gain column
    assert said in report.next_line()
    comparison = compare_experiments([base.experiment, winner.experiment])
    assert comparison.gains[1].text() == said
    assert said in effect_text(comparison, 1)
    page = render_report([base.experiment, winner.experiment])
    assert html.escape(said) in page
    path = tmp_path / "pipeline.yaml"
    report.export_pipeline(path)
    text = path.read_text()
    assert f"cfg.batch_size 8 -> 32: {said} against {base.name}" in text  # the setting's evidence
    assert f"{winner.name} against {base.name}: {said}" in text  # the step's effect
    assert YAML(typ="safe").load(text)["workflow"]["steps"][0]["params"]["cfg.batch_size"] == 32


@pytest.mark.process
def test_an_interval_across_zero_is_inconclusive_never_a_gain(tmp_path):
    """The setting changes nothing, and the steps alternate slow and fast blocks: the interval is
    wide around 0, so the trial is "inconclusive" with the reason and the baseline stays.

    The slow steps are 50x the fast ones: on a loaded machine a 1 ms sleep can take 10 ms for a
    whole run (CI saw one trial's 1 ms steps as slow as its 12 ms ones, a "conclusive" loss); the
    blocks stay far apart for any such delay, so the interval stays wide as the test means it."""
    cfg = {"batch_size": 8, "flag": False, "steps": 45}
    blocks = lambda i: 0.05 if ((i - 5) // 8) % 2 else 0.001  # noqa: E731 - 5 warm-up steps, blocks of 8
    report = gp.tune(_cell(cfg, blocks), name="noisy", tune=["cfg.flag=true"], namespace={"cfg": cfg},
                     source="sim", store=tmp_path / "store", trial_steps=10, budget="2min", on_plan=lambda _: None)
    trial = report.result.trials[-1]
    assert trial.changed == {"cfg.flag": (False, True)}
    assert not trial.gain.conclusive and "includes 0" in trial.gain.reason
    assert trial.verdict.startswith("throughput inconclusive: its 95 % interval")
    assert report.winner is not None and not report.winner.changed
    row = next(r for r in report.rows() if r[0] == trial.name)
    assert row[4].startswith("inconclusive") and "inconclusive" in row[-1]
    assert report.next_line().startswith("The baseline stays")


def test_trial_steps_below_what_an_interval_needs_is_a_clear_error():
    with pytest.raises(ValueError, match=r"--trial-steps must be an integer >= 10"):
        gp.tune(_cell({"batch_size": 8}), trial_steps=8, source="sim")


@pytest.mark.process
def test_the_report_says_the_threshold_the_search_used(opted_in):
    report = opted_in[0]
    notes = "\n".join(report.notes())
    result = report.result
    assert f"above {100 * result.threshold:.1f} %" in notes
    if result.threshold > result.noise:
        assert "the floor of 2.0 %, as the measured noise was lower" in notes


@pytest.mark.process
def test_the_plan_estimates_its_time_from_an_earlier_run_of_the_cell(tmp_path, capsys):
    """Profile the cell once, then --tune it: before the first trial the plan gives seconds."""
    from IPython.core.interactiveshell import InteractiveShell

    from gpuprof_jupyter.notebook import magic

    shell = InteractiveShell.instance()
    magic.load_ipython_extension(shell)
    try:
        shell.run_cell("import time\nimport gpuprof_jupyter as gp\ncfg = {'batch_size': 8}")
        body = "for i in range(40):\n    time.sleep(0.002)\n    gp.step(cfg['batch_size'])\n"
        store = tmp_path / "store"
        assert shell.run_cell(f"%%gpuprofile --source sim --store {store} -n first --no-live --quiet\n{body}").success
        capsys.readouterr()
        result = shell.run_cell(f"%%gpuprofile --tune --source sim --store {store} -n again --trial-steps 10 "
                                f"--budget 60s\n{body}")
        assert result.success, result.error_in_exec
    finally:
        magic.unload_ipython_extension(shell)
    out = capsys.readouterr().out.splitlines()
    first_trial = next(i for i, line in enumerate(out) if "trial 1 [baseline] running" in line)
    estimate = next(i for i, line in enumerate(out) if re.search(r"estimated time: at most \d+ x about [^(]+ "
                                                                 r"\(from 'first', an earlier run of this cell", line))
    assert estimate < first_trial


@pytest.mark.process
def test_a_second_search_of_a_function_estimates_from_the_first(tmp_path):
    cfg = {"batch_size": 8, "steps": 30}
    lines: list[str] = []
    for _ in range(2):
        lines.clear()
        gp.tune(_cell(cfg), name="again", source="sim", store=tmp_path / "store", trial_steps=10, budget="1min",
                on_plan=lines.append)
    assert re.search(r"^estimated time: at most \d+ x about [^(]+ \(from 'again-t\d', an earlier run of this cell",
                     lines[1]), lines[1]
