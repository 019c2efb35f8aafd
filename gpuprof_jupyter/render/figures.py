"""Bokeh figures from a PlotSpec: shared by the live dashboard (streams into the sources) and
the static rendering (fills them once).

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

Three wide data sources drive every panel: ``recent`` (full rate, rollover), ``history``
(min/max-decimated, replaced at most once a minute) and ``bands`` (phases and sampler gaps).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from bokeh.layouts import column
from bokeh.models import (
    ColumnDataSource, CustomJS, DataRange1d, HoverTool, LabelSet, Legend, LegendItem, Range1d, Span,
)
from bokeh.plotting import figure

from gpuprof_jupyter.core.plots.spec import FRAME_HEIGHT, FRAME_WIDTH, PlotSpec, device_colour
from gpuprof_jupyter.render.html import PALETTE


@dataclass
class Figures:
    layout: object
    recent: ColumnDataSource
    history: ColumnDataSource
    bands: ColumnDataSource
    figures: list


def build_figures(spec: PlotSpec, recent: dict, history: dict | None, bands: dict, *, frame_width: int = FRAME_WIDTH,
                  frame_height: int = FRAME_HEIGHT) -> Figures:
    """``history=None`` (static plots): no history source and no faint history lines."""
    recent_src = ColumnDataSource(recent, name="gpuprof-recent")
    history_src = ColumnDataSource(history, name="gpuprof-history") if history is not None else None
    band_src = ColumnDataSource(bands, name="gpuprof-bands")
    n_colours = max([s.colour_index for s in spec.series()] + [0]) + 1
    # the legend keys' one point, which draws nothing (_legend_key): one source for them all
    key_src = ColumnDataSource({"x": [math.nan], "y": [math.nan]}, name="gpuprof-legend-keys")
    x_range = DataRange1d(range_padding=0.01)
    figs = []
    for k, panel in enumerate(spec.panels):
        y_range = Range1d(*panel.y_range) if panel.y_range else DataRange1d(range_padding=0.08, **({"start": 0} if panel.zero_based else {}))
        fig = figure(
            title=panel.title, x_range=x_range, y_range=y_range, frame_width=frame_width,
            frame_height=frame_height, tools="xpan,xwheel_zoom,box_zoom,reset,save",
            active_scroll=None, toolbar_location="right" if k == 0 else None,
            x_axis_label="time since start (s)" if k == len(spec.panels) - 1 else None,
            y_axis_label=panel.y_label, name=f"gpuprof-{panel.key}",
        )
        fig.title.text_font_size = "10pt"
        fig.yaxis.axis_label_text_font_size = "8pt"
        fig.min_border_left = 60
        fig.quad(left="left", right="right", bottom=-1e9, top=1e9, source=band_src, fill_color="colour",
                 fill_alpha=0.25, line_alpha=0)
        if k == 0:
            fig.add_layout(LabelSet(x="left", y=frame_height - 14, y_units="screen", text="label", source=band_src,
                                    text_font_size="8pt", x_offset=2))
        items, renderers, drawn = [], [], []
        for s in panel.series:
            colour = device_colour(s.colour_index, n_colours)
            hist = [fig.line("t", s.column, source=history_src, line_color=colour, line_alpha=0.45,
                             line_dash=s.dash, line_width=1)] if history_src is not None else []
            live = fig.line("t", s.column, source=recent_src, line_color=colour, line_dash=s.dash,
                            line_width=1.5, name=s.label)
            if isinstance(y_range, DataRange1d):
                y_range.renderers = [*y_range.renderers, *hist, live]
            items.append(LegendItem(label=s.label, renderers=[_legend_key(fig, key_src, [live, *hist])]))
            renderers.append(live)
            drawn += [live, *hist]
        if k == 0:
            x_range.renderers = drawn
        for y, _label in panel.limit_lines:
            fig.add_layout(Span(location=y, dimension="width", line_color=PALETTE["bad"], line_dash="dashed",
                                line_width=1.5))
        legend = Legend(items=[i for i in items if i.renderers], location="top_left", label_text_font_size="8pt",
                        spacing=0, padding=2, glyph_height=10, glyph_width=14, click_policy="hide")
        if any(panel.limit_lines):
            legend.title = " / ".join(label for _, label in panel.limit_lines)
            legend.title_text_font_size = "8pt"
            legend.title_text_color = PALETTE["bad"]
        fig.add_layout(legend, "right")
        fig.add_tools(HoverTool(renderers=renderers, tooltips=[("", "$name"), ("t", "@t{0.0} s"),
                                                               ("value", "$snap_y{0.0}")], line_policy="nearest"))
        figs.append(fig)
    layout = column(*figs, name="gpuprof-plots") if figs else column(name="gpuprof-plots")
    return Figures(layout, recent_src, history_src, band_src, figs)


# The legend key's visibility, passed on in the page to the lines it stands for, found by id: the
# ids are written in the code, not passed as arguments, so the legend does not reach the lines
# (bokeh_json.fresh_ids renames them in the code with the models, as it does every quoted id).
_SHOW_LINES_JS = ("for (const id of {ids}) {{ const line = cb_obj.document.get_model_by_id(id); "
                  "if (line != null) line.visible = cb_obj.visible }}")


def _legend_key(fig, key_src: ColumnDataSource, lines: list):
    """The legend's swatch and switch for one series: a line that draws nothing, in the live
    line's style, whose visibility ``lines`` (the live and history lines) follow. A legend item naming the
    streamed lines is redrawn after every stream (BokehJS redraws a legend when any model its
    items reach changes): half of what the live view cost the page (benchmarks/README.md,
    "The live view with its page open")."""
    glyph = lines[0].glyph
    # ``key_src``'s one NaN point: BokehJS draws a legend's swatch from the line's first point
    key = fig.line("x", "y", source=key_src, line_color=glyph.line_color, line_dash=glyph.line_dash,
                   line_width=glyph.line_width)
    key.js_on_change("visible", CustomJS(code=_SHOW_LINES_JS.format(ids=json.dumps([line.id for line in lines]))))
    return key
