"""Provenance in conclusions: findings, rules and comparisons claim only what their metric
measured, nothing is concluded from a run too short for a metric's native window, per-step
results over short steps are marked unreliable, and different APIs warn loudly."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from ruamel.yaml import YAML

from gpuprof_jupyter.core.analysis.compare import compare_experiments, effect_text
from gpuprof_jupyter.core.analysis.diagnosis import diagnose
from gpuprof_jupyter.core.analysis.provenance import MIN_WINDOWS, metric_windows, recorded_provenance_warnings
from gpuprof_jupyter.core.analysis.rules import RuleResult, evaluate_rule
from gpuprof_jupyter.core.analysis.summary import summarize, summary_of
from gpuprof_jupyter.cli import main
from gpuprof_jupyter.core.metrics import NATIVE_WINDOWS, PROVENANCE, native_window
from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.render.comparison import comparison_html, comparison_text
from gpuprof_jupyter.render.findings_html import checks_html, checks_text, findings_html
from gpuprof_jupyter.export.pipeline import export_pipeline
from tests.simexp import frame_experiment, sim_experiment

NVML, GPM = "nvml.utilization.gpu", "gpm.sm_util"
NOT_MEASURABLE = "how many SMs were busy is not measurable on this GPU"


def ids(experiment) -> list[str]:
    return [f.id for f in diagnose(experiment)]


def with_tag(experiment, tag: str):
    for key, tags in experiment.meta.provenance.items():
        if key != "host":
            tags["sm_util"] = tag
    return experiment


# -- the contract ---------------------------------------------------------------------------
def test_every_provenance_tag_has_a_native_window():
    assert set(NATIVE_WINDOWS) == set(PROVENANCE)
    assert native_window(NVML).resolve(0.1) == 1.0  # the driver's window, whatever the interval
    assert native_window(GPM).resolve(0.25) == 0.25  # GPM: the sample interval
    assert native_window("nvml.power_usage").resolve(0.1) == 1.0
    assert native_window("nvml.field.power_instant").resolve(0.1) < 1.0
    assert native_window("some.new.source").resolve(0.5) == 0.5


def test_every_experiment_carries_its_windows_old_ones_too():
    exp = sim_experiment("compute-bound", seconds=3, interval=0.2, provenance_tag=NVML)
    windows = summarize(exp)["metric_windows"]
    assert windows["sm_util"]["window_s"] == 1.0 and windows["sm_util"]["provenance"] == [NVML]
    assert windows["power_w"]["window_s"] == 0.2  # simulated: the sample interval
    assert windows["cpu_util"]["window_s"] == 0.2
    old = sim_experiment("compute-bound", seconds=3, interval=0.2)
    old.meta.summary = {k: v for k, v in summarize(old).items() if k != "metric_windows"}  # saved before windows
    assert summary_of(old)["metric_windows"] == metric_windows(old.meta)
    assert summary_of(old)["metric_windows"]["sm_util"]["window_s"] == 0.2


# -- findings: what the metric supports ------------------------------------------------------
def test_kernel_active_time_is_not_called_compute_bound():
    nvml = diagnose(sim_experiment("fp32", seconds=5, provenance_tag=NVML))
    assert not [f for f in nvml if f.id.startswith("compute-bound")]
    busy = next(f for f in nvml if f.id == "gpu-busy-fp32")
    assert "a kernel was running 9" in busy.evidence and NOT_MEASURABLE in busy.evidence
    assert "SM" not in busy.title and busy.numbers["sm_is_kernel_active"] is True
    assert "GPM" in busy.next_step
    html = findings_html(nvml)
    assert "how many SMs were busy is not measurable" in html

    gpm = diagnose(sim_experiment("fp32", seconds=5, provenance_tag=GPM))
    finding = next(f for f in gpm if f.id == "compute-bound-fp32")
    assert "sm_util averaged 9" in finding.evidence and "not measurable" not in finding.evidence
    assert not [f for f in gpm if f.id.startswith("gpu-busy")]


def test_input_bound_on_kernel_active_time_names_what_it_measured():
    from tests.simexp import steps_frame

    exp = sim_experiment("input-bound", seconds=10, steps=steps_frame(50, 10, wait_frac=0.58), provenance_tag=NVML)
    finding = next(f for f in diagnose(exp) if f.id == "input-bound")
    assert finding.evidence.startswith("kernel-active time (sm_util from NVML utilization.gpu) < 50 %")


@pytest.mark.parametrize("tag, short_s, long_s", [
    (NVML, 2.9, 3.2),  # NVML utilization: 1 s window -> 3 s needed
    ("simulated", 0.27, 0.5),  # the sample interval (0.1 s) -> 0.3 s needed: the 0.27 s run of the issue
])
def test_no_finding_from_a_run_too_short_for_the_window(tag, short_s, long_s):
    short = sim_experiment("fp32", seconds=short_s, provenance_tag=tag if tag != "simulated" else None)
    found = diagnose(short)
    assert not [f for f in found if f.id.startswith(("compute-bound", "gpu-busy", "lagging", "idle"))]
    too_short = next(f for f in found if f.id == "too-short")
    assert too_short.numbers["metric"] == "sm_util" and too_short.severity == "info"
    assert "too short for this metric" in too_short.evidence and f"fewer than {MIN_WINDOWS}" in too_short.evidence
    assert tag in too_short.evidence
    long = ids(sim_experiment("fp32", seconds=long_s, provenance_tag=tag if tag != "simulated" else None))
    assert "too-short" not in long and ({"gpu-busy-fp32", "compute-bound-fp32"} & set(long))


def test_memory_finding_still_drawn_from_a_short_run():
    """Memory readings are instant: a short run is long enough for them."""
    found = ids(sim_experiment("small-batch", seconds=0.2, params={"batch_size": 32}))
    assert "memory-underused" in found and "too-short" in found


# -- rules: what they measured ----------------------------------------------------------------
def test_rule_on_kernel_active_time_says_what_it_measured():
    nvml = evaluate_rule(sim_experiment("compute-bound", seconds=5, provenance_tag=NVML), "sm_util > 60 for >=80%")
    assert nvml.passed and "kernel-active time" in nvml.detail and NOT_MEASURABLE in nvml.detail
    assert nvml.provenance == [NVML]
    value = evaluate_rule(sim_experiment("compute-bound", seconds=5, provenance_tag=NVML), "sm_util_mean > 60")
    assert value.passed and NOT_MEASURABLE in value.detail
    gpm = evaluate_rule(sim_experiment("compute-bound", seconds=5, provenance_tag=GPM), "sm_util > 60 for >=80%")
    assert gpm.passed and "not measurable" not in gpm.detail and gpm.provenance == [GPM]
    assert RuleResult.from_dict(nvml.to_dict()) == nvml  # stored and read back with its provenance


@pytest.mark.parametrize("samples, judged", [(2, False), (3, True), (5, True)])  # window 0.1 s: 0.3 s needed
@pytest.mark.parametrize("rule", ["sm_util > 60 for >=80%", "sm_util_mean > 60", "sm_low_frac <= 20%"])
def test_rule_on_a_run_too_short_is_not_judged(samples, judged, rule):
    t = np.arange(samples) * 0.1
    result = evaluate_rule(frame_experiment(t, np.full(samples, 90.0), interval=0.1), rule)
    assert result.passed is judged and result.judged is judged
    assert result.verdict == ("PASS" if judged else "CANNOT JUDGE")
    if not judged:
        assert result.measured is None and "too short for this metric" in result.detail
        assert "profile a run of at least 0.3 s" in result.to_judge


def test_figure_rules_without_a_sampled_metric_are_judged_on_any_run():
    short = frame_experiment(np.arange(2) * 0.1, np.full(2, 90.0), interval=0.1, user_metrics={"accuracy": 0.93})
    assert evaluate_rule(short, "duration_s >= 0").passed
    assert evaluate_rule(short, "accuracy >= 0.92").passed


@pytest.mark.parametrize("step_s, judged", [(0.5, False), (0.9, False), (1.0, True), (2.0, True)])
def test_per_step_cannot_be_judged_when_steps_are_shorter_than_the_window(step_s, judged):
    t = np.arange(20.0)  # GPM at 1 s: the window is 1 s
    count = int(10 / step_s)
    steps = pd.DataFrame({"t_end_s": step_s * np.arange(1, count + 1), "duration_s": np.full(count, step_s),
                          "wait_s": np.zeros(count), "n_samples": np.full(count, 8.0)})
    result = evaluate_rule(frame_experiment(t, np.full(20, 90.0), steps=steps), "sm_util > 60 for >=80% per step")
    assert result.passed is judged and result.judged is judged
    assert ("shorter than sm_util's native window (1 s" in result.detail) is (not judged)
    text, html = checks_text([result])[0], checks_html([result])
    assert text.startswith("PASS" if judged else "CANNOT JUDGE") and ("PASS" in text) is judged
    assert ("cannot-judge" in html) is (not judged) and (">PASS<" in html) is judged


def test_a_pass_saved_over_short_steps_reads_back_as_cannot_judge():
    """Results saved when such a pass was only marked unreliable never show PASS again."""
    old = {"rule": "sm_util > 60 for >=80% per step", "passed": True, "measured": 1.0, "detail": "UNRELIABLE per step",
           "kind": "step-share", "reliable": False}
    result = RuleResult.from_dict(old)
    assert (result.verdict, result.passed) == ("CANNOT JUDGE", False)
    assert RuleResult.from_dict({**old, "reliable": True}).verdict == "PASS"


# -- comparisons, exports and gates across APIs -----------------------------------------------
def pair(tag_b: str):
    base = sim_experiment("input-bound", seconds=6, name="a100", params={"batch_size": 32}, provenance_tag=NVML)
    other = sim_experiment("compute-bound", seconds=4, name="h100", params={"batch_size": 64}, provenance_tag=tag_b,
                           checks=[{"rule": "sm_util > 60 for >=80%", "passed": True, "measured": 0.9, "detail": "ok",
                                    "kind": "time-share"}])
    return base, other


def test_mixed_provenance_comparison_warns_loudly_and_gives_no_verdict():
    c = compare_experiments(pair(GPM))
    warning = next(w for w in c.warnings if w.kind == "provenance")
    assert warning.message.startswith("NOT THE SAME QUANTITY: sm_util")
    assert NVML in warning.message and GPM in warning.message and "kernel-active time" in warning.message
    sm = c.metric("sm_util_mean")
    assert sm.verdicts[1] is None and not sm.comparable(1) and sm.comparable(0)
    assert c.metric("sm_low_frac").verdicts[1] is None
    assert c.metric("duration_s").verdicts[1] == "better" and c.metric("duration_s").comparable(1)
    assert "(different APIs: not comparable)" in effect_text(c, 1)
    assert "WARNING (provenance): NOT THE SAME QUANTITY" in comparison_text(c)
    assert "[different APIs: not comparable]" in comparison_text(c)
    html = comparison_html(c, plots=False)
    assert "class='incomparable'" in html and "data-warning='provenance'" in html


def test_same_provenance_comparison_stays_quiet():
    c = compare_experiments(pair(NVML))
    assert not [w for w in c.warnings if w.kind == "provenance"]
    assert c.metric("sm_util_mean").verdicts[1] == "better" and c.metric("sm_util_mean").comparable(1)
    assert "not comparable" not in effect_text(c, 1)


def test_export_warns_and_records_what_the_thresholds_measured(tmp_path):
    base, h100 = pair(GPM)
    path = tmp_path / "pipeline.yaml"
    result = export_pipeline(h100, path, "train", baseline=base)
    assert any(w.startswith("NOT THE SAME QUANTITY: sm_util") for w in result.warnings)
    text = path.read_text()
    assert "(different APIs: not comparable)" in text
    step = YAML(typ="safe").load(text)["workflow"]["steps"][0]
    assert step["profiling"]["provenance"] == {"sm_util": GPM}
    # a later run measured by NVML and exported to the same file: the thresholds were set on GPM
    later = sim_experiment("compute-bound", seconds=4, name="a100-again", provenance_tag=NVML, checks=h100.meta.checks)
    again = export_pipeline(later, path, "train", baseline=later)
    assert any("the thresholds in" in w and "the gate compares different quantities" in w for w in again.warnings)
    assert YAML(typ="safe").load(path.read_text())["workflow"]["steps"][0]["profiling"]["provenance"] == {"sm_util": NVML}


def test_gate_on_other_apis_warns(tmp_path, store_dir, capsys):
    assert recorded_provenance_warnings(pair(GPM)[1].meta, {"sm_util": GPM}, "p.yaml:train") == []
    warnings = recorded_provenance_warnings(pair(GPM)[0].meta, {"sm_util": GPM}, "p.yaml:train")
    assert len(warnings) == 1 and "p.yaml:train" in warnings[0] and NVML in warnings[0]

    base, h100 = pair(GPM)
    path = tmp_path / "pipeline.yaml"
    export_pipeline(h100, path, "train", baseline=base)
    store = Store(store_dir)
    for exp in (base, h100):  # metadata only (no samples: the file's sm_util threshold cannot be judged, exit 3)
        store.directory(exp.meta).mkdir(parents=True)
        store.save_meta(exp.meta)
    assert main(["check", "a100", "--store", str(store_dir), "--pipeline", str(path), "--rule", "duration_s >= 0"]) == 3
    err = capsys.readouterr().err
    assert "WARNING: NOT THE SAME QUANTITY" in err and "gate compares different quantities" in err
    assert main(["check", "h100", "--store", str(store_dir), "--pipeline", str(path), "--rule", "duration_s >= 0"]) == 3
    assert "NOT THE SAME QUANTITY" not in capsys.readouterr().err


@pytest.mark.parametrize("step_s, reliable", [(0.5, False), (1.0, True)])
def test_summary_marks_per_step_figures_of_short_steps(step_s, reliable):
    from gpuprof_jupyter.render.summary_html import render_summary_html, render_summary_text

    count = int(10 / step_s)
    steps = pd.DataFrame({"t_end_s": step_s * np.arange(1, count + 1), "duration_s": np.full(count, step_s),
                          "wait_s": np.zeros(count), "n_samples": np.full(count, 8.0)})
    exp = frame_experiment(np.arange(20.0), np.full(20, 90.0), steps=steps)  # GPM at 1 s: a 1 s window
    assert summary_of(exp)["metric_windows"]["sm_util"]["per_step_reliable"] is reliable
    assert ("per-step sm_util: CANNOT JUDGE" in render_summary_text(exp)) is (not reliable)  # the gate's words
    assert ("CANNOT JUDGE: steps" in render_summary_html(exp)) is (not reliable)
    assert "native window 1 s" in render_summary_text(exp)
    no_steps = frame_experiment(np.arange(20.0), np.full(20, 90.0))
    assert summary_of(no_steps)["metric_windows"]["sm_util"]["per_step_reliable"] is None


def test_same_quantity_measured_differently_warns_but_keeps_verdicts():
    """Instant against 1 s average power is one quantity measured two ways: a warning, verdicts kept."""
    base, other = pair(NVML)
    for key, tags in other.meta.provenance.items():
        if key != "host":
            tags["power_w"] = "nvml.power_usage"
    for key, tags in base.meta.provenance.items():
        if key != "host":
            tags["power_w"] = "nvml.field.power_instant"
    c = compare_experiments([base, other])
    warning = next(w for w in c.warnings if w.kind == "provenance")
    assert warning.message.startswith("MEASURED DIFFERENTLY: power_w") and "nvml.power_usage" in warning.message
    assert c.metric("power_mean_w").comparable(1) and c.metric("sm_util_mean").comparable(1)
    gate = recorded_provenance_warnings(other.meta, {"power_w": "nvml.field.power_instant"}, "p.yaml:train")
    assert gate[0].startswith("MEASURED DIFFERENTLY") and gate[0].endswith("different measurements")


def test_what_it_measured_names_the_gpus_it_applies_to():
    from gpuprof_jupyter.core.analysis.provenance import measured_as

    two = sim_experiment("compute-bound", gpus=2, seconds=1, provenance_tag=NVML)
    assert measured_as(two.meta, "sm_util").endswith("not measurable on these GPUs")
    two.meta.provenance["gpu1"]["sm_util"] = GPM
    assert measured_as(two.meta, "sm_util").endswith("not measurable on the GPUs that gave it")
    assert measured_as(sim_experiment("compute-bound", seconds=1, provenance_tag=GPM).meta, "sm_util") is None


def test_the_summary_and_the_per_step_gate_agree_on_steps_shorter_than_the_interval():
    """1 s steps under 2 s samples: longer than a 1 s native window, yet each step repeats its
    neighbours' readings, so the summary says what the gate says: it cannot judge them."""
    from gpuprof_jupyter.core.analysis.rules import evaluate_rule, parse_rule
    from gpuprof_jupyter.render.summary_html import render_summary_text

    steps = pd.DataFrame({"t_end_s": np.arange(1.0, 21.0), "duration_s": np.ones(20), "wait_s": np.zeros(20),
                          "n_samples": np.full(20, 8.0)})
    exp = frame_experiment(np.arange(0.0, 20.0, 2.0), np.full(10, 90.0), interval=2.0, steps=steps)
    for tags in exp.meta.provenance.values():  # NVML's kernel-active time: a window of at most 1 s
        if "sm_util" in tags:
            tags["sm_util"] = "nvml.utilization.gpu"
    assert summary_of(exp)["metric_windows"]["sm_util"]["per_step_reliable"] is False
    assert "per-step sm_util: CANNOT JUDGE" in render_summary_text(exp)
    assert evaluate_rule(exp, parse_rule("sm_util > 60 for >=80% per step")).verdict == "CANNOT JUDGE"
