"""The live plots' data without Bokeh: decimation, gap breaks, batching, 12-hour bound, the
PATCH-DOC texts the sampler process prepares (as Bokeh writes them) and its live view."""

from __future__ import annotations

import math

import numpy as np

from gpuprof_jupyter.core.analysis.decimate import MinMaxHistory, minmax_decimate
from gpuprof_jupyter.core.protocol import Tick
from gpuprof_jupyter.core.store.experiment import ExperimentMeta
from gpuprof_jupyter.core.plots.columns import LiveColumns, band_data
from gpuprof_jupyter.core.plots.spec import plot_spec


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
    model = LiveColumns(spec, t0=0.0, interval=0.1)
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
    model = LiveColumns(spec, t0=0.0, interval=0.1)
    t, reading = 0.0, _tick(0.0).reading  # one reading for all 432,000 ticks: the model's work, not the test's
    for _ in range(12 * 3600 // 60):  # one drain per simulated minute
        for _ in range(600):
            model.push(Tick(mono=t, wall=t, reading=reading))
            t += 0.1
        model.drain()
    history = model.history_data()
    points = model.points_per_series(len(history["t"]))
    assert points <= 5000, points


def _bokeh_patch(change):
    """(source, the PATCH-DOC content Bokeh sends for ``change(source)``)."""
    from bokeh.document import Document
    from bokeh.models import ColumnDataSource
    from bokeh.plotting import figure
    from bokeh.protocol import Protocol

    src = ColumnDataSource({"t": [], "y": [], "name": []})
    fig = figure()
    fig.line("t", "y", source=src)
    doc = Document()
    doc.add_root(fig)
    events = []
    doc.on_change(events.append)
    change(src)
    return src, Protocol().create("PATCH-DOC", events[-1:]).content_json


def test_hand_made_patches_are_the_json_bokeh_sends():
    """The live view's PATCH-DOC messages (core.plots.patch_doc) carry the same content as
    Bokeh's own, for a stream with NaN gap rows and for replacing data with text columns."""
    import json

    from gpuprof_jupyter.core.plots.patch_doc import replace_message, stream_message

    spec = plot_spec(_meta(2))
    model = LiveColumns(spec, t0=0.0, interval=0.1)
    for k in (0, 1, 2, 9, 10):  # a gap between 0.2 and 0.9
        model.push(_tick(k / 10))
    model.add_gaps([[0.25, 0.85]])
    batch = model.drain()
    stream = {"t": batch.data["t"], "y": batch.data[spec.columns[0]], "name": ["NaN-ish", "Infinity", "a", "b", "c", "d"][:batch.rows]}
    src, bokeh = _bokeh_patch(lambda src: src.stream(stream, rollover=1500))
    header, content = stream_message(src.id, stream, 1500)
    assert json.loads(content) == json.loads(bokeh)
    assert '"value":"nan"' in content and json.loads(header)["msgtype"] == "PATCH-DOC"
    new = {"t": [0.0, 1.0, 2.0], "y": [1.0, math.nan, -math.inf], "name": ["x", "NaN", "Infinity"]}
    src, bokeh = _bokeh_patch(lambda src: setattr(src, "data", new))
    assert json.loads(replace_message(src.id, new)[1]) == json.loads(bokeh)


def test_live_document_copies_have_their_own_ids():
    """Each cell's live plots are a copy of one template with ids of their own; the sources a
    patch names are in it, and the closing bundle is a valid one of no plots."""
    import json
    import re

    from gpuprof_jupyter.notebook.live.document import live_document

    spec = plot_spec(_meta(2))
    first, second = live_document(spec), live_document(spec)
    ids = [set(re.findall(r'"id":"([^"]+)"', doc.bundle)) for doc in (first, second)]
    assert ids[0] and not ids[0] & ids[1]
    for doc, declared in zip((first, second), ids):
        bundle = json.loads(doc.bundle)
        [item] = bundle["render_items"]
        assert set(doc.sources.values()) <= declared and item["root_ids"][0] in declared
        assert item["docid"] in bundle["docs_json"] and list(item["roots"].values())[0] in bundle["div"]
        assert json.loads(doc.blank)["docs_json"][item["docid"]]["roots"] == []


def test_ndarray_json_is_bokehs():
    import json

    from bokeh.core.serialization import Serializer

    from gpuprof_jupyter.render.bokeh_json import ndarray_json

    for array in (np.array([1, 2, np.nan], "float32"), np.array([], "float32"), np.arange(5.0)):
        assert json.loads(ndarray_json(array)) == Serializer(deferred=False).encode(array)


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


def test_the_sampler_process_prepares_the_live_views_changes():
    """sampler_process.live_view: rows that came before the kernel named its plots reach the
    page's first stream; then one stream a second, the history when due, the bands when the
    phases change, every text naming the kernel's source ids; header values always."""
    import json

    import pytest

    from gpuprof_jupyter.core.protocol import LiveTarget, Malformed
    from gpuprof_jupyter.sampler_process.live_view import LiveView

    spec = plot_spec(_meta(2))
    view = LiveView(t0=0.0, interval=0.1, expect_target=True)
    rows = [(k / 10, device, values) for k in range(5) for device, values in _tick(k / 10, 2).reading.items()]
    early = view.update(rows, [], [], [], now=0.5)
    assert early.patches == [] and early.rows == {"gpu0": 5, "gpu1": 5, "host": 5}
    assert early.latest["gpu1"]["sm_util"] == 50.0 and early.newest["host"] == pytest.approx(0.4)
    with pytest.raises(Malformed):
        view.attach(LiveTarget("tok", {"recent": "r"}, spec, 100), now=0.6)
    sources = {"recent": "g1recent", "history": "g1history", "bands": "g1bands"}
    view.attach(LiveTarget("tok", sources, spec, 100, history_refresh_s=10.0), now=0.6)
    first = view.update([(0.5, "gpu0", {"sm_util": 70.0})], [], [], [{"name": "fwd", "start_s": 0.1, "end_s": None}],
                        now=0.7)
    streams = [json.loads(content)["events"][0] for _, content in first.patches]
    assert [(e["kind"], e["model"]["id"]) for e in streams] == [("ColumnsStreamed", "g1recent"),
                                                                 ("ColumnDataChanged", "g1bands")]
    t = dict(streams[0]["data"]["entries"])["t"]
    assert t == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5] and streams[0]["rollover"] == 100  # the early rows kept
    assert view.update([(0.6, "gpu0", {"sm_util": 71.0})], [], [], [], now=1.2).patches == []  # within the second
    later = view.update([], [[0.61, 1.5]], [{"rule": "x"}], [], now=11.0)
    kinds = [json.loads(c)["events"][0]["model"]["id"] for _, c in later.patches]
    assert kinds == ["g1recent", "g1history", "g1bands"] and later.gaps == [[0.61, 1.5]] and later.alerts
    assert view.update([], [], [], [], now=11.2) is None  # nothing new, nothing due


def test_every_live_update_a_second_apart_streams_even_when_the_loop_wakes_a_little_early():
    """The process's live loop runs once a second but after the fast lane's next tick, so its
    updates come 0.9-1.1 s apart: each still carries a stream (the page moves every second)."""
    import json

    from gpuprof_jupyter.core.protocol import LiveTarget
    from gpuprof_jupyter.sampler_process.live_view import LiveView

    view = LiveView(0.0, 0.1, True)
    view.attach(LiveTarget("tok", {"recent": "r", "history": "h", "bands": "b"}, plot_spec(_meta(1)), 100), now=0.0)
    streams = 0
    for now in (0.75, 1.69, 2.71, 3.62, 4.70):  # late, early, late, early, late
        update = view.update([(now - 0.05, "gpu0", {"sm_util": 5.0})], [], [], [], now=now)
        streams += sum(json.loads(c)["events"][0]["model"]["id"] == "r" for _, c in update.patches)
    assert streams == 5


def test_a_failing_live_plots_part_leaves_the_header_values():
    from gpuprof_jupyter.core.protocol import LiveTarget
    from gpuprof_jupyter.sampler_process.guards import OptionalParts
    from gpuprof_jupyter.sampler_process.live_view import LiveView

    notes: list[str] = []
    parts = OptionalParts(notes.append)
    view = LiveView(0.0, 0.1, True, parts.call)
    view.attach(LiveTarget("tok", {"recent": "a", "history": "b", "bands": "c"}, plot_spec(_meta(1)), 10), now=0.0)
    view.columns.drain = None  # a bug in preparing the stream
    update = view.update([(0.1, "gpu0", {"sm_util": 5.0})], [], [], [], now=1.0)
    assert update.patches == [] and update.latest == {"gpu0": {"sm_util": 5.0}}
    assert len(notes) == 1 and "the live plots failed" in notes[0] and "the live plots" in parts.off


def test_a_live_view_that_fails_still_sends_the_alerts_fired_and_an_empty_period_still_goes():
    """The period's update carries the alerts judged in it: a view that fails to prepare its
    part must not drop them; and a period with nothing to say still sends an (empty) update,
    the wake-up on which the kernel hands its events over (runtime/link.py)."""
    from types import SimpleNamespace

    from gpuprof_jupyter.core.protocol import LiveUpdate
    from gpuprof_jupyter.sampler_process.main import SamplerProcess
    from gpuprof_jupyter.sampler_process.run import LiveBatch

    sent = []
    process = SamplerProcess(SimpleNamespace(send=sent.append), kernel_pid=0)
    alert = {"rule": "sm_util < 50 for >30% within step"}

    def broken(*args, **kwargs):
        raise RuntimeError("a view that fails")

    run = SimpleNamespace(live_batch=lambda last, final=False: LiveBatch([], [], [alert]),
                          view=SimpleNamespace(update=broken), feed=SimpleNamespace(phases=[]))
    process._send_live(run)
    assert sent == [LiveUpdate(alerts=[alert])]
    quiet = SimpleNamespace(live_batch=lambda last, final=False: LiveBatch([], [], []),
                            view=SimpleNamespace(update=lambda *a, **k: None), feed=SimpleNamespace(phases=[]))
    process._send_live(quiet)
    assert sent[-1] == LiveUpdate()
