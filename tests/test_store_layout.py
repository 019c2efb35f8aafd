"""Samples stored one device per row group; analysis reads one device at a time (issue 5, long runs)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpuprof_jupyter.core.analysis.diagnosis import diagnose
from gpuprof_jupyter.core.analysis.rules import evaluate_rules, parse_rules
from gpuprof_jupyter.core.analysis.stats import sample_weights, time_share, weighted_mean, weighted_quantile
from gpuprof_jupyter.core.analysis.summary import summarize
from gpuprof_jupyter.core.store.directory import Store, _DirectoryLoader
from gpuprof_jupyter.core.store.samples_file import (LAYOUT_KEY, PARQUET_NAME, STREAM_NAME, SampleStreamWriter,
                                                SamplesFile, samples_schema, stream_to_parquet)
from gpuprof_jupyter.render.overlay_plots import curves
from gpuprof_jupyter.render.static_plots import static_plots_png, wide_columns, _spec

from tests.simexp import sim_experiment

ROW_GROUP = 100


def _store(store_dir, memory, convert=True):
    """Record ``memory``'s samples through the stream (small batches, ticks interleaved) into a store."""
    store = Store(store_dir)
    meta = copy.deepcopy(memory.meta)
    meta.summary = {}
    directory = store.create(meta)
    samples = memory.samples
    metrics = [c for c in samples.columns if c not in ("t", "wall_time", "device")]
    writer = SampleStreamWriter(directory, samples_schema(metrics))
    for start in range(0, len(samples), 40):
        part = samples.iloc[start:start + 40]
        writer.write({c: part[c].tolist() if c == "device" else part[c].astype(float).tolist()
                      for c in writer.schema.names})
    writer.close()
    if convert:
        stream_to_parquet(directory, writer.schema, row_group_rows=ROW_GROUP)
    meta.status = "ok"
    store.save_meta(meta)
    return store, meta, directory


@pytest.fixture
def memory():
    return sim_experiment("input-bound", gpus=3, seconds=60, gaps=[(20.0, 21.5)])


@pytest.fixture
def no_full_frame(monkeypatch):
    def refuse(self):
        raise AssertionError("internal code loaded Experiment.samples (every device at once)")

    monkeypatch.setattr(_DirectoryLoader, "samples", refuse)


def test_parquet_holds_one_device_per_row_group(store_dir, memory):
    _store_, _meta, directory = _store(store_dir, memory)
    assert not (directory / STREAM_NAME).exists()
    assert not [p for p in directory.iterdir() if p.name.startswith(".samples-split-")]  # temp files gone
    pf = pq.ParquetFile(directory / PARQUET_NAME)
    layout = json.loads(pf.metadata.metadata[LAYOUT_KEY.encode()])
    assert layout["devices"] == ["gpu0", "gpu1", "gpu2", "host"]  # order of first appearance
    device_col = pf.schema_arrow.get_field_index("device")
    seen = []
    for device in layout["devices"]:
        groups = layout["row_groups"][device]
        assert groups == list(range(groups[0], groups[0] + len(groups)))  # contiguous: sorted by device
        sizes = [pf.metadata.row_group(g).num_rows for g in groups]
        assert all(n == ROW_GROUP for n in sizes[:-1]) and 0 < sizes[-1] <= ROW_GROUP
        assert sum(sizes) == layout["rows"][device] == int((memory.samples["device"] == device).sum())
        for g in groups:
            stats = pf.metadata.row_group(g).column(device_col).statistics
            assert stats.min == stats.max == device
            t = pf.read_row_group(g, columns=["t"]).column("t").to_numpy()
            assert np.all(np.diff(t) > 0)
        seen += groups
    assert seen == list(range(pf.metadata.num_row_groups))
    assert layout["present"]["host"] == ["cpu_util"]


def test_summary_reads_per_device_and_equals_full_frame_computation(store_dir, memory, no_full_frame):
    store, meta, directory = _store(store_dir, memory)
    stored = store.load_meta(meta)
    reads = []
    original = SamplesFile.read_device_arrays

    def spy(self, device, columns=None):
        reads.append((device, tuple(columns) if columns is not None else None))
        return original(self, device, columns)

    SamplesFile.read_device_arrays = spy
    try:
        summary = summarize(stored)
    finally:
        SamplesFile.read_device_arrays = original
    assert stored._samples is None  # the long frame was never built
    assert reads and all(cols is not None and len(cols) <= 1 for _dev, cols in reads)  # one column at a time
    assert {dev for dev, _ in reads} == {"gpu0", "gpu1", "gpu2", "host"}

    # the same figures as the old computation on the full long frame (pivot per tick)
    full = memory.samples
    gpus = full[full["device"].str.startswith("gpu")]
    wide = gpus.pivot_table(index="t", columns="device", values="sm_util", aggfunc="mean", dropna=False)
    t = wide.index.to_numpy(dtype="float64")
    mean = wide.mean(axis=1).to_numpy(dtype="float64")
    w = sample_weights(t, meta.interval_s, meta.gaps)
    overall = summary["overall"]
    assert overall["sm_util_mean"] == pytest.approx(weighted_mean(mean, w), rel=1e-12)
    assert overall["sm_util_p95"] == pytest.approx(weighted_quantile(mean, w, 0.95), rel=1e-12)
    assert overall["sm_low_frac"] == pytest.approx(time_share(mean < 50, mean, w), rel=1e-12)
    for key in ("gpu0", "gpu1", "gpu2"):
        frame = full[full["device"] == key]
        wk = sample_weights(frame["t"].to_numpy(), meta.interval_s, meta.gaps)
        assert summary["devices"][key]["sm_util_mean"] == pytest.approx(weighted_mean(frame["sm_util"].to_numpy(), wk), rel=1e-12)
    in_memory = summarize(memory)
    assert json.dumps(summary, sort_keys=True) == json.dumps(in_memory, sort_keys=True) or _close(summary, in_memory)


def _close(a, b) -> bool:
    if isinstance(a, dict):
        return set(a) == set(b) and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-12)
    return a == b


def test_views_and_analysis_never_load_every_sample(store_dir, memory, no_full_frame):
    store, meta, _directory = _store(store_dir, memory)
    stored = store.load_meta(meta)
    spec = _spec(stored)
    data = wide_columns(stored, spec, max_points=200)
    expected = wide_columns(memory, spec, max_points=200)
    assert set(data) == set(expected)
    for name in data:
        np.testing.assert_array_equal(data[name], expected[name])
    assert static_plots_png(stored)[:4] == b"\x89PNG"
    assert [f.id for f in diagnose(stored)] == [f.id for f in diagnose(memory)]
    rules = parse_rules(["sm_util > 50 for 10%", "cpu_util < 90 for 90%", "sm_util_mean > 20"])
    assert [r.to_dict() for r in evaluate_rules(stored, rules)] == [r.to_dict() for r in evaluate_rules(memory, rules)]
    for metric in ("sm_util", "power_w"):
        t1, y1 = curves(stored, metric)
        t2, y2 = curves(memory, metric)
        np.testing.assert_allclose(t1, t2)
        np.testing.assert_allclose(y1, y2, rtol=1e-12, equal_nan=True)
    assert stored._samples is None


def test_samples_property_still_returns_the_long_frame_in_tick_order(store_dir, memory):
    store, meta, _directory = _store(store_dir, memory)
    loaded = store.load_meta(meta).samples
    expected = memory.samples[loaded.columns].reset_index(drop=True)
    assert list(loaded.columns[:3]) == ["t", "wall_time", "device"]
    assert loaded["sm_util"].dtype == np.float64
    assert loaded.reset_index(drop=True).equals(expected)


def test_a_stream_reads_per_device_and_a_parquet_file_not_ours_is_refused(store_dir, memory):
    """A stream (a crashed run) reads per device; a samples.parquet without our layout (ticks
    interleaved: no gpuprof_jupyter release wrote one) is reported as unreadable, not guessed at."""
    store, meta, directory = _store(store_dir, memory, convert=False)
    from_stream = store.load_meta(meta)
    assert from_stream.sample_devices() == ["gpu0", "gpu1", "gpu2", "host"]
    assert _close(summarize(from_stream), summarize(memory))
    table = pa.Table.from_pandas(memory.samples, preserve_index=False)
    pq.write_table(table, directory / PARQUET_NAME, row_group_size=128)
    (directory / STREAM_NAME).unlink()
    with pytest.raises(pa.ArrowInvalid, match="not written by gpuprof_jupyter"):
        SamplesFile(directory).read_device("gpu1", ["sm_util"])
    with pytest.warns(UserWarning, match="unreadable"):
        assert store.load_meta(meta).sample_devices() == []
    assert any("not written by gpuprof_jupyter" in p for p in store.problems)
