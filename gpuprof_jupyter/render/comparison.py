"""A comparison of experiments as HTML and text: what ``compare()``, the report and ``gpuprof compare`` show.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

Two of ``compare()``'s three forms live here (the ipywidgets view is ``kernel/views/compare_widget.py``):
``text/html`` (tables, findings and the overlaid curves as static Bokeh output, which
nbconvert and offline pages render, docs/facts.md, "Exported pages"; viewers without JavaScript show the
tables) and ``text/plain``.
"""

from __future__ import annotations

from html import escape

from gpuprof_jupyter.core.analysis.compare import Comparison
from gpuprof_jupyter.render.findings_html import analysis_html, analysis_text
from gpuprof_jupyter.core.format import fmt_value
from gpuprof_jupyter.render.html_table import table_html
from gpuprof_jupyter.render.ranks_table import ranks_rows

GOOD_COLOUR, BAD_COLOUR = "#2e7d32", "#c62828"
_INCOMPARABLE = "different APIs: not comparable"


def fmt_delta(row, i: int) -> str:
    if row.deltas[i] is None:
        return ""
    if row.kind in ("pct",):
        text = f"{row.deltas[i]:+.1f} pts"
    elif row.kind == "frac":
        text = f"{100 * row.deltas[i]:+.1f} pts"
    elif row.rel[i] is not None and not row.user:
        text = f"{100 * row.rel[i]:+.1f} %"
    else:
        text = f"{row.deltas[i]:+.4g}"
    interval = row.intervals[i] if row.intervals else None
    if interval is not None:
        low, high = (fmt_value(row.kind, abs(v)) for v in interval)
        sign = ["-" if v < 0 else "+" for v in interval]
        text += f", 95 % interval {sign[0]}{low} to {sign[1]}{high}"
    return text


def _setting(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def settings_table_html(c: Comparison) -> str:
    if not c.settings:
        return "<p><i>no settings recorded (use --param KEY=VALUE or params=)</i></p>"
    head = "".join(f"<th>{escape(n)}{' (baseline)' if i == c.baseline else ''}</th>" for i, n in enumerate(c.names))
    body = ""
    for row in c.settings:
        cells = "".join(
            f"<td{' class=changed style=background:#fff3cd;font-weight:bold' if row.changed[i] else ''}>"
            f"{escape(_setting(v))}</td>" for i, v in enumerate(row.values))
        body += f"<tr><th style='text-align:left'>{escape(row.key)}</th>{cells}</tr>"
    return f"<table class='gpuprof-table gpuprof-settings'><thead><tr><th>setting</th>{head}</tr></thead><tbody>{body}</tbody></table>"


def metrics_table_html(c: Comparison) -> str:
    head = "".join(f"<th>{escape(n)}{' (baseline)' if i == c.baseline else ''}</th>" for i, n in enumerate(c.names))
    body = ""
    for row in c.metrics:
        cells = ""
        for i, v in enumerate(row.values):
            text = escape(fmt_value(row.kind, v, c.currency))
            delta, verdict = fmt_delta(row, i), row.verdicts[i]
            if delta:
                colour = GOOD_COLOUR if verdict == "better" else BAD_COLOUR if verdict == "worse" else "#777"
                text += f" <span class='delta {escape(verdict or 'neutral')}' style='color:{colour}'>({escape(delta)})</span>"
            if not row.comparable(i):
                text += (f" <b class='incomparable' style='color:{BAD_COLOUR}' title='measured by different APIs than the "
                         f"baseline: a different quantity'>&#9888; {escape(_INCOMPARABLE)}</b>")
            cells += f"<td>{text}</td>"
        body += f"<tr><th style='text-align:left'>{escape(row.label)}</th>{cells}</tr>"
    return f"<table class='gpuprof-table gpuprof-metrics'><thead><tr><th>metric</th>{head}</tr></thead><tbody>{body}</tbody></table>"


def warnings_html(c: Comparison) -> str:
    if not c.warnings:
        return ""
    items = "".join(f"<li data-warning='{escape(w.kind)}'>{escape(w.message)}</li>" for w in c.warnings)
    return ("<div class='gpuprof-warnings' style='background:#fdecea;color:#611a15;padding:4px 8px;border-radius:4px'>"
            f"<b>&#9888; not a fair comparison:</b><ul style='margin:2px 0'>{items}</ul></div>")


def comparison_html(c: Comparison, *, plots: bool = True, diagnosis: bool = True) -> str:
    sim = any(e.meta.simulated for e in c.experiments)
    banner = ("<div style='background:#fff3cd;color:#5c4400;padding:4px 8px;border-radius:4px;font-weight:bold'>"
              "SIMULATED GPU in this comparison: those figures are not measurements</div>" if sim else "")
    html = (f"<div class='gpuprof-compare' style='font-family:sans-serif;font-size:13px'>{banner}"
            f"<div><b>gpuprof comparison</b>: {len(c.experiments)} experiments, baseline "
            f"<b>{escape(c.names[c.baseline])}</b></div>{warnings_html(c)}"
            f"<h4 style='margin:6px 0 2px'>settings (changed against the baseline highlighted)</h4>{settings_table_html(c)}"
            f"<h4 style='margin:6px 0 2px'>metrics (delta against the baseline; green better, red worse)</h4>"
            f"{metrics_table_html(c)}")
    ranks = ranks_rows(c.experiments)
    if ranks:
        html += f"<h4 style='margin:6px 0 2px'>ranks</h4>{table_html(ranks)}"
    if plots:
        from gpuprof_jupyter.render.overlay_plots import overlay_html

        html += overlay_html(c.experiments)
    from gpuprof_jupyter.render.trace_html import trace_comparison_html

    html += trace_comparison_html(c.experiments)
    if diagnosis:
        for e in c.experiments:
            block = analysis_html(e)
            if block:
                html += f"<details open><summary><b>{escape(e.name)}</b></summary>{block}</details>"
    return html + "</div>"


def comparison_text(c: Comparison) -> str:
    lines = [f"gpuprof comparison, baseline {c.names[c.baseline]!r}"]
    lines += [f"WARNING ({w.kind}): {w.message}" for w in c.warnings]
    for i, name in enumerate(c.names):
        changed = c.changed_settings(i) if i != c.baseline else {}
        if changed:
            lines.append(f"{name} changed: " + ", ".join(f"{k}: {_setting(a)} -> {_setting(b)}" for k, (a, b) in changed.items()))
    width = max([len(r.key) for r in c.settings] + [len(r.label) for r in c.metrics] + [8])
    lines.append("setting".ljust(width) + " | " + " | ".join(c.names))
    for row in c.settings:
        cells = [_setting(v) + (" *" if row.changed[i] else "") for i, v in enumerate(row.values)]
        lines.append(row.key.ljust(width) + " | " + " | ".join(cells))
    lines.append("metric".ljust(width) + " | " + " | ".join(c.names))
    for row in c.metrics:
        cells = []
        for i, v in enumerate(row.values):
            text = fmt_value(row.kind, v, c.currency)
            delta = fmt_delta(row, i)
            if delta:
                mark = {"better": " better", "worse": " worse"}.get(row.verdicts[i] or "", "")
                text += f" ({delta}{mark})"
            if not row.comparable(i):
                text += f" [{_INCOMPARABLE}]"
            cells.append(text)
        lines.append(row.label.ljust(width) + " | " + " | ".join(cells))
    lines += ["ranks: " + "; ".join(f"{k}: {v}" for k, v in row.items()) for row in ranks_rows(c.experiments)]
    from gpuprof_jupyter.render.trace_html import trace_comparison_text

    lines += trace_comparison_text(c.experiments)
    lines += [f"{e.name}: {line}" for e in c.experiments for line in analysis_text(e)]
    return "\n".join(lines)
