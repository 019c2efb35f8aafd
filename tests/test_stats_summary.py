"""Time-weighted statistics: uneven spacing, gaps excluded (never zeros), multi-GPU rules."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpuprof_jupyter.core.analysis.stats import sample_weights, time_share, weighted_mean, weighted_quantile
from gpuprof_jupyter.core.analysis.summary import summarize
from gpuprof_jupyter.core.store.experiment import Experiment, ExperimentMeta


def test_uneven_spacing_is_time_weighted():
    t = np.array([0.0, 0.1, 0.4])  # the second sample stands for 0.3 s
    w = sample_weights(t, 0.1)
    assert list(w) == pytest.approx([0.1, 0.3, 0.1])
    assert weighted_mean(np.array([10.0, 40.0, 10.0]), w) == pytest.approx((1 + 12 + 1) / 0.5)


def test_gap_is_excluded_not_counted_as_zero():
    t = np.array([0.0, 0.1, 0.2, 3.0, 3.1])
    sm = np.array([80.0, 80.0, 80.0, 80.0, 80.0])
    w = sample_weights(t, 0.1, gaps=[[0.2, 3.0]])
    assert w[2] == 0.0
    assert weighted_mean(sm, w) == pytest.approx(80.0)
    assert time_share(sm < 50, sm, w) == 0.0


def test_wide_spacing_without_a_recorded_gap_is_weighted_fully():
    # a Prometheus-like source scraped every 15 s in a session sampled at 0.1 s: its samples
    # are 15 s apart by design, none is a gap unless one was recorded
    t = np.arange(0.0, 60.0, 15.0)
    sm = np.array([20.0, 80.0, 80.0, 80.0])
    w = sample_weights(t, 0.1)
    assert list(w) == pytest.approx([15.0, 15.0, 15.0, 0.1])
    assert weighted_mean(sm[:3], w[:3]) == pytest.approx(60.0)
    # a recorded gap is still excluded, in either stored shape (with or without its source)
    for gap in ([15.0, 30.0], [15.0, 30.0, "prometheus"]):
        w = sample_weights(t, 0.1, gaps=[gap])
        assert list(w) == pytest.approx([15.0, 0.0, 15.0, 0.1])


def test_gap_shapes_in_summary_decimation_and_bands():
    from gpuprof_jupyter.core.analysis.decimate import minmax_decimate
    from gpuprof_jupyter.core.plots.columns import band_data

    exp = synthetic({"gpu0": [10.0, 10.0, 90.0, 90.0]}, gaps=[(1.0, 2.0, "nvml")])
    summary = summarize(exp)
    assert summary["gaps"] == {"count": 1, "total_s": 1.0}
    assert summary["devices"]["gpu0"]["sm_util_mean"] == pytest.approx((10 + 90 + 90) / 3)
    t, y = minmax_decimate(np.arange(4.0), np.arange(4.0), 100, gaps=[[1.0, 2.0, "nvml"]])
    assert len(t) == 5 and np.isnan(y[2, 0])  # the gap is a break
    bands = band_data([], [[1.0, 4.0, "prometheus"], (5.0, 5.5)], None)
    assert bands["left"] == [1.0, 5.0] and bands["right"] == [4.0, 5.5]


def test_nan_carries_no_weight_and_quantiles():
    values = np.array([np.nan, 10.0, 20.0, 30.0, 40.0])
    w = np.ones(5)
    assert weighted_mean(values, w) == pytest.approx(25.0)
    assert weighted_quantile(values, w, 0.5) == 20.0
    assert weighted_quantile(values, w, 0.95) == 40.0
    assert np.isnan(weighted_mean(np.array([np.nan]), np.ones(1)))


def synthetic(gpu_series: dict[str, list[float]], interval=1.0, gaps=(), power=None, energy=None):
    rows = []
    n = len(next(iter(gpu_series.values())))
    for i in range(n):
        for key, values in gpu_series.items():
            rows.append({"t": float(i), "wall_time": 0.0, "device": key, "sm_util": values[i],
                         "power_w": (power or {}).get(key, [np.nan] * n)[i],
                         "energy_j": (energy or {}).get(key, [np.nan] * n)[i],
                         "gpu_mem_used_bytes": 1e9 * (1 + list(gpu_series).index(key))})
        rows.append({"t": float(i), "wall_time": 0.0, "device": "host", "cpu_util": 50.0})
    meta = ExperimentMeta(id="x", name="x", interval_s=interval, duration_s=float(n), gaps=[list(g) for g in gaps],
                          devices=[{"key": k, "kind": "gpu", "name": "G"} for k in gpu_series]
                          + [{"key": "host", "kind": "host", "name": "h"}])
    return Experiment(meta, samples=pd.DataFrame(rows), steps=None)


def test_across_gpus_utilisation_averaged_power_energy_summed_memory_max():
    exp = synthetic({"gpu0": [100.0, 100.0, 0.0, 0.0], "gpu1": [0.0, 0.0, 0.0, 100.0]},
                    power={"gpu0": [100.0] * 4, "gpu1": [300.0] * 4},
                    energy={"gpu0": [0, 100, 200, 400.0], "gpu1": [0, 300, 600, 1200.0]})
    overall = summarize(exp)["overall"]
    assert overall["sm_util_mean"] == pytest.approx(37.5)
    assert overall["sm_low_frac"] == pytest.approx(0.25)  # per-tick means 50, 50, 0, 50: one of 4 below 50
    assert overall["power_mean_w"] == pytest.approx(400.0)
    assert overall["energy_j"] == pytest.approx(1600.0)
    assert overall["energy_kwh"] == pytest.approx(1600 / 3.6e6)
    assert overall["gpu_mem_peak_bytes"] == pytest.approx(2e9)


def test_summary_gap_accounting():
    exp = synthetic({"gpu0": [10.0, 10.0, 90.0, 90.0]}, gaps=[(1.0, 2.0)])
    summary = summarize(exp)
    assert summary["gaps"] == {"count": 1, "total_s": 1.0}
    # samples at t=0 (1 s), t=2 (1 s), t=3 (1 s): the sample before the gap stands for nothing
    assert summary["devices"]["gpu0"]["sm_util_mean"] == pytest.approx((10 + 90 + 90) / 3)


@pytest.mark.parametrize("step_s, shown", [(0.0003, "300 µs"), (0.00004, "40 µs"), (0.0025, "2 ms"), (0.25, "250 ms")])
def test_step_times_under_a_millisecond_print_in_microseconds(step_s, shown):
    """A 0.3 ms step is "300 µs", never "0 ms"."""
    from gpuprof_jupyter.render.summary_html import render_summary_html, render_summary_text
    from tests.simexp import sim_experiment, steps_frame

    count = 200
    exp = sim_experiment("compute-bound", seconds=3, steps=steps_frame(count, count * step_s, 0.1, start=1.0))
    assert f"step time p50 / p95: {shown} / {shown}" in render_summary_text(exp)
    assert f"{shown} / {shown}" in render_summary_html(exp)
