"""Static plots of a finished experiment: a Bokeh layout, a PNG (Pillow), one bundle.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

What a profiled cell leaves behind when it ends, and what ``%gpuprofile show`` displays: the
same panels as the live dashboard (one figure builder, ``render.figures``) filled once
with min/max-decimated float32 data (at most ``max_points`` per series, gaps as breaks),
the summary, and a PNG made without a browser so saved notebooks, offline HTML exports,
GitHub's viewer and untrusted notebooks all show a picture (docs/facts.md, "Exported pages").

Reusable by other views (HTML report, comparisons):
``static_plots_layout(experiment)``, ``static_plots_png(experiment)``,
``static_plots_html(experiment)``, ``static_output_bundles(experiment)``, ``show_static_ending``.
"""

from __future__ import annotations

import base64
import json
import re
import uuid

import numpy as np

from gpuprof_jupyter.core.analysis.decimate import minmax_decimate_parts
from gpuprof_jupyter.core.analysis.series import column, union_times
from gpuprof_jupyter.core.plots.columns import band_data
from gpuprof_jupyter.core.plots.spec import FRAME_WIDTH, PlotSpec, plot_spec
from gpuprof_jupyter.render.html import Markup, script_json

MAX_POINTS = 1500


def wide_columns(experiment, spec: PlotSpec, max_points: int = MAX_POINTS) -> dict[str, np.ndarray]:
    """Decimated wide columns (``t`` + one per series), float32, gaps as NaN rows.

    The wide table (every sample time x every series) is never built: each series is read
    alone (one device's one column) and reduced to the shared buckets.
    """
    series = spec.series()
    stored = set(experiment.sample_columns())
    T = union_times(experiment, experiment.sample_devices())  # every sample time, as the long frame had
    if not len(T):
        return {"t": np.empty(0, "float32"), **{s.column: np.empty(0, "float32") for s in series}}

    def parts():
        for j, s in enumerate(series):
            if s.metric in stored:
                frame = experiment.device_columns(s.device, [s.metric])  # numpy: no pandas for the first cell
                yield [j], np.asarray(frame["t"], dtype="float64"), column(frame, s.metric) * s.scale

    Td, Yd = minmax_decimate_parts(T, parts(), len(series), max_points, experiment.meta.gaps or ())
    out = {"t": Td.astype("float32")}
    for j, s in enumerate(series):
        out[s.column] = Yd[:, j].astype("float32")
    return out


def _spec(experiment) -> PlotSpec:
    return plot_spec(experiment.meta, experiment.sample_columns(with_values=True))


def static_plots_layout(experiment, max_points: int = MAX_POINTS, frame_width: int | None = None):
    """A Bokeh layout of the experiment's plots (no history source; data filled once)."""
    from gpuprof_jupyter.render.figures import build_figures

    spec = _spec(experiment)
    data = wide_columns(experiment, spec, max_points)
    return build_figures(spec, data, None, _bands(experiment.meta), frame_width=frame_width or FRAME_WIDTH).layout


def _bands(meta) -> dict:
    return band_data(meta.phases or [], meta.gaps or [], meta.duration_s)


# The Bokeh document of the static plots, serialised once per plot structure (panels, series,
# titles, labels: ``repr(PlotSpec.panels)``) with placeholders where the data go, and kept in
# memory and on disk (``render.bokeh_templates``). Building and serialising ~1,000 Bokeh models
# cost 0.4-0.9 s a cell; filling the template costs ~1 ms. Model ids are made unique per output
# (``render.bokeh_json.fresh_ids``), so several static outputs can share a page.
_PLACEHOLDER = re.compile(r'\["@@gpuprof:([^"@]+)@@"\]')
_BAND_COLUMNS = ("left", "right", "name", "colour", "label")


def _item_template(spec: PlotSpec, columns: tuple, frame_width: int) -> str | None:
    from gpuprof_jupyter.render.bokeh_templates import cached_json

    def build() -> str:
        from bokeh.embed import json_item

        from gpuprof_jupyter.render.figures import build_figures

        data = {c: [f"@@gpuprof:{c}@@"] for c in columns}
        bands = {c: [f"@@gpuprof:band.{c}@@"] for c in _BAND_COLUMNS}
        text = json.dumps(json_item(build_figures(spec, data, None, bands, frame_width=frame_width).layout))
        found = set(_PLACEHOLDER.findall(text))
        return text if found == {*columns, *(f"band.{c}" for c in _BAND_COLUMNS)} else ""  # "": no template

    return cached_json("static", repr((spec.panels, columns, frame_width)), build) or None  # not spec.title


def _item_json(spec: PlotSpec, data: dict, meta, frame_width: int | None = None) -> str:
    """``json.dumps(json_item(layout))`` of the static plots, from the cached template."""
    from gpuprof_jupyter.render.bokeh_json import fresh_ids, ndarray_json

    frame_width = frame_width or FRAME_WIDTH
    bands = _bands(meta)
    template = _item_template(spec, tuple(data), frame_width)
    if template is None:  # Bokeh serialised the placeholders differently: build it in full
        from bokeh.embed import json_item

        from gpuprof_jupyter.render.figures import build_figures

        return json.dumps(json_item(build_figures(spec, data, None, bands, frame_width=frame_width).layout))
    values = {c: ndarray_json(v) for c, v in data.items()}
    values.update((f"band.{c}", json.dumps(v)) for c, v in bands.items())
    return fresh_ids(_PLACEHOLDER.sub(lambda m: values[m.group(1)], template))


def static_plots_png(experiment, max_points: int = MAX_POINTS, dpi: int = 72, *, spec: PlotSpec | None = None,
                     data: dict | None = None) -> bytes:
    """The same panels as a PNG, drawn with Pillow (no browser, no matplotlib): ``render.static_png``."""
    from gpuprof_jupyter.render.static_png import render_png

    spec = spec if spec is not None else _spec(experiment)
    data = data if data is not None else wide_columns(experiment, spec, max_points)
    return render_png(spec, data, experiment.meta, dpi=dpi)


def static_plots_html(experiment, max_points: int = MAX_POINTS, *, spec: PlotSpec | None = None,
                      data: dict | None = None) -> Markup:
    """HTML: the interactive Bokeh plots, drawn once BokehJS is on the page.

    Shown right after the PNG output (``static_output_bundles``). When BokehJS renders the plots,
    the script hides that PNG output (it stays in the notebook). Without BokehJS (a reloaded
    page, an untrusted notebook, nbconvert's HTML, GitHub's viewer) the div stays empty and the
    PNG shows: the picture is stored once, never an empty box.
    """
    spec = spec if spec is not None else _spec(experiment)
    data = data if data is not None else wide_columns(experiment, spec, max_points)
    return embed_item_html(_item_json(spec, data, experiment.meta), hide_png=True)


def embed_item_html(item_json: str, hide_png: bool = False) -> Markup:
    """A Bokeh ``json_item`` (JSON text) drawn once BokehJS is on the page; an empty div
    without it. ``hide_png``: then hide the PNG output just before this one."""
    uid = uuid.uuid4().hex[:12]
    item = script_json(item_json)
    then = ".then(hidePng)" if hide_png else ""
    return Markup(  # trusted: this code's script, a hex uid and the plots' JSON made safe for a script
        f'<div class="gpuprof-static" id="gpuprof-static-{uid}">'
        f'<div class="gpuprof-static-plot" id="gpuprof-plot-{uid}"></div>'
        "<script type=\"text/javascript\">(function(){"
        f"var item={item};var tries=0;"
        "function hidePng(){"  # the PNG output just before this one (JupyterLab, nbconvert, classic)
        f"var box=document.getElementById('gpuprof-static-{uid}');"
        "var out=box&&box.closest('.jp-OutputArea-child,.output_area');var prev=out&&out.previousElementSibling;"
        "if(prev&&prev.querySelector('img')&&!prev.querySelector('.gpuprof-static')){"
        "prev.style.display='none';prev.classList.add('gpuprof-png-replaced');}}"
        "function go(){var B=window.Bokeh;"
        "if(B&&B.embed&&B.embed.embed_item){"
        f"var el=document.getElementById('gpuprof-plot-{uid}');if(!el){{if(tries++<100)setTimeout(go,100);return;}}"
        f"Promise.resolve(B.embed.embed_item(item,'gpuprof-plot-{uid}')){then};"
        "}else if(tries++<150){setTimeout(go,100);}}"
        "go();})();</script></div>"
    )


def png_alt(experiment) -> str:
    meta = experiment.meta
    return f"gpuprof plots of {meta.name}" + (" (simulated)" if meta.simulated else "")


def static_output_bundles(experiment, max_points: int = MAX_POINTS) -> tuple[dict, dict]:
    """Two display bundles, shown one after the other: the PNG, then plots + summary.

    The PNG is its own output (``image/png``, stored once) so every front end shows it, GitHub's
    viewer included; the second output's interactive plots replace it on a page with BokehJS.
    """
    from gpuprof_jupyter.render.summary_html import render_summary_html, render_summary_text

    spec = _spec(experiment)
    data = wide_columns(experiment, spec, max_points)  # once, for both the PNG and the Bokeh plots
    png = static_plots_png(experiment, max_points, spec=spec, data=data)
    picture = {"image/png": base64.b64encode(png).decode("ascii"), "text/plain": f"<{png_alt(experiment)} (PNG)>"}
    rest = {"text/html": str(static_plots_html(experiment, max_points, spec=spec, data=data) + render_summary_html(experiment)),
            "text/plain": render_summary_text(experiment)}
    return picture, rest



__all__ = ["static_plots_layout", "static_plots_png", "static_plots_html", "static_output_bundles",
           "wide_columns", "embed_item_html"]
