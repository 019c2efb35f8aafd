"""A figure is a typed value (issue 36 part 1): core/figure.py, core/format.fmt_figure, and the scan
that keeps the renderers from formatting a bare number."""

from __future__ import annotations

import ast
import math
import re
import sys
from pathlib import Path

import pytest

from gpuprof_jupyter.core.figure import Figure, estimated, measured, simulated, unknown
from gpuprof_jupyter.core.format import MISSING, fmt_figure, fmt_figures

PACKAGE = Path(__file__).resolve().parent.parent / "gpuprof_jupyter"

# What a person reads: render/ (gpuprof list's listing, the live header and the tune table among it), the
# views that display it (the CLI, the live dashboard, --tune's view); the sentences the core writes for every view (findings' evidence, rule verdicts' detail) and --tune's
# plan and estimates; the session record's notes, its idle notice and %gpuprofile session's replies.
RENDERERS = sorted((PACKAGE / "render").glob("*.py")) + [
    PACKAGE / "cli.py", PACKAGE / "notebook/live/dashboard.py",
    PACKAGE / "notebook/tune_view.py", PACKAGE / "core/analysis/diagnosis.py",
    *(PACKAGE / f"core/analysis/{family}.py" for family in (
        "finding_text", "input_findings", "device_findings", "memory_findings", "rank_findings", "trace_findings")),
    PACKAGE / "core/analysis/serving_findings.py", PACKAGE / "core/analysis/rules.py",
    PACKAGE / "core/analysis/job_findings.py", PACKAGE / "core/analysis/clock.py",
    PACKAGE / "core/analysis/rule_grammar.py", PACKAGE / "core/analysis/rule_results.py",
    PACKAGE / "runtime/tune/search.py", PACKAGE / "notebook/session_view.py", PACKAGE / "notebook/session_cells.py",
    PACKAGE / "sampler_process/session_record.py", PACKAGE / "sampler_process/long_cells.py"]

# core/format.py's formatters of a bare number: a renderer builds a Figure and calls fmt_figure instead.
BARE_FORMATTERS = {"fmt_number", "fmt_pct", "fmt_frac", "fmt_change", "fmt_points", "fmt_gib", "fmt_memory",
                   "fmt_bytes", "fmt_watts", "fmt_energy", "fmt_seconds", "fmt_rate", "fmt_time", "fmt_cost",
                   "fmt_metric_value", "fmt_value", "fmt_unit"}

# The allowed exceptions, each a number that is not a figure of a run: (file, the formatted
# expression, or the formatter's call, as ast.unparse writes it) -> why. A setting or threshold
# goes through core/format.fmt_unit (a number in a fixed unit, as given).
_THRESHOLD = "a threshold of the check (a module constant), written with its unit"
_AS_WRITTEN = "the rule's number as the user wrote it, in its unit: not a figure of the run"
_BUDGET = "the --budget setting, written with its unit (s)"
_CADENCE = "the session record's cadence (a setting), written with its unit (s)"
ALLOWED = {
    ("core/analysis/memory_findings.py", "fmt_frac(HEADROOM_MARGIN)"): _THRESHOLD,
    ("core/analysis/device_findings.py", "fmt_unit(IDLE_SM, '%')"): _THRESHOLD,
    ("core/analysis/rules.py", "fmt_metric_value(rule.value, rule.metric)"): _AS_WRITTEN,
    ("core/analysis/rules.py", "fmt_unit(float(100 * rule.share), '%')"): _AS_WRITTEN,
    ("core/analysis/rules.py", "rule.value"): _AS_WRITTEN + " (a rule suggested in its place)",
    ("core/analysis/rules.py", "fmt_unit(MIN_WINDOWS * window, 's')"): "how long a run must be to be judged (the metric's windows), in s",
    ("core/analysis/rules.py", "fmt_unit(interval, 's')"): "the run's sampling interval setting, written with its unit (s)",
    ("core/analysis/rules.py", "fmt_unit(longest, 's')"): "how long a step must last to be judged (the metric's window), in s",
    ("runtime/tune/search.py", "fmt_unit(self.spec.budget_s, 's', 0)"): _BUDGET,
    ("runtime/tune/search.py", "fmt_unit(spec.budget_s, 's', 0)"): _BUDGET,
    ("render/tune_table.py", "fmt_unit(r.spec.budget_s, 's')"): _BUDGET,
    ("runtime/tune/search.py", "fmt_unit(self.spec.budget_s * BASELINE_SHARE, 's', 0)"): "the baseline's share of the --budget setting (s)",
    ("render/memory_html.py", "max(1.0, BAR_PX * value / scale)"): "a bar segment's width in CSS pixels",
    ("render/static_png.py", "value"): "a PNG axis's tick label (the axis title names the unit)",
    ("render/summary_html.py", "fmt_unit(native_window(sm_tag).resolve(meta.sampling_interval_s), 's')"):
        "the API's native window, a property of the source, written with its unit (s)",
    ("render/summary_html.py", "fmt_unit(sm_window['window_s'], 's')"): "the API's native window, written with its unit (s)",
    ("render/summary_html.py", "fmt_unit(experiment.meta.sampling_interval_s, 's')"): "the run's setting, written with its unit (s)",
    ("render/live_header.py", "fmt_unit(window_s, 's')"): "the header's window (a setting), written with its unit (s)",
    ("render/job_live.py", "fmt_unit(window_s, 's')"): "watch()'s window (a setting), written with its unit (s)",
    ("render/session_timeline.py", "fmt_unit(cadence, 's')"): _CADENCE,
    ("notebook/session_view.py", "fmt_unit(cadence, 's')"): _CADENCE,
    ("sampler_process/session_record.py", "fmt_unit(self.interval, 's')"): _CADENCE,
    ("sampler_process/session_record.py", "fmt_unit(SHARE_EVERY_S, 's')"): _CADENCE,
    ("sampler_process/long_cells.py", "fmt_unit(interval_s, 's')"): _CADENCE,
    ("notebook/session_view.py", "fmt_unit(seconds, 's')"): "the --keep-after setting the user gave, written with its unit (s)",
    ("render/memory_html.py", "fmt_unit(100 * threshold, '%')"):
        "--memory-history's low-headroom threshold (a setting of the run), written with its unit (%)",
}

_NUMBER_SPEC = re.compile(r"(?:[fgdeEn%]|,)$|,")
_TEMPLATE_SPEC = re.compile(r"\{[^{}]*:[^{}]*[fgdeEn%]\}")


def _docstrings(tree) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def bare_number_formats(path: Path) -> list[tuple[str, int, str]]:
    """(file, line, what) for each number a module formats without a Figure, allowed ones left out."""
    tree = ast.parse(path.read_text())
    name = str(path.relative_to(PACKAGE))
    docstrings, found = _docstrings(tree), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if called in BARE_FORMATTERS and (name, ast.unparse(node)) not in ALLOWED:
                found.append((name, node.lineno, f"{called}({', '.join(ast.unparse(a) for a in node.args)})"))
            if called == "format" and isinstance(func, ast.Name) and len(node.args) == 2:
                found.append((name, node.lineno, f"format({ast.unparse(node.args[0])}, ...)"))
        elif isinstance(node, ast.FormattedValue) and node.format_spec is not None:
            spec = "".join(v.value for v in node.format_spec.values if isinstance(v, ast.Constant))
            if _NUMBER_SPEC.search(spec) and (name, ast.unparse(node.value)) not in ALLOWED:
                found.append((name, node.lineno, f"{{{ast.unparse(node.value)}:{spec}}}"))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) \
                and isinstance(node.left.value, str) and re.search(r"%[-+ #0-9.]*[fgdeE]", node.left.value):
            found.append((name, node.lineno, f"{node.left.value!r} % ..."))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            match = _TEMPLATE_SPEC.search(node.value)
            if match:
                found.append((name, node.lineno, f"template field {match.group()}"))
    return found


def test_no_renderer_formats_a_bare_number():
    """Every figure a renderer prints goes through fmt_figure with its unit and provenance; the few
    numbers that are not figures of a run are listed in ALLOWED with why."""
    found = [hit for path in RENDERERS for hit in bare_number_formats(path)]
    assert found == [], "renderers formatting a bare number (build a Figure: core/figure.py):\n" + "\n".join(
        f"  {file}:{line}: {what}" for file, line, what in found)


def test_the_scan_finds_each_kind_of_bare_number(tmp_path, monkeypatch):
    """The scan can fail: a formatter call, a number format spec, a %-format and a template field."""
    render = tmp_path / "render"
    render.mkdir()
    planted = render / "planted.py"
    planted.write_text('from x import fmt_pct, html\n'
                       'def f(v):\n'
                       '    """Docstring {:.1f} is not code."""\n'
                       '    return [fmt_pct(v), f"{v:.1f} %", "%.2f" % v, html("<b>{:.0f}</b>", v), format(v, ".1f")]\n')
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    hits = sorted(what for _, _, what in bare_number_formats(planted))
    assert hits == sorted(["fmt_pct(v)", "{v:.1f}", "'%.2f' % ...", "template field {:.0f}", "format(v, ...)"]), hits


def test_every_allowed_exception_is_still_there():
    """A stale entry would let a new bare number through under an old excuse."""
    used = set()
    for path in RENDERERS:
        tree = ast.parse(path.read_text())
        name = str(path.relative_to(PACKAGE))
        used |= {(name, ast.unparse(n.value)) for n in ast.walk(tree) if isinstance(n, ast.FormattedValue)}
        used |= {(name, ast.unparse(n)) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert set(ALLOWED) <= used, set(ALLOWED) - used


@pytest.mark.parametrize("value", [None, math.nan, math.inf, -math.inf])
def test_an_unknown_figure_is_never_printed_as_0(value):
    for build in (lambda v: measured(v, "%", "NVML"), lambda v: simulated(v, "W"),
                  lambda v: estimated(v, "B", "a fit over 3 runs")):
        figure = build(value)
        assert figure.kind == "unknown" and figure.value is None
        assert fmt_figure(figure) == MISSING
    assert fmt_figure(unknown("B", "no GPU")) == MISSING


def test_a_simulated_figure_says_so_and_an_estimate_names_its_basis():
    assert fmt_figure(simulated(14.6 * 2**30, "B")) == "14.6 GiB (simulated)"
    assert fmt_figure(estimated(327, "count", "a fit over 3 runs")) == "327 (estimated: a fit over 3 runs)"
    assert fmt_figure(measured(0.0, "%", "NVML utilization.gpu")) == "0 %"  # a measured 0 is a 0
    assert fmt_figures([simulated(45.0, "%"), simulated(80.0, "%")]) == "45 % / 80 % (simulated)"
    assert fmt_figures([simulated(45.0, "%"), measured(80.0, "%", "psutil")]) == "45 % (simulated) / 80 %"
    with pytest.raises(ValueError, match="names its basis"):
        estimated(1.0, "B", "")


def test_a_bare_number_or_a_figure_without_a_unit_is_refused():
    with pytest.raises(TypeError, match="takes a Figure"):
        fmt_figure(42.0)
    with pytest.raises(ValueError, match="unit"):
        Figure(1.0, "furlongs", "measured", "a ruler")
    with pytest.raises(TypeError):
        measured("3", "%", "text is not a number")


def test_units_print_as_their_quantities():
    assert [fmt_figure(measured(v, u, "x")) for v, u in [
        (0.5, "J"), (1500.0, "J"), (0.25, "share"), (0.031, "change"), (12.5, "pts"), (2048.0, "B/s"),
        (1234.5, "samples/s"), (61.0, "offset"), (61.0, "s"), (0.0123, "time"), (1.5, "ratio"), (3.0, "count")]] == [
        "0.5 J", "1.5 kJ", "25 %", "+3.1 %", "+12.5 pts", "2.0 KiB/s", "1,234.5 samples/s", "61.0 s",
        "1 min 01.0 s", "12.30 ms", "1.50x", "3"]


def test_a_simulated_runs_findings_carry_the_flag_and_print_it():
    from gpuprof_jupyter.core.analysis.diagnosis import diagnose
    from gpuprof_jupyter.render.findings_html import findings_html, findings_text
    from tests.simexp import frame_experiment, sim_experiment, steps_frame

    findings = diagnose(sim_experiment("input-bound", seconds=6, steps=steps_frame(60, 6, 0.45)))
    assert findings and all(f.simulated for f in findings) and all(f.to_dict()["simulated"] for f in findings)
    assert all("(simulated): " in line for line in findings_text(findings))
    assert "Input-bound: the GPU waits for data (simulated)" in str(findings_html(findings))
    measured_run = frame_experiment(list(range(30)), [20.0] * 30, steps=steps_frame(30, 30, 0.45))
    assert not any(f.simulated for f in diagnose(measured_run))


def test_a_runs_figures_get_their_provenance():
    from gpuprof_jupyter.core.analysis.run_figures import run_figure
    from tests.simexp import sim_experiment

    meta = sim_experiment("compute-bound").meta
    assert run_figure(meta, "sm_util_mean", 80.0, "%").kind == "simulated"
    assert run_figure(meta, "energy_kwh", 0.1, "kWh").kind == "simulated"
    host = run_figure(meta, "cpu_util_mean", 20.0, "%")  # the host is measured, on a simulated run too
    assert host.kind == "measured" and "psutil" in host.basis
    assert run_figure(meta, "samples_per_s", 300.0, "samples/s").basis.startswith("the step hooks")
    assert run_figure(meta, "sm_util_mean", None, "%").kind == "unknown"
    meta.simulated = False
    assert run_figure(meta, "sm_util_mean", 80.0, "%").kind == "measured"


def test_a_verdict_in_pipeline_yaml_is_written_in_its_rules_unit(tmp_path):
    """The serving export wrote 'latency_p99 < 50 ms  # serve-b8: pass (0.000682509)': seconds
    beside a rule in ms. The figure is typed with the rule's unit now."""
    import numpy as np

    from gpuprof_jupyter.core.analysis.rules import evaluate_rules
    from gpuprof_jupyter.export.pipeline import export_pipeline
    from tests.simexp import requests_frame, sim_experiment

    run = sim_experiment("compute-bound", name="serve-b8", requests=requests_frame(np.full(100, 0.000682509), gaps=0.01))
    run.meta.checks = [r.to_dict() for r in evaluate_rules(run, ["latency_p99 < 50 ms", "requests_per_s > 10"])]
    export_pipeline(run, tmp_path / "pipeline.yaml", baseline=run)
    text = (tmp_path / "pipeline.yaml").read_text()
    assert re.search(r"latency_p99 < 50 ms +# serve-b8: pass \(683 µs\)", text), text  # the request hook's: measured
    assert re.search(r"requests_per_s > 10 +# serve-b8: pass \([\d.,]+/s\)", text), text
