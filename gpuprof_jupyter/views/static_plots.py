"""Static plots of a finished experiment: a Bokeh layout, a PNG (matplotlib Agg), one bundle.

What a profiled cell leaves behind when it ends, and what ``%gpuprofile show`` displays: the
same panels as the live dashboard (one figure builder, ``views.live.figures``) filled once
with min/max-decimated float32 data (at most ``max_points`` per series, gaps as breaks),
the summary, and a PNG made without a browser so saved notebooks, offline HTML exports,
GitHub's viewer and untrusted notebooks all show a picture (DESIGN fact 3).

Reusable by other views (HTML report, comparisons):
``static_plots_layout(experiment)``, ``static_plots_png(experiment)``,
``static_plots_html(experiment)``, ``static_output_bundle(experiment)``.
"""

from __future__ import annotations

import base64
import io
import json
import uuid
from html import escape

import numpy as np

from ..analysis.decimate import minmax_decimate
from .live.model import PlotSpec, band_data, plot_spec

MAX_POINTS = 1500


def wide_columns(experiment, spec: PlotSpec, max_points: int = MAX_POINTS) -> dict[str, np.ndarray]:
    """Decimated wide columns (``t`` + one per series), float32, gaps as NaN rows."""
    samples = experiment.samples
    series = spec.series()
    if samples is None or len(samples) == 0:
        return {"t": np.empty(0, "float32"), **{s.column: np.empty(0, "float32") for s in series}}
    t_all = samples["t"].to_numpy(dtype="float64")
    T = np.unique(t_all)
    Y = np.full((len(T), len(series)), np.nan)
    devices = samples["device"].to_numpy()
    for device in {s.device for s in series}:
        mask = devices == device
        idx = np.searchsorted(T, t_all[mask])
        for j, s in enumerate(series):
            if s.device == device and s.metric in samples:
                Y[idx, j] = samples[s.metric].to_numpy(dtype="float64")[mask] * s.scale
    gaps = [g for g in (experiment.meta.gaps or []) if len(g) == 2]
    Td, Yd = minmax_decimate(T, Y, max_points, gaps)
    out = {"t": Td.astype("float32")}
    for j, s in enumerate(series):
        out[s.column] = Yd[:, j].astype("float32")
    return out


def _spec(experiment) -> PlotSpec:
    samples = experiment.samples
    present = [c for c in samples.columns if c not in ("t", "wall_time", "device") and samples[c].notna().any()]
    return plot_spec(experiment.meta, present)


def static_plots_layout(experiment, max_points: int = MAX_POINTS, frame_width: int | None = None):
    """A Bokeh layout of the experiment's plots (no history source; data filled once)."""
    from .live.figures import FRAME_WIDTH, build_figures

    spec = _spec(experiment)
    data = wide_columns(experiment, spec, max_points)
    empty = {k: [] for k in data}
    meta = experiment.meta
    bands = band_data(meta.phases or [], [tuple(g) for g in meta.gaps or []], meta.duration_s)
    return build_figures(spec, data, empty, bands, frame_width=frame_width or FRAME_WIDTH).layout


def static_plots_png(experiment, max_points: int = MAX_POINTS, dpi: int = 72) -> bytes:
    """The same panels as a PNG, drawn by matplotlib's Agg backend (no browser, no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from .live.figures import device_colour

    spec = _spec(experiment)
    data = wide_columns(experiment, spec, max_points)
    panels = spec.panels or []
    n = max(len(panels), 1)
    fig = Figure(figsize=(11, 1.7 * n + 0.8), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
    n_colours = max([s.colour_index for s in spec.series()] + [0]) + 1
    meta = experiment.meta
    for ax, panel in zip(axes, panels):
        for p in meta.phases or []:
            end = p.get("end_s") if p.get("end_s") is not None else meta.duration_s
            ax.axvspan(p["start_s"], end or p["start_s"], color="#8dd3c7", alpha=0.3, lw=0)
        for g in meta.gaps or []:
            ax.axvspan(g[0], g[1], color="#9e9e9e", alpha=0.3, lw=0)
        for s in panel.series:
            ax.plot(data["t"], data[s.column], color=device_colour(s.colour_index, n_colours), lw=1,
                    ls={"solid": "-", "dashed": "--", "dotted": ":"}.get(s.dash, "-"), label=s.label)
        for y, label in panel.limit_lines:
            ax.axhline(y, color="#c62828", ls="--", lw=1, label=label)
        if panel.y_range:
            ax.set_ylim(*panel.y_range)
        elif panel.zero_based:
            ax.set_ylim(bottom=0)
        ax.set_title(panel.title, fontsize=9, loc="left")
        ax.set_ylabel(panel.y_label, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False,
                  ncol=1 if len(panel.series) <= 8 else 2)
    if panels:
        axes[-1].set_xlabel("time since start (s)", fontsize=8)
        top = axes[0]
        for p in meta.phases or []:
            top.text(p["start_s"], 1.0, " " + p["name"], transform=top.get_xaxis_transform(), fontsize=7, va="top")
    title = f"gpuprof: {meta.name} [{meta.status}]"
    if meta.simulated:
        title += "  SIMULATED GPU (not measurements)"
    fig.suptitle(title, fontsize=10, color="#5c4400" if meta.simulated else "black")
    fig.tight_layout(rect=(0, 0, 0.88, 0.97))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def static_plots_html(experiment, max_points: int = MAX_POINTS, png: bytes | None = None) -> str:
    """HTML: the Bokeh plots (rendered once BokehJS is on the page) and the PNG as fallback.

    The PNG shows first; when BokehJS renders the interactive plots, the PNG is hidden (kept
    in the page). Without BokehJS (untrusted notebook, GitHub's viewer) the PNG stays.
    """
    from bokeh.embed import json_item

    uid = uuid.uuid4().hex[:12]
    item = json.dumps(json_item(static_plots_layout(experiment, max_points)))
    png = png if png is not None else static_plots_png(experiment, max_points)
    img = base64.b64encode(png).decode("ascii")
    alt = escape(f"gpuprof plots of {experiment.meta.name}" + (" (simulated)" if experiment.meta.simulated else ""))
    return (
        f'<div class="gpuprof-static" id="gpuprof-static-{uid}">'
        f'<div class="gpuprof-static-plot" id="gpuprof-plot-{uid}"></div>'
        f'<img class="gpuprof-static-png" alt="{alt}" src="data:image/png;base64,{img}" style="max-width:100%"/>'
        "<script type=\"text/javascript\">(function(){"
        f"var item={item};var tries=0;"
        "function go(){var B=window.Bokeh;"
        "if(B&&B.embed&&B.embed.embed_item){"
        f"var el=document.getElementById('gpuprof-plot-{uid}');if(!el){{if(tries++<100)setTimeout(go,100);return;}}"
        f"Promise.resolve(B.embed.embed_item(item,'gpuprof-plot-{uid}')).then(function(){{"
        f"var box=document.getElementById('gpuprof-static-{uid}');var im=box&&box.querySelector('img.gpuprof-static-png');"
        "if(im){im.style.display='none';}});"
        "}else if(tries++<150){setTimeout(go,100);}}"
        "go();})();</script></div>"
    )


def static_output_bundle(experiment, max_points: int = MAX_POINTS) -> dict:
    """Display bundle: text/html (plots + summary + PNG), image/png, text/plain."""
    from .summary_html import render_summary_html, render_summary_text

    png = static_plots_png(experiment, max_points)
    html = static_plots_html(experiment, max_points, png=png) + render_summary_html(experiment)
    return {
        "text/html": html,
        "image/png": base64.b64encode(png).decode("ascii"),
        "text/plain": render_summary_text(experiment),
    }


__all__ = ["static_plots_layout", "static_plots_png", "static_plots_html", "static_output_bundle", "wide_columns"]
