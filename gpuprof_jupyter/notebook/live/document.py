"""The live plots' Bokeh document as JSON text, and the changes sent to it.

Runs in the kernel.

Building a dashboard's ~1,000 Bokeh models and serialising them cost 0.3-0.6 s a cell, most
of a profiled cell's fixed cost. So the document is built with Bokeh once per plot structure
(panels, series, titles: ``repr(PlotSpec.panels)``) and kept as JSON text (in memory and on
disk: ``render.bokeh_templates``); each cell gets a
copy whose model ids are its own (``fresh_ids``). Changes reach the page as PATCH-DOC texts
the sampler process prepares (``core/plots/patch_doc.py``). The kernel keeps no Bokeh
document: nothing to leak after the cell, and changes made in the page (pan, zoom) stay in
the page.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from gpuprof_jupyter.core.plots.spec import FRAME_WIDTH, PlotSpec
from gpuprof_jupyter.render.bokeh_json import fresh_ids, new_id_prefix


@dataclass(frozen=True)
class LiveTemplate:
    """A jupyter_bokeh render bundle (JSON text) of empty live plots, and what to rename per copy."""

    bundle: str
    doc_id: str
    element_id: str
    sources: dict[str, str]  # role ("recent", "history", "bands") -> model id


def _template(spec: PlotSpec, frame_width: int) -> LiveTemplate:
    from gpuprof_jupyter.render.bokeh_templates import cached_json

    key = repr((spec.panels, frame_width))  # what build_figures draws (not spec.title)
    try:
        return LiveTemplate(**json.loads(cached_json("live", key, lambda: _build_template(spec, frame_width))))
    except (ValueError, TypeError):  # an unreadable cache file: build in memory
        return LiveTemplate(**json.loads(_build_template(spec, frame_width)))


def _build_template(spec: PlotSpec, frame_width: int) -> str:
    from bokeh.core.json_encoder import serialize_json
    from bokeh.document import Document
    from bokeh.embed.elements import div_for_render_item
    from bokeh.embed.util import standalone_docs_json_and_render_items

    from gpuprof_jupyter.render.figures import build_figures
    from gpuprof_jupyter.core.plots.columns import band_data

    empty = {"t": [], **{c: [] for c in spec.columns}}
    figures = build_figures(spec, empty, dict(empty), band_data([], [], None), frame_width=frame_width)
    Document().add_root(figures.layout)
    docs_json, [item] = standalone_docs_json_and_render_items([figures.layout], suppress_callback_warning=True)
    item_json = item.to_json()
    [element_id] = item_json["roots"].values()  # one root: the column of figures
    bundle = serialize_json({"docs_json": docs_json, "render_items": [item_json], "div": div_for_render_item(item)})
    return json.dumps({"bundle": bundle, "doc_id": item.docid, "element_id": element_id,
                       "sources": {"recent": figures.recent.id, "history": figures.history.id, "bands": figures.bands.id}})


@dataclass(frozen=True)
class LiveDocument:
    bundle: str  # jupyter_bokeh's ``render_bundle`` state (its front end parses the text)
    sources: dict[str, str]
    blank: str  # a bundle of no plots, put in place of ``bundle`` before the widget closes


def live_document(spec: PlotSpec, frame_width: int | None = None) -> LiveDocument:
    """Empty live plots for ``spec``, with ids of their own (the template is built once)."""
    template = _template(spec, frame_width or FRAME_WIDTH)
    prefix = new_id_prefix()
    text = fresh_ids(template.bundle, prefix)
    doc_id = str(uuid.uuid4())
    text = text.replace(template.doc_id, doc_id).replace(template.element_id, str(uuid.uuid4()))
    version = re.search(r'"version":"([^"]*)"', text)
    blank = json.dumps({"docs_json": {doc_id: {"version": version.group(1) if version else "", "title": "", "roots": []}},
                        "render_items": [], "div": "<div></div>"})
    return LiveDocument(text, {role: prefix + model_id[1:] for role, model_id in template.sources.items()}, blank)


__all__ = ["live_document", "LiveDocument"]
