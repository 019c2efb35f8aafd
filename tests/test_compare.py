"""Comparison of three experiments (the quickstart story), fairness warnings, widget, magic."""

from __future__ import annotations

import re
import time

import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.core.analysis.compare import compare_experiments, effect_text
from gpuprof_jupyter.notebook.compare_widget import ComparisonView
from gpuprof_jupyter.render.comparison import comparison_html, comparison_text
from tests.simexp import sim_experiment, steps_frame

BASE = {"batch_size": 32, "amp": False, "num_workers": 2, "prefetch_factor": 2}


def story(**overrides):
    baseline = sim_experiment("input-bound", seconds=12, name="baseline", params=BASE,
                              steps=steps_frame(60, 12, 0.55), user_metrics={"accuracy": 0.921, "loss": 0.31})
    b64 = sim_experiment("amp", seconds=9, name="b64-amp", params={**BASE, "batch_size": 64, "amp": True},
                         steps=steps_frame(30, 9, 0.2, batch=64), user_metrics={"accuracy": 0.923, "loss": 0.30})
    workers = sim_experiment(overrides.get("scenario", "amp"), gpus=overrides.get("gpus", 1), seconds=8.5,
                             name="workers-prefetch",
                             params={**BASE, "batch_size": 64, "amp": True, "num_workers": 8, "prefetch_factor": 4},
                             steps=steps_frame(30, 8.5, 0.02, batch=64), user_metrics={"accuracy": 0.924, "loss": 0.32},
                             provenance_tag=overrides.get("provenance_tag"))
    return [baseline, b64, workers]


def test_three_experiments_settings_and_deltas():
    c = compare_experiments(story(), prices={"kwh": 0.25, "gpu_hour": 2.0})
    assert c.names == ["baseline", "b64-amp", "workers-prefetch"] and c.baseline == 0
    assert c.setting("batch_size").changed == [False, True, True]
    assert c.setting("num_workers").changed == [False, False, True]
    assert c.changed_settings(1) == {"batch_size": (32, 64), "amp": (False, True)}
    duration = c.metric("duration_s")
    assert duration.rel[1] == pytest.approx(-0.25) and duration.verdicts[1:] == ["better", "better"]
    sm = c.metric("sm_util_mean")
    assert sm.verdicts[1] == "better" and sm.deltas[1] > 30
    assert c.metric("data_wait_frac").verdicts[2] == "better"
    assert c.metric("accuracy").verdicts[1:] == ["better", "better"]  # higher is better
    assert c.metric("loss").verdicts[1:] == ["better", "worse"]  # lower is better
    cost = c.metric("cost")
    assert cost.values[0] == pytest.approx(0.25 * c.metric("energy_kwh").values[0] + 2.0 * 12 / 3600)
    for key in ("sm_util_p95", "sm_low_frac", "mem_bw_util_mean", "power_mean_w", "gpu_mem_peak_bytes",
                "cpu_util_mean", "samples_per_s", "energy_per_sample_j"):
        c.metric(key)  # every figure the issue lists is there
    assert c.metric("mem_bw_util_mean").verdicts[1] is None  # neutral: no colour
    text = effect_text(c, 1)
    # the same work (1920 samples): the rate's gain first, then the totals, which may be compared
    assert text.startswith("+33 % throughput (95 % CI") and "-25 % time" in text
    assert "sm_util" in text and "accuracy 0.921->0.923" in text


def test_several_settings_at_once_warns():
    c = compare_experiments(story())
    kinds = [w.kind for w in c.warnings]
    assert kinds == ["several-settings", "several-settings"]
    assert "batch_size, amp" in c.warnings[0].message
    fair = compare_experiments(story()[1:])  # b64-amp -> workers: two loader settings changed
    assert [w.kind for w in fair.warnings] == ["several-settings"]
    one = sim_experiment("amp", name="one-change", params={**BASE, "batch_size": 64, "amp": True, "num_workers": 8},
                         steps=steps_frame(30, 8.5, 0.02, batch=64))
    assert compare_experiments([story()[1], one]).warnings == []


def test_provenance_hardware_and_other_processes_warn():
    warnings = {w.kind: w for w in compare_experiments(story(provenance_tag="nvml.utilization.gpu")).warnings}
    assert "provenance" in warnings and "nvml.utilization.gpu" in warnings["provenance"].message
    warnings = {w.kind: w for w in compare_experiments(story(gpus=2)).warnings}
    assert "hardware" in warnings and "2x" in warnings["hardware"].message
    warnings = {w.kind: w for w in compare_experiments(story(scenario="shared")).warnings}
    assert "other-processes" in warnings and "1 other process on gpu0" in warnings["other-processes"].message
    assert "424242" not in warnings["other-processes"].message  # no PID is ever shown


def test_static_html_has_tables_curves_warnings_and_diagnosis():
    c = compare_experiments(story(gpus=2))
    html = comparison_html(c)
    assert "gpuprof-settings" in html and "gpuprof-metrics" in html
    assert "class='changed'" in html and "color:#2e7d32" in html and "color:#c62828" in html
    assert "<svg" not in html and html.count("class='gpuprof-overlay'") == 1  # Bokeh, not a hand-made plotter
    assert '"gpuprof-overlay-sm_util"' in html and '"gpuprof-overlay-power_w"' in html
    assert "not a fair comparison" in html and "data-warning='hardware'" in html
    assert "Input-bound" in html  # the baseline's finding


@pytest.mark.process
def test_compare_store_in_run_order_widget_and_one_click_export(store_dir, tmp_path):
    for name, scenario, params in [("baseline", "input-bound", {"batch_size": 32}),
                                   ("b64-amp", "amp", {"batch_size": 64}),
                                   ("workers", "amp", {"batch_size": 64, "num_workers": 8})]:
        with gp.profile(name=name, source=f"sim:{scenario}", store=store_dir, interval=0.02, params=params):
            time.sleep(0.05)
    view = gp.compare(all=True, store=store_dir, pipeline_path=str(tmp_path / "pipeline.yaml"))
    assert isinstance(view, ComparisonView)
    assert [e.name for e in view.experiments] == ["baseline", "b64-amp", "workers"]
    bundle = view.static_bundle()
    assert {"text/plain", "text/html"} == set(bundle)
    assert "baseline" in bundle["text/plain"] and "gpuprof-overlay" in bundle["text/html"]
    widget = view.widget()
    buttons = [w for w in widget.children[1].children[1].children]
    assert [b.description for b in buttons] == ["export baseline", "export b64-amp", "export workers"]
    buttons[1].click()
    text = (tmp_path / "pipeline.yaml").read_text()
    assert "batch_size: 64" in text and "b64-amp" in text
    assert "exported" in widget.children[1].children[2].value
    picked = gp.compare("workers", "baseline", baseline="baseline", store=store_dir)
    assert picked.comparison.names == ["workers", "baseline"] and picked.comparison.baseline == 1


@pytest.mark.process
def test_magic_compare_line_command(store_dir):
    from IPython.core.interactiveshell import InteractiveShell

    from gpuprof_jupyter.notebook.magic import GpuProfileMagics

    for name in ("a", "b"):
        with gp.profile(name=name, source="sim:compute-bound", store=store_dir, interval=0.02):
            pass
    shell = InteractiveShell.instance()
    shell.register_magics(GpuProfileMagics)
    view = shell.run_line_magic("gpuprofile", f"compare --store {store_dir}")
    assert view.comparison.names == ["a", "b"]
    view = shell.run_line_magic("gpuprofile", f"compare b a --store {store_dir} --baseline a")
    assert view.comparison.names == ["b", "a"] and view.comparison.baseline == 1
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="no experiment named"):
        shell.run_line_magic("gpuprofile", f"compare nope --store {store_dir}")


@pytest.mark.process
def test_magic_check_and_fail_on_check(store_dir):
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    from gpuprof_jupyter.core.analysis.rules import RuleFailed
    from gpuprof_jupyter.notebook.magic import GpuProfileMagics

    shell = InteractiveShell.instance()
    shell.register_magics(GpuProfileMagics)
    magic = shell.find_cell_magic("gpuprofile").__self__
    line = (f'-n gated --source sim:compute-bound --store {store_dir} --interval 0.02 --no-live --quiet '
            f'--check "sm_util > 60 for >=80%" --check "accuracy >= 0.92" --fail-on-check')
    # 0.2 s: ten sample intervals, long enough to judge sm_util (analysis.provenance.MIN_WINDOWS)
    magic.gpuprofile(line, "import time, gpuprof_jupyter\ntime.sleep(0.2)\ngpuprof_jupyter.log(accuracy=0.95)\n")
    assert [c["passed"] for c in gp.load("gated", store=store_dir).meta.checks] == [True, True]
    with pytest.raises(RuleFailed, match="accuracy >= 0.92"):
        magic.gpuprofile(line.replace("-n gated", "-n gated2"), "import gpuprof_jupyter\ngpuprof_jupyter.log(accuracy=0.5)\n")
    assert gp.load("gated2", store=store_dir).meta.checks[1]["passed"] is False  # saved before raising
    with pytest.raises(UsageError, match="expected a number"):
        magic.gpuprofile(f'--source sim --store {store_dir} --check "sm_util > x"', "pass")


def test_only_the_users_change_counts_torch_defaults_and_a_captured_twin_do_not():
    """Issue 20: only num_workers changed; torch turned prefetch_factor None into 2 and the
    captured train_config holds the same change under its own name: one change, no warning."""
    base = sim_experiment("amp", name="w0", params={"batch_size": 8, "num_workers": 0, "prefetch_factor": None})
    base.meta.captured = {"train_config.dataloader_num_workers": 0, "train_config.lr": 0.1}
    workers = sim_experiment("amp", name="w2", params={"batch_size": 8, "num_workers": 2, "prefetch_factor": 2})
    workers.meta.captured = {"train_config.dataloader_num_workers": 2, "train_config.lr": 0.1}
    workers.meta.context["torch_filled"] = ["prefetch_factor"]
    assert compare_experiments([base, workers]).warnings == []
    workers.meta.captured["train_config.lr"] = 0.2  # a second change of the user's: warned
    warning, = compare_experiments([base, workers]).warnings
    assert "changes 2 settings" in warning.message and "prefetch_factor" not in warning.message


def test_runs_of_different_lengths_compare_rates_never_totals():
    """A whole-cell baseline of 495 steps in 21.2 s against a trial of 25 steps in 0.5 s: the
    duration is shown as a total, never "-97.7 % better"; the gain is the rate's."""
    long = sim_experiment("input-bound", seconds=21.2, name="long", params=BASE, steps=steps_frame(495, 21.2, 0.3))
    short = sim_experiment("input-bound", seconds=0.5, name="short", params=BASE, steps=steps_frame(25, 0.5, 0.3))
    c = compare_experiments([long, short])
    duration, energy = c.metric("duration_s"), c.metric("energy_kwh")
    assert duration.label == "duration (total)" and energy.label == "energy (kWh) (total)"
    assert duration.verdicts[1] is None and energy.verdicts[1] is None
    assert duration.values == [pytest.approx(21.2), pytest.approx(0.5)]  # shown, as totals
    warning = next(w for w in c.warnings if w.kind == "lengths")
    assert "long: 15840 samples, short: 800 samples" in warning.message
    effect = effect_text(c, 1)
    assert "time" not in effect and "energy," not in effect
    assert effect.startswith("+") and "% throughput (95 % CI" in effect  # 800/0.5 s against 15840/21.2 s
    text = comparison_text(c)
    assert "duration (total)" in text and "better" not in text.split("duration (total)")[1].splitlines()[0]
    # each figure carries "(simulated)" (core/figure.py), so the table may be one run a line
    assert (re.search(r"gain against the baseline \(95 % CI\) +\| n/a +\| \+", text)
            or re.search(r"gain against the baseline \(95 % CI\)\n +(long|#1): n/a\n +(short|#2): \+", text)), text
