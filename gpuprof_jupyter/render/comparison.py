"""A comparison of experiments as HTML and text: what ``compare()``, the report and ``gpuprof compare`` show.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

Two of ``compare()``'s three forms live here (the ipywidgets view is ``notebook/compare_widget.py``):
``text/html`` (tables, findings and the overlaid curves as static Bokeh output, which
nbconvert and offline pages render, docs/facts.md, "Exported pages"; viewers without JavaScript show the
tables) and ``text/plain``, which fits ``TEXT_WIDTH`` columns.

What the cells say: equal values are "same" (no colour); a setting or logged value a run did
not record is "not recorded", never a change; values print through core/format.py, so a bool
or a missing value reads the same here, in the report and in the text.
"""

from __future__ import annotations

import textwrap

from gpuprof_jupyter.core.analysis.compare import Comparison
from gpuprof_jupyter.core.analysis.run_figures import run_figure
from gpuprof_jupyter.core.analysis.summary import summary_of
from gpuprof_jupyter.core.figure import Figure, measured
from gpuprof_jupyter.core.format import MISSING, NOT_RECORDED, NOT_RECORDED_TEXT, fmt_figure, fmt_setting
from gpuprof_jupyter.render.findings_html import analysis_html, analysis_text
from gpuprof_jupyter.render.html import FONT, PALETTE, Cell, Markup, coloured, html, join, problem_box, simulated_banner, table
from gpuprof_jupyter.render.memory_html import memory_bars_html, memory_bars_text
from gpuprof_jupyter.render.ranks_table import ranks_rows
from gpuprof_jupyter.render.text_table import column_widths, text_table

TEXT_WIDTH = 100  # columns of the text form
_INCOMPARABLE = "different APIs: not comparable"
EXPORT_HEADING = "<b>export to pipeline.yaml</b> (one click)"  # above the comparison widget's export buttons (trusted HTML)
_NOT_RECORDED_CELL = Cell(NOT_RECORDED_TEXT, cls="not-recorded", style=f"color:{PALETTE['muted']};font-style:italic")


# A comparison row's kind -> the unit of its figures (core/figure.py).
_UNITS = {"seconds": "s", "latency": "time", "kwh": "kWh", "cost": "cost", "pct": "%", "frac": "share",
          "watts": "W", "bytes": "B", "rate": "/s", "joules": "J"}


def row_figure(c: Comparison | None, row, i: int, value=None) -> Figure:
    """Experiment ``i``'s figure of ``row`` (or ``value`` in the row's unit), typed with its run's provenance."""
    value = row.values[i] if value is None else value
    if row.user or row.kind not in _UNITS:
        return measured(value, "logged", "logged by the user")
    experiment = c.experiments[i] if c is not None else None
    if experiment is None:
        return measured(value, _UNITS[row.kind], "the run's summary")
    return run_figure(experiment.meta, row.key, value, _UNITS[row.kind], currency=c.currency,
                      memory=summary_of(experiment).get("memory"))


def fmt_delta(row, i: int, c: Comparison | None = None) -> str:
    """The change of experiment ``i`` against the baseline: points for percentages and shares,
    a signed percentage for measured figures, a signed number for logged ones; "" without one.
    Unlabelled: it is printed beside its value, which carries the label."""
    delta = row.deltas[i]
    if delta is None:
        return ""
    by = "the difference of two runs' figures"
    if row.kind == "pct":
        change = measured(delta, "pts", by)
    elif row.kind == "frac":
        change = measured(100 * delta, "pts", by)
    elif row.rel[i] is not None and not row.user:
        change = measured(row.rel[i], "change", by)
    else:
        change = measured(delta, "logged change", by)
    text = fmt_figure(change, labelled=False)
    interval = row.intervals[i] if row.intervals else None
    if interval is not None:  # a serving figure's change with its bootstrap interval (serving_compare.py)
        low, high = (fmt_figure(row_figure(c, row, i, abs(v)), labelled=False) for v in interval)
        sign = ["-" if v < 0 else "+" for v in interval]
        text += f", 95 % interval {sign[0]}{low} to {sign[1]}{high}"
    return text


def delta_words(row, i: int, c: Comparison | None = None) -> tuple[str, str | None]:
    """What a cell says after its value, and the verdict that colours it: "same" alone for equal
    values, "+0.3 %, same" within the noise, "+25.0 % better"; ("", None) without a change."""
    delta, verdict = fmt_delta(row, i, c), row.verdicts[i]
    if not delta:
        return "", None
    if row.deltas[i] == 0:
        return "same", "same"
    if verdict == "same":
        return f"{delta}, same", "same"
    return (f"{delta} {verdict}" if verdict in ("better", "worse") else delta), verdict


def _value(c: Comparison, row, i: int) -> str:
    """A figure with its label, or "not recorded" for a value the run did not log."""
    value = row.values[i]
    return NOT_RECORDED_TEXT if value is None and row.user else fmt_figure(row_figure(c, row, i))


def _heads(c: Comparison) -> list[str]:
    return [n + (" (baseline)" if i == c.baseline else "") for i, n in enumerate(c.names)]


def _setting_cell(row, i: int):
    value = row.values[i]
    if row.changed[i]:
        return Cell(fmt_setting(value), cls="changed", style=f"{PALETTE['banner']};font-weight:bold")
    if value is NOT_RECORDED:
        return _NOT_RECORDED_CELL
    return fmt_setting(value)


def settings_table_html(c: Comparison) -> Markup:
    if not c.settings:
        return Markup("<p><i>no settings recorded (use --param KEY=VALUE or params=)</i></p>")
    rows = [[row.key] + [_setting_cell(row, i) for i in range(len(row.values))] for row in c.settings]
    return table(rows, ["setting", *_heads(c)], cls="gpuprof-table gpuprof-settings", row_heads=True)


def _metric_cell(c: Comparison, row, i: int) -> Markup:
    words, verdict = delta_words(row, i, c)
    if row.values[i] is None and row.user:
        return coloured(NOT_RECORDED_TEXT, "muted", cls="not-recorded")
    text = html("{}", _value(c, row, i))
    if words:
        kind = verdict or "neutral"
        if verdict in ("better", "worse"):
            text += html(" {}", coloured(f"({words})", "good" if verdict == "better" else "bad", cls=f"delta {kind}"))
        elif verdict == "same":
            text += html(" <span class='delta same'>({})</span>", words)
        else:
            text += html(" {}", coloured(f"({words})", "muted", cls=f"delta {kind}"))
    if not row.comparable(i):
        text += html(" <b class='incomparable' style='color:{}' title='measured by different APIs than the baseline: "
                     "a different quantity'>&#9888; {}</b>", PALETTE["bad"], _INCOMPARABLE)
    return text


def shown_rows(c: Comparison) -> list:
    """The metric rows to show: a figure no run measured (the GPU's on host-only runs) is left
    out rather than shown as a row of "n/a"; a logged value stays (its "not recorded" says something)."""
    return [row for row in c.metrics if row.user or any(v is not None for v in row.values)]


def metrics_table_html(c: Comparison) -> Markup:
    rows = [[row.label] + [_metric_cell(c, row, i) for i in range(len(row.values))] for row in shown_rows(c)]
    if any(g is not None for g in c.gains):
        rows.append([GAIN_LABEL] + [Cell(text, cls="gain") for text in gain_cells(c)])
    return table(rows, ["metric", *_heads(c)], cls="gpuprof-table gpuprof-metrics", row_heads=True)


GAIN_LABEL = "gain against the baseline (95 % CI)"


def gain_cells(c: Comparison) -> list[str]:
    """Per experiment, its gain against the baseline as every view words it (core/analysis/gain.py);
    the missing value for the baseline and runs without steps."""
    return [MISSING if g is None else g.text() for g in c.gains]


def warnings_html(c: Comparison) -> Markup:
    if not c.warnings:
        return Markup("")
    return problem_box("not a fair comparison:", [(w.kind, w.message) for w in c.warnings])


def comparison_html(c: Comparison, *, plots: bool = True, diagnosis: bool = True) -> Markup:
    sim = any(e.meta.simulated for e in c.experiments)
    h4 = "<h4 style='margin:6px 0 2px'>{}</h4>{}"
    parts = [simulated_banner("SIMULATED GPU in this comparison: those figures are not measurements") if sim else "",
             html("<div><b>gpuprof comparison</b>: {} experiments, baseline <b>{}</b></div>", len(c.experiments),
                  c.names[c.baseline]),
             join(html("<p class='gpuprof-compare-note' style='margin:2px 0;color:{}'>{}</p>", PALETTE["muted"], n)
                  for n in c.notes),
             warnings_html(c),
             html(h4, "settings (changed against the baseline highlighted)", settings_table_html(c)),
             html(h4, "metrics (delta against the baseline; green better, red worse, same: within the noise)",
                  metrics_table_html(c))]
    ranks = ranks_rows(c.experiments)
    if ranks:
        parts.append(html(h4, "ranks", table(ranks)))
    parts.append(memory_bars_html(c.experiments))
    if plots:
        from gpuprof_jupyter.render.overlay_plots import overlay_html

        parts.append(overlay_html(c.experiments))
    from gpuprof_jupyter.render.trace_html import trace_comparison_html

    parts.append(trace_comparison_html(c.experiments))
    if diagnosis:
        for e in c.experiments:
            block = analysis_html(e)
            if block:
                parts.append(html("<details open><summary><b>{}</b></summary>{}</details>", e.name, block))
    return html("<div class='gpuprof-compare' style='{}'>{}</div>", FONT, join(parts))


def _column_groups(label_width: int, widths: list[int], baseline: int) -> list[list[int]] | None:
    """The columns in groups that fit ``TEXT_WIDTH``: all at once, else the baseline beside as
    many others as fit, repeated; None when the baseline and one other do not fit side by side."""
    if label_width + sum(3 + w for w in widths) <= TEXT_WIDTH:
        return [list(range(len(widths)))]
    groups, group = [], [baseline]
    for i in (i for i in range(len(widths)) if i != baseline):
        if label_width + sum(3 + widths[j] for j in group) + 3 + widths[i] > TEXT_WIDTH:
            if len(group) == 1:
                return None
            groups.append(group)
            group = [baseline]
            if label_width + 3 + widths[baseline] + 3 + widths[i] > TEXT_WIDTH:
                return None
        group.append(i)
    return groups + [group]


def _text_table(corner: str, heads: list[str], rows: list[tuple[str, list[str]]], baseline: int) -> list[str]:
    """``label | cell | cell`` lines within ``TEXT_WIDTH``: split into groups of columns (each
    with the baseline) when too wide, one value a line when even two columns do not fit."""
    table = [(corner, *heads), *((label, *cells) for label, cells in rows)]
    label_width, *widths = column_widths(table)
    groups = _column_groups(label_width, widths, baseline)
    if groups is None:
        lines = [corner + "s, one run a line:"]
        for label, cells in rows:
            lines += textwrap.wrap(label, TEXT_WIDTH) or [label]
            for head, cell in zip(heads, cells):
                lines += textwrap.wrap(f"{head}: {cell}", TEXT_WIDTH, initial_indent="  ", subsequent_indent="      ")
        return lines
    lines = []
    for group in groups:
        lines += text_table(table, sep=" | ", columns=[0, *(1 + i for i in group)])
    return lines


def _fit(lines: list[str]) -> list[str]:
    """Each line within ``TEXT_WIDTH`` columns, wrapped with an indent (nothing cut)."""
    out = []
    for line in lines:
        if len(line) <= TEXT_WIDTH:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip(" ")))
        out += textwrap.wrap(line, TEXT_WIDTH, subsequent_indent=indent + "    ", break_on_hyphens=False) or [line]
    return out


def _fits_at_once(heads: list[str], rows: list[tuple[str, list[str]]]) -> bool:
    label_width, *widths = column_widths([(label, *cells) for label, cells in rows])
    return label_width + sum(3 + max(len(h), w) for h, w in zip(heads, widths)) <= TEXT_WIDTH


def comparison_text(c: Comparison) -> str:
    lines = [f"gpuprof comparison, baseline {c.names[c.baseline]!r}"]
    lines += [f"note: {n}" for n in c.notes]
    lines += [f"WARNING ({w.kind}): {w.message}" for w in c.warnings]
    for i, name in enumerate(c.names):
        changed = c.changed_settings(i) if i != c.baseline else {}
        if changed:
            lines.append(f"{name} changed: " + ", ".join(f"{k}: {fmt_setting(a)} -> {fmt_setting(b)}"
                                                         for k, (a, b) in changed.items()))
    settings = [(row.key, [fmt_setting(v) + (" *" if row.changed[i] else "") for i, v in enumerate(row.values)])
                for row in c.settings]
    metrics = []
    for row in shown_rows(c):
        cells = []
        for i in range(len(row.values)):
            words = delta_words(row, i, c)[0]
            cells.append(_value(c, row, i) + (f" ({words})" if words else "")
                         + ("" if row.comparable(i) else f" [{_INCOMPARABLE}]"))
        metrics.append((row.label, cells))
    if any(g is not None for g in c.gains):
        metrics.append((GAIN_LABEL, gain_cells(c)))
    heads = list(c.names)
    if not _fits_at_once(heads, [("setting", heads), *settings, *metrics]):  # columns headed #1, #2... instead
        heads = [f"#{i + 1}" for i in range(len(c.names))]
        lines += [f"#{i + 1}: {n}" + (" (baseline)" if i == c.baseline else "") for i, n in enumerate(c.names)]
    lines = _fit(lines)
    lines += _text_table("setting", heads, settings, c.baseline) if settings else []
    lines += _text_table("metric", heads, metrics, c.baseline)
    rest = ["ranks: " + "; ".join(f"{k}: {v}" for k, v in row.items()) for row in ranks_rows(c.experiments)]
    rest += memory_bars_text(c.experiments)
    from gpuprof_jupyter.render.trace_html import trace_comparison_text

    rest += trace_comparison_text(c.experiments)
    rest += [f"{e.name}: {line}" for e in c.experiments for line in analysis_text(e)]
    return "\n".join(lines + _fit(rest))
