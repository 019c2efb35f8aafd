"""The session's timeline: every cell as a span, the GPUs beneath, the idle stretches while memory was held.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

Drawn from the session record as the sampler process answers it (``SessionAccount.to_dict``): the
cells as spans (number, first line, duration), idle stretches while this kernel held GPU memory
marked, GPU activity, memory held and power per device beneath on one time axis, and the
profiled cells linked to their experiments (the table names each with the command that shows
it). Static Bokeh, embedded as the static ending is (``static_plots.embed_item_html``), with a
text/plain listing for every other front end.
"""

from __future__ import annotations

import json

from gpuprof_jupyter.core.figure import Figure, measured, unknown
from gpuprof_jupyter.core.format import fmt_figure, fmt_unit, missing
from gpuprof_jupyter.render.html import FONT, PALETTE, Markup, bullet_list, html, join, table
from gpuprof_jupyter.render.static_plots import embed_item_html

PANELS = (("gpu_busy", "GPU busy (%)"), ("memory_held_bytes", "memory held (bytes)"), ("power_w", "power (W)"))
WIDTH = 900
MARKS = "the kernel's cell marks (pre/post_run_cell)"  # what a cell's or an idle stretch's duration is measured by


def _figure(body: dict, key: str, value, unit: str) -> Figure:
    """A figure of the session record: measured by the source its provenance names (``key``'s), or
    unknown ("n/a", never 0) when the record has no value."""
    if missing(value):
        return unknown(unit, "the session record has no reading")
    basis = (body.get("provenance") or {}).get(key) or (MARKS if key == "duration_s" else "the session record")
    return measured(value, unit, basis)


def idle_held(rows: list[dict]) -> list[dict]:
    """The idle stretches during which this kernel held GPU memory."""
    return [r for r in rows if r.get("kind") == "idle" and (r.get("memory_held_bytes") or 0) > 0
            and (r.get("duration_s") or 0) > 0]


def timeline_layout(body: dict):
    """The Bokeh layout: cells, then one panel per series of ``PANELS`` (shared time axis)."""
    from bokeh.layouts import column
    from bokeh.models import ColumnDataSource, HoverTool
    from bokeh.plotting import figure

    rows = body.get("rows", [])
    cells = [r for r in rows if r.get("kind") == "cell" and r.get("started") is not None]
    spans = figure(height=110, width=WIDTH, x_axis_type="datetime", y_range=(0, 1), title="cells",
                   tools="xpan,xwheel_zoom,reset", toolbar_location="right")
    spans.yaxis.visible = False
    held = idle_held(rows)
    if held:
        spans.quad(left=[r["started"] * 1000 for r in held],
                   right=[(r["started"] + r["duration_s"]) * 1000 for r in held], bottom=0, top=1,
                   color=PALETTE["warn"], alpha=0.25, legend_label="GPU idle, memory held")
    source = ColumnDataSource({
        "left": [r["started"] * 1000 for r in cells],
        "right": [(r["started"] + (r.get("duration_s") or 0.0)) * 1000 for r in cells],
        "cell": [str(r.get("cell") if r.get("cell") is not None else "?") for r in cells],
        "first": [r.get("source") or "" for r in cells],
        "duration": [fmt_figure(_figure(body, "duration_s", r.get("duration_s"), "s")) for r in cells],
        "experiment": [r.get("experiment") or "" for r in cells],
        "colour": [_colour(r) for r in cells],
    })
    quads = spans.quad(left="left", right="right", bottom=0.15, top=0.85, color="colour", source=source)
    spans.add_tools(HoverTool(renderers=[quads], tooltips=[("cell", "[@cell] @first"), ("duration", "@duration"),
                                                           ("experiment", "@experiment")]))
    panels = [spans]
    series = body.get("timeline") or {}
    t = [x * 1000 for x in series.get("t", [])]
    for name, title in PANELS:
        panel = figure(height=150, width=WIDTH, x_axis_type="datetime", x_range=spans.x_range, title=title,
                       tools="xpan,xwheel_zoom,reset", toolbar_location="right")
        for i, device in enumerate(series.get("devices", [])):
            values = series.get("columns", {}).get(f"{device}.{name}", [])
            ys = [float("nan") if v is None else v for v in values]
            panel.line(t, ys, legend_label=device, line_width=1.5, color=_device_colour(i))
        if panel.legend:
            panel.legend.location = "top_left"
        panels.append(panel)
    return column(*panels)


def _colour(row: dict) -> str:
    if row.get("experiment"):
        return "#2ca02c"  # profiled (or kept from the record): it has an experiment
    if row.get("status") in ("error", "interrupted"):
        return "#d62728"
    return "#1f77b4"


def _device_colour(i: int) -> str:
    return ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")[i % 8]


def _heading(body: dict) -> str:
    rows = body.get("rows", [])
    cells = [r for r in rows if r.get("kind") == "cell"]
    busy = [r["gpu_busy_s"] for r in cells if not missing(r.get("gpu_busy_s"))]
    energy = [r["energy_j"] for r in rows if not missing(r.get("energy_j"))]
    held = idle_held(rows)
    cadence = body.get("interval_s")
    held_s = fmt_figure(_figure(body, "duration_s", sum(r["duration_s"] for r in held), "s")) if held else "0 s"
    parts = [f"{len(cells)} cells",
             f"GPU busy {fmt_figure(_figure(body, 'gpu_busy_s', sum(busy) if busy else None, 's'))} (device time)",
             f"energy {fmt_figure(_figure(body, 'energy_j', sum(energy) if energy else None, 'J'))}",
             f"idle while holding memory {held_s}"]
    state = "on" if body.get("on") else "off"
    return (f"Session record ({state}, every {fmt_unit(cadence, 's')}): " if cadence else f"Session record ({state}): ") + \
        ", ".join(parts)


def _table_rows(body: dict) -> list[list]:
    out = []
    for r in body.get("rows", []):
        what = f"[{r.get('cell')}] {r.get('source') or ''}" if r.get("kind") == "cell" else "idle"
        experiment = r.get("experiment")
        out.append([what, *(fmt_figure(_figure(body, key, r.get(key), unit)) for key, unit in FIGURES),
                    r.get("status") or "",
                    f"{experiment} (%gpuprofile show {experiment})" if experiment else ""])
    return out


FIGURES = (("duration_s", "s"), ("gpu_busy_s", "s"), ("energy_j", "J"), ("memory_held_bytes", "B"))
HEAD = ["cell", "duration", "GPU busy", "energy", "memory held at end", "status", "experiment"]


def timeline_text(body: dict) -> str:
    lines = [_heading(body)]
    for row in _table_rows(body):
        lines.append("  " + " | ".join(str(v) for v in row if v != ""))
    lines.extend(_provenance_lines(body))
    lines.extend(f"note: {n}" for n in body.get("notes", []))
    return "\n".join(lines)


def _provenance_lines(body: dict) -> list[str]:
    return [f"{name}: {tag}" for name, tag in (body.get("provenance") or {}).items() if name != "cadence_s"]


def timeline_html(body: dict) -> Markup:
    parts = [html("<div style='{}'><b>{}</b></div>", FONT, _heading(body))]
    if body.get("rows"):
        try:
            from bokeh.embed import json_item

            parts.append(embed_item_html(json.dumps(json_item(timeline_layout(body)))))
        except Exception as exc:  # noqa: BLE001 - the table still says everything
            parts.append(html("<div>(timeline unavailable: {})</div>", f"{type(exc).__name__}: {exc}"))
        parts.append(table(_table_rows(body), HEAD))
    provenance = _provenance_lines(body)
    if provenance:
        parts.append(bullet_list(provenance, title="Where the figures come from"))
    if body.get("notes"):
        parts.append(bullet_list(body["notes"], title="Notes"))
    return join(parts)


def timeline_bundle(body: dict) -> dict:
    """The display bundle of ``%gpuprofile session``."""
    return {"text/html": str(timeline_html(body)), "text/plain": timeline_text(body)}
