"""Static rendering of a finished experiment: Bokeh layout, PNG (Agg), display bundle."""

from __future__ import annotations

import time

import numpy as np
import pytest

import gpuprof_jupyter as gp
from gpuprof_jupyter.runtime.session import ProfileSession
from gpuprof_jupyter.render.static_plots import (static_output_bundles, static_plots_layout, static_plots_png,
                                                wide_columns)
from gpuprof_jupyter.core.plots.spec import plot_spec


@pytest.fixture
def experiment(store_dir):
    session = ProfileSession(source="sim:compute-bound:2", store=store_dir, interval=0.02).start()
    with gp.phase("load"):
        time.sleep(0.6)
    time.sleep(0.4)
    return session.stop()


@pytest.mark.process
def test_ending_is_a_png_output_then_plots_and_summary(experiment, artifacts_dir):
    picture, rest = static_output_bundles(experiment)
    assert set(picture) == {"image/png", "text/plain"} and "(simulated)" in picture["text/plain"]
    assert set(rest) == {"text/html", "text/plain"}
    html = rest["text/html"]
    assert "gpuprof-static" in html and "gpuprof-summary" in html
    assert "data:image/png" not in html, "the PNG is stored once, in its own output"
    assert "SIMULATED" in rest["text/plain"]
    png = static_plots_png(experiment)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    (artifacts_dir / "static_plots.png").write_bytes(png)


@pytest.mark.process
def test_columns_are_float32_and_bounded(experiment):
    spec = plot_spec(experiment.meta, list(experiment.meta.units))
    data = wide_columns(experiment, spec, max_points=20)
    assert data["t"].dtype == np.float32 and len(data["t"]) <= 20
    assert all(v.dtype == np.float32 for v in data.values())
    layout = static_plots_layout(experiment)
    assert len(layout.children) == 5


@pytest.mark.process
@pytest.mark.parametrize("gap", [[0.3, 0.5], [0.3, 0.5, "nvml"]], ids=["lane", "per-source"])
def test_gap_recorded_in_meta_breaks_static_line(experiment, gap):
    experiment.meta.gaps = [gap]
    spec = plot_spec(experiment.meta, list(experiment.meta.units))
    data = wide_columns(experiment, spec)
    assert np.isnan(data["sm_util__gpu0"]).any()
    assert static_plots_png(experiment)[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.process
def test_cached_bokeh_item_matches_a_fresh_serialisation(experiment):
    """The static plots' Bokeh JSON comes from a template cached per plot structure; it must
    equal a fresh ``json_item`` of the same figures (up to model ids), with unique ids per output."""
    import json
    import re

    from bokeh.embed import json_item

    from gpuprof_jupyter.render.figures import build_figures
    from gpuprof_jupyter.render.static_plots import _bands, _item_json, _spec

    spec = _spec(experiment)
    data = wide_columns(experiment, spec)
    first, second = _item_json(spec, data, experiment.meta), _item_json(spec, data, experiment.meta)
    fresh = json.dumps(json_item(build_figures(spec, data, None, _bands(experiment.meta)).layout))

    def normal(text):
        ids = {}
        text = re.sub(r'"(id|root_id)": "(\w+)"', lambda m: f'"{m.group(1)}": "{ids.setdefault(m.group(2), len(ids))}"', text)
        # ids quoted inside a string (the legend keys' CustomJS finds its lines by id)
        text = re.sub(r'\\"(\w+)\\"', lambda m: f'\\"{ids[m.group(1)]}\\"' if m.group(1) in ids else m.group(0), text)
        return re.sub(r'"data": "[A-Za-z0-9+/=]+"', '"data": "..."', text)  # (compressed bytes)

    assert normal(first) == normal(fresh)
    assert json.loads(first)["root_id"] != json.loads(second)["root_id"]
    assert len(data["t"]) > 10 and '"dtype": "float32"' in first


def test_lanes_sampled_apart_draw_unbroken_lines_and_gaps_still_break():
    """The host lane and a batched GPU source sample at different times (issue 9): in the wide
    table each series' line joins its own consecutive samples; a recorded gap still breaks it."""
    import numpy as np

    from gpuprof_jupyter.core.analysis.decimate import minmax_decimate_parts

    host_t = np.arange(0.0, 3.0, 0.1)
    gpu_t = np.arange(0.05, 3.0, 0.1)
    union = np.union1d(host_t, gpu_t)

    def parts():
        yield [0], host_t, np.full(len(host_t), 10.0)
        yield [1], gpu_t, np.arange(len(gpu_t), dtype="float64")

    for gaps in ((), ([1.05, 2.05],)):
        t, Y = minmax_decimate_parts(union, parts(), 2, 1500, gaps)
        inside_gpu = (t >= gpu_t[0]) & (t <= gpu_t[-1])
        broken = np.isnan(Y[inside_gpu, 1])
        if not gaps:
            assert not broken.any() and not np.isnan(Y[(t >= 0) & (t <= host_t[-1]), 0]).any()
            # a bridged host-time row lies on the segment between its two GPU neighbours
            row = int(np.flatnonzero(np.isclose(t, 1.0))[0])
            assert Y[row, 1] == pytest.approx(9.5)
        else:
            assert broken.any()  # the gap's break stays
            assert np.isnan(Y[(t > 1.06) & (t < 1.15), 1]).all()  # no segment leaves the sample at the gap start
