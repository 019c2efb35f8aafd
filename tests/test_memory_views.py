"""Where the memory went, as people see it: the stacked bar per run in the summary, the
comparison and the report; the per-step peak on the live plot and in Prometheus."""

from __future__ import annotations

import re

from gpuprof_jupyter.core.analysis.compare import compare_experiments
from gpuprof_jupyter.core.plots.spec import plot_spec
from gpuprof_jupyter.render.comparison import comparison_html, comparison_text
from gpuprof_jupyter.render.memory_html import BAR_PX
from gpuprof_jupyter.render.report import render_report
from gpuprof_jupyter.render.summary_html import render_summary_html, render_summary_text
from gpuprof_jupyter.sampler_process.exporter import Exporter
from tests.memexp import memory_run
from tests.test_exporter import DEVICES, scrape, values

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other")


def _widths(html: str, category: str) -> list[float]:
    return [float(w) for w in re.findall(rf"gpuprof-mem-{category}'[^>]*width:([\d.]+)px", html)]


def test_summary_shows_one_bar_with_every_category_and_the_figures():
    run = memory_run(32, name="<b>bold</b>")
    html, text = render_summary_html(run), render_summary_text(run)
    assert html.count("gpuprof-mem-bar") == 1
    for category in CATEGORIES:
        assert _widths(html, category), category
    assert "&lt;b&gt;bold&lt;/b&gt;" in html and "<b>bold</b>" not in html
    assert "[simulated]" in html  # a simulated run says so on its bar
    assert "memory breakdown: parameters 1.0 GiB, gradients 1.0 GiB, optimizer_state 2.0 GiB" in text
    assert "headroom" in text and "step peak p50 / max" in text


def test_comparison_and_report_share_one_scale_across_runs():
    small, large = memory_run(8, name="small"), memory_run(64, name="large")
    comparison = compare_experiments([small, large])
    html = comparison_html(comparison, plots=False)
    assert html.count("gpuprof-mem-bar") == 2
    total = {name: sum(w for c in CATEGORIES for w in _widths(bar, c))
             for name, bar in zip(("small", "large"), html.split("gpuprof-mem-bar")[1:])}
    peaks = {e.name: e.summary["memory"]["peak_bytes"] for e in (small, large)}
    assert abs(total["large"] - BAR_PX) < 6  # the larger run spans the bar (1 px minimum per segment)
    assert abs(total["small"] / total["large"] - peaks["small"] / peaks["large"]) < 0.02
    assert "peak tensor memory" in html and "step peak memory p50 (torch)" in html
    text = comparison_text(comparison)
    assert "small: memory breakdown:" in text and "large: memory breakdown:" in text
    report = render_report([small, large])
    assert report.count("gpuprof-mem-bar") == 4  # the comparison's two, then each run's section


def test_runs_without_memory_figures_draw_no_bar():
    run = memory_run(8, breakdown=False, step_peaks=False)
    html = render_summary_html(run)
    assert "gpuprof-mem-bar" not in html


def test_live_plot_draws_the_step_peaks_beside_allocated_memory():
    run = memory_run(8)
    run.meta.units["step_peak_memory_bytes"] = "B"
    run.meta.units["torch_mem_allocated_bytes"] = "B"
    spec = plot_spec(run.meta)
    (mem,) = [p for p in spec.panels if p.key == "mem"]
    labels = [s.label for s in mem.series]
    assert "gpu0 step peak" in labels and "gpu0 torch alloc" in labels


def test_prometheus_exports_the_step_peak():
    exporter = Exporter(node="node-a")
    exporter.set_devices(DEVICES, {"gpu0": {"step_peak_memory_bytes": "torch.cuda.step_peak"}})
    exporter.update({"gpu0": {"step_peak_memory_bytes": 3.5e9}})
    exporter.start(port=0)
    try:
        families = scrape(exporter)
    finally:
        exporter.close()
    assert values(families, "gpuprof_step_peak_memory_bytes", device="gpu0") == [3.5e9]
