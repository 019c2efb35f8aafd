"""The dashboard's data model without Bokeh: decimation, gap breaks, batching, 12-hour bound."""

from __future__ import annotations

import math

import numpy as np

from gpuprof_jupyter.core.analysis.decimate import MinMaxHistory, minmax_decimate
from gpuprof_jupyter.core.protocol import Tick
from gpuprof_jupyter.core.store.experiment import ExperimentMeta
from gpuprof_jupyter.kernel.views.live.model import DashboardModel, band_data, plot_spec


def _meta(n_gpus=1, provenance="simulated", simulated=True):
    gpus = [{"key": f"gpu{k}", "kind": "gpu", "name": "A100", "index": k, "power_limit_w": 400.0}
            for k in range(n_gpus)]
    devices = gpus + [{"key": "host", "kind": "host", "name": "host"}]
    prov = {g["key"]: {m: provenance for m in ("sm_util", "mem_bw_util", "power_w", "gpu_mem_used_bytes")}
            for g in gpus}
    prov["host"] = {"cpu_util": "psutil.process_tree"}
    units = {m: "" for m in ("sm_util", "mem_bw_util", "power_w", "gpu_mem_used_bytes", "cpu_util")}
    return ExperimentMeta(id="x", name="t", devices=devices, provenance=prov, units=units, simulated=simulated,
                          source="sim" if simulated else "nvml")


def test_decimate_keeps_spike_and_bounds_points():
    t = np.arange(100_000) * 0.01
    y = np.full_like(t, 40.0)
    y[54_321] = 99.0
    y[7_777] = 1.0
    td, yd = minmax_decimate(t, y, 1500)
    assert len(td) <= 1500
    assert np.nanmax(yd) == 99.0 and np.nanmin(yd) == 1.0


def test_decimate_gap_is_a_break():
    t = np.concatenate([np.arange(0, 10, 0.1), np.arange(20, 30, 0.1)])
    y = np.ones_like(t)
    td, yd = minmax_decimate(t, y, 1500, gaps=[[9.9, 20.0]])
    i = np.flatnonzero(np.isnan(yd[:, 0]))
    assert len(i) == 1 and 9.9 < td[i[0]] < 20.0
    td, yd = minmax_decimate(np.arange(0, 1000, 0.01), np.ones(100_000), 300, gaps=[[500.0, 500.5]])
    assert np.isnan(yd).any() and len(td) <= 300


def test_history_spike_survives_12_hours_and_stays_bounded():
    h = MinMaxHistory(columns=2, buckets=1500, width_s=0.1)
    rng = np.random.default_rng(0)
    for start in range(0, 12 * 3600, 600):  # 12 h at 10 Hz in 10-minute batches
        t = start + np.arange(6000) * 0.1
        y = np.column_stack([40 + rng.random(6000), np.full(6000, 5.0)])
        if start == 6 * 3600:
            y[1234, 0] = 100.0
        h.add(t, y)
    T, Y = h.points()
    assert len(T) <= 3000
    assert np.nanmax(Y[:, 0]) == 100.0
    assert np.all(np.diff(T[~np.isnan(T)]) >= 0)


def test_plot_spec_provenance_labels_and_simulated():
    spec = plot_spec(_meta(2, "nvml.utilization.gpu", simulated=False))
    sm = spec.panels[0]
    assert "kernel-active" in sm.y_label and "kernel-active" in sm.title
    assert [s.label for s in sm.series] == ["gpu0", "gpu1"]
    power = next(p for p in spec.panels if p.key == "power")
    assert power.limit_lines and "400" in power.limit_lines[0][1]
    sim = plot_spec(_meta(1))
    assert all("simulated" in p.title for p in sim.panels if p.key != "cpu")
    assert [p.key for p in sim.panels] == ["sm", "bw", "power", "mem", "cpu"]


def _tick(t, n_gpus=1, sm=50.0):
    reading = {f"gpu{k}": {"sm_util": sm, "mem_bw_util": 20.0, "power_w": 200.0, "gpu_mem_used_bytes": 2**30}
               for k in range(n_gpus)}
    reading["host"] = {"cpu_util": 10.0}
    return Tick(mono=t, wall=t, reading=reading)


def test_model_batches_one_wide_table_and_breaks_gaps():
    spec = plot_spec(_meta(8))
    model = DashboardModel(spec, t0=0.0, interval=0.1)
    for i in range(10):
        model.push(_tick(i * 0.1, 8))
    model.push(_tick(3.0, 8))  # 2 s later: the sampler process recorded the gap and says so
    model.add_gaps([[0.9, 3.0]])
    batch = model.drain()
    assert set(batch.data) == {"t", *spec.columns} and len(spec.columns) == 33
    assert batch.rows == 12 and math.isnan(batch.data["sm_util__gpu3"][10])
    assert batch.data["gpu_mem_used_bytes__gpu0"][0] == 1.0  # GiB
    assert model.gaps == [(0.9, 3.0)]
    assert model.drain() is None
    model.push(_tick(6.0, 8))  # rows far apart but no recorded gap: the view infers nothing
    assert model.drain().rows == 1 and model.gaps == [(0.9, 3.0)]
    bands = band_data([{"name": "load", "start_s": 0.0, "end_s": None}], model.gaps, 3.0)
    assert bands["right"][0] == 3.0 and bands["name"][1] == "sampler paused 2.1 s"


def test_points_per_series_after_fast_forwarded_12_hours():
    spec = plot_spec(_meta(1))
    model = DashboardModel(spec, t0=0.0, interval=0.1)
    t = 0.0
    for _ in range(12 * 3600 // 60):  # one drain per simulated minute
        for _ in range(600):
            model.push(_tick(t))
            t += 0.1
        model.drain()
    history = model.history_data()
    points = model.points_per_series(len(history["t"]))
    assert points <= 5000, points


def test_hand_made_stream_patch_is_the_json_bokeh_sends():
    """The dashboard's fast PATCH-DOC for a stream (views.live.dashboard.stream_patch_json)
    carries the same content as Bokeh's own message, NaN gap rows included."""
    import json

    from bokeh.document import Document
    from bokeh.models import ColumnDataSource
    from bokeh.plotting import figure
    from bokeh.protocol import Protocol

    from gpuprof_jupyter.kernel.views.live.dashboard import stream_patch_json

    spec = plot_spec(_meta(2))
    model = DashboardModel(spec, t0=0.0, interval=0.1)
    for k in (0, 1, 2, 9, 10):  # a gap between 0.2 and 0.9
        model.push(_tick(k / 10))
    batch = model.drain()
    src = ColumnDataSource(model.empty_data())
    fig = figure()
    fig.line("t", spec.columns[0], source=src)
    doc = Document()
    doc.add_root(fig)
    events = []
    doc.on_change(events.append)
    src.stream(batch.data, rollover=1500)
    header, content = stream_patch_json(events[-1])
    assert json.loads(content) == json.loads(Protocol().create("PATCH-DOC", events[-1:]).content_json)
    assert '"value":"nan"' in content and json.loads(header)["msgtype"] == "PATCH-DOC"
    src.data = {"t": [1.0], **{c: [1.0] for c in spec.columns}}  # not a stream: Bokeh's own path
    assert stream_patch_json(events[-1]) is None


def test_stream_lists_matches_bokeh_stream():
    """The dashboard's stream (no whole-source re-validation) leaves the same data and sends the
    same event as ``ColumnDataSource.stream``."""
    from bokeh.document import Document
    from bokeh.document.events import ColumnsStreamedEvent
    from bokeh.models import ColumnDataSource
    from bokeh.plotting import figure

    from gpuprof_jupyter.kernel.views.live.dashboard import stream_lists

    results = []
    for use_bokeh in (True, False):
        src = ColumnDataSource({"t": [], "y": []})
        fig = figure()
        fig.line("t", "y", source=src)
        doc = Document()
        doc.add_root(fig)
        events = []
        doc.on_change(events.append)
        for k in range(5):
            batch = {"t": [k * 2.0, k * 2.0 + 1], "y": [float(k), math.nan]}
            (src.stream(batch, rollover=7) if use_bokeh else stream_lists(src, batch, 7))
        assert all(isinstance(e, ColumnsStreamedEvent) and e.rollover == 7 for e in events) and len(events) == 5
        results.append((list(src.data["t"]), [repr(v) for v in src.data["y"]], [e.data["t"] for e in events]))
    assert results[0] == results[1] and len(results[0][0]) == 7


def test_one_series_is_decimated_at_its_own_sample_times():
    """Issue 10 part 6: no fixed 1/4, 3/4 positions for a single series (the overlays)."""
    rng = np.random.default_rng(0)
    t = np.sort(rng.uniform(0, 100, 5000))
    y = np.sin(t) + rng.normal(0, 0.1, len(t))
    y[1234] = 9.0  # a spike
    td, yd = minmax_decimate(t, y, max_points=200)
    assert len(td) <= 200 and np.all(np.diff(td) >= 0)
    assert np.isin(td, t).all()  # every point at a time that was sampled
    assert yd[td == t[1234], 0] == 9.0  # the spike kept, where it happened
