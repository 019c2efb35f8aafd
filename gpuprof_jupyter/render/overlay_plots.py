"""Several experiments' curves overlaid, aligned at their start: Bokeh figures.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

Used by the comparison (``compare()``) and the HTML report. Bokeh is the interactive back
end, as everywhere else; each experiment keeps its own sample times (one data source each),
decimated by the plots' one reducer (``analysis.decimate``: extremes kept, gaps as breaks).
A figure with no reading in any run (host-only runs have no ``sm_util`` or power) says "no
data" and why, in its title and inside the frame.
"""

from __future__ import annotations

import numpy as np

from gpuprof_jupyter.core.analysis.decimate import minmax_decimate
from gpuprof_jupyter.core.analysis.series import metric_over_time
from gpuprof_jupyter.core.plots.spec import device_colour
from gpuprof_jupyter.render.html import Markup, html

OVERLAYS = (("sm_util", "mean", "sm_util, aligned at start", "%"),
            ("power_w", "sum", "power (all GPUs), aligned at start", "W"))


def curves(experiment, metric: str, max_points: int = 1500, how: str = "mean") -> tuple[np.ndarray, np.ndarray]:
    """(t since start, value) of ``metric`` across the GPUs (``how``), min/max-decimated."""
    if not experiment.meta.gpu_devices:
        return np.zeros(0), np.zeros(0)
    t, y = metric_over_time(experiment, metric, how)
    if not len(t):
        return t, y
    t, Y = minmax_decimate(t, y, max_points, experiment.meta.gaps or ())
    return t, Y[:, 0]


def overlay_figures(experiments, max_points: int = 1500):
    """One Bokeh figure per overlaid metric, one line per experiment (legend click hides it)."""
    from bokeh.models import ColumnDataSource, Label
    from bokeh.plotting import figure

    figs = []
    for metric, how, title, unit in OVERLAYS:
        fig = figure(height=220, sizing_mode="stretch_width", title=title, x_axis_label="time since start (s)",
                     y_axis_label=unit, tools="pan,xwheel_zoom,box_zoom,reset,save")
        fig.name = f"gpuprof-overlay-{metric}"
        drawn = 0
        for k, e in enumerate(experiments):
            t, y = curves(e, metric, max_points, how)
            drawn += len(t)
            source = ColumnDataSource({"t": t.astype("float32"), "y": y.astype("float32")})
            fig.line("t", "y", source=source, color=device_colour(k, len(experiments)), line_width=1.5,
                     legend_label=f"{k + 1}. {e.name}")
        if fig.legend:
            fig.legend.location = "top_right"
            fig.legend.click_policy = "hide"
        if not drawn:  # an empty frame is never left to read as a flat zero
            why = ("no run here read a GPU" if not any(e.meta.gpu_devices for e in experiments)
                   else f"no {metric} reading in these runs")
            fig.title.text = f"{title}: no data ({why})"
            fig.add_layout(Label(x=10, y=80, x_units="screen", y_units="screen", text=f"no data: {why}",
                                 text_color="#757575"))
        figs.append(fig)
    return figs


def overlay_html(experiments, max_points: int = 400) -> Markup:
    """The overlay as static Bokeh output (a div and its script), rendered wherever BokehJS is
    on the page: the notebook (the extension loads it), nbconvert exports (docs/facts.md,
    "Exported pages")."""
    from bokeh.embed import components
    from bokeh.layouts import column

    script, div = components(column(*overlay_figures(experiments, max_points), sizing_mode="stretch_width"))
    return html("<div class='gpuprof-overlay'>{}{}</div>", Markup(div), Markup(script))  # Bokeh's own output


__all__ = ["curves", "overlay_figures", "overlay_html"]
