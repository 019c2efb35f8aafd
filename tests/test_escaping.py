"""A name like <script>alert(1)</script> appears as text in every view."""

from __future__ import annotations

import pytest

from gpuprof_jupyter.core.analysis.compare import compare_experiments
from gpuprof_jupyter.kernel.views.compare_widget import ComparisonView
from gpuprof_jupyter.render.comparison import comparison_html
from gpuprof_jupyter.render.findings_html import checks_html, findings_html
from gpuprof_jupyter.core.analysis.diagnosis import diagnose
from gpuprof_jupyter.core.analysis.rules import evaluate_rules
from gpuprof_jupyter.render.report import render_report
from gpuprof_jupyter.render.summary_html import render_summary_html
from tests.simexp import sim_experiment, steps_frame

EVIL = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


@pytest.fixture
def evil_runs():
    base = sim_experiment("input-bound", seconds=4, name="base", params={"batch_size": 32},
                          steps=steps_frame(20, 4, 0.5), cpu_util=95)
    evil = sim_experiment("fp32", seconds=4, name=EVIL, params={EVIL: EVIL, "batch_size": 64},
                          user_metrics={EVIL: 1.0, "note": EVIL}, phases=[{"name": EVIL, "start_s": 0, "end_s": 2}])
    evil.meta.context["cell_source"] = f"print('{EVIL}')"
    evil.meta.checks = [r.to_dict() for r in evaluate_rules(evil, [f"sm_util > 60 for 80% in phase '{EVIL}'"])]
    return base, evil


def assert_escaped(html: str):
    assert EVIL not in html
    assert ESCAPED in html


def test_summary(evil_runs):
    assert_escaped(render_summary_html(evil_runs[1]))


def test_findings_and_rules(evil_runs):
    evil = evil_runs[1]
    html = checks_html(evaluate_rules(evil, [f"sm_util > 60 for 80% in phase '{EVIL}'"]))
    assert_escaped(html)
    assert EVIL not in findings_html(diagnose(evil))


def test_comparison_static_and_widget(evil_runs):
    c = compare_experiments(evil_runs)
    assert_escaped(comparison_html(c))
    view = ComparisonView(c)
    assert_escaped(view.static_bundle()["text/html"])
    descriptions = [b.description for b in view.widget().children[1].children[1].children]
    assert f"export {EVIL}" in descriptions  # a button label is text, never HTML


def test_report(evil_runs):
    html = render_report(evil_runs)
    body = html.split("<body>", 1)[1]
    assert_escaped(body)
    assert EVIL not in html.replace(ESCAPED, "")
