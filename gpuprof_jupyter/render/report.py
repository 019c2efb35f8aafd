"""``render_report()``: the text of one standalone HTML file (BokehJS INLINE, opens offline) with
plots, summaries, phases, diagnosis, rules, user metrics, settings, cell source and the comparison.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

Writing it (and each traced run's merged trace beside it) is ``export/report.py``'s ``report()``.

Every user-provided string (names, params, logged values, cell source, rule text) is escaped
(render/html.py); settings print as the comparison prints them (core/format.py).
"""

from __future__ import annotations

from datetime import datetime, timezone

from gpuprof_jupyter.core.analysis.compare import compare_experiments
from gpuprof_jupyter.core.format import fmt_setting
from gpuprof_jupyter.render.comparison import comparison_html
from gpuprof_jupyter.render.html import PALETTE, Markup, html, join, simulated_banner, table
from gpuprof_jupyter.render.overlay_plots import overlay_figures
from gpuprof_jupyter.render.summary_html import render_summary_html
from gpuprof_jupyter.render.trace_html import trace_link_html

_CSS = """
body{font-family:sans-serif;font-size:13px;margin:16px 24px;color:#222}
h1{font-size:20px} h2{font-size:16px;border-bottom:1px solid #ddd;padding-bottom:2px;margin-top:28px}
table.gpuprof-table{border-collapse:collapse;margin:4px 0}
table.gpuprof-table td,table.gpuprof-table th{border:1px solid #ddd;padding:2px 6px;text-align:right}
pre{background:#f6f8fa;padding:6px;overflow:auto;max-height:300px}
"""


def _plots_layout(experiment):
    try:
        from gpuprof_jupyter.render.static_plots import static_plots_layout

        return static_plots_layout(experiment)
    except ImportError:  # the static plots view is optional: fall back to the overlay of one
        from bokeh.layouts import column

        return column(*overlay_figures([experiment]), sizing_mode="stretch_width")


def _resources_html(models) -> str:
    from bokeh.resources import INLINE

    try:
        from bokeh.embed.bundle import bundle_for_objs_and_resources

        bundle = bundle_for_objs_and_resources(models, INLINE)
        return bundle._render_js() + bundle._render_css()
    except Exception:  # noqa: BLE001 - private helper changed: ship every component
        return INLINE.render()


def _settings_table(title: str, values: dict) -> Markup:
    rows = [(str(k), fmt_setting(v)) for k, v in values.items()]
    return html("<h3>{}</h3>{}", title, table(rows, ["setting", "value"], row_heads=True)) if rows else Markup("")


def _experiment_section(experiment, plot_div: str, trace_link: str | None = None) -> Markup:
    meta = experiment.meta
    source = meta.context.get("cell_source") or meta.context.get("command")
    if isinstance(source, list):
        source = " ".join(map(str, source))
    return html(
        "<section class='gpuprof-experiment' data-id='{}'><h2>{}</h2>{}{}{}{}<h3>plots</h3>{}{}</section>",
        meta.id, meta.name, render_summary_html(experiment), trace_link_html(trace_link) if trace_link else "",
        _settings_table("settings", meta.params), _settings_table("captured variables", meta.captured),
        Markup(plot_div),  # Bokeh's div for these plots
        html("<details><summary>source</summary><pre>{}</pre></details>", source) if source else "")


def render_report(experiments, *, title: str | None = None, prices=None, baseline=0,
                  trace_links: dict[str, str] | None = None) -> str:
    """The report's HTML text for ``experiments`` (Experiment objects). ``trace_links``:
    experiment id -> href of its merged trace (``report()`` writes them beside the page)."""
    from bokeh.embed import components

    experiments = list(experiments)
    if not experiments:
        raise ValueError("a report needs at least one experiment")
    models = [_plots_layout(e) for e in experiments]
    comparison = None
    if len(experiments) > 1:
        comparison = compare_experiments(experiments, baseline, prices=prices)
        from bokeh.layouts import column

        models.append(column(*overlay_figures(experiments), sizing_mode="stretch_width"))
    script, divs = components(models)
    title = title or ("gpuprof report: " + ", ".join(e.name for e in experiments))
    sim = any(e.meta.simulated for e in experiments)
    parts = [
        html("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{}</title><style>{}</style>",
             title, Markup(_CSS)),
        Markup(_resources_html(models)), Markup(script), Markup("</head><body>"),  # BokehJS and Bokeh's script
        html("<h1>{}</h1><p style='color:{}'>generated {:%Y-%m-%d %H:%M} UTC by gpuprof_jupyter; "
             "{} experiment(s). Opens offline: BokehJS is inline.</p>", title, PALETTE["muted"],
             datetime.now(timezone.utc), len(experiments)),
    ]
    if sim:
        parts.append(simulated_banner("Contains SIMULATED GPU runs: those figures are not measurements"))
    if comparison is not None:
        parts.append(html("<h2>comparison</h2>{}{}", comparison_html(comparison, plots=False, diagnosis=False),
                          Markup(divs[-1])))
    for experiment, div in zip(experiments, divs):
        parts.append(_experiment_section(experiment, div, (trace_links or {}).get(experiment.id)))
    parts.append(Markup("</body></html>"))
    return str(join(parts))
