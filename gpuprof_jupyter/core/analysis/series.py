"""Per-tick series across devices, built one device at a time.

Runs in any process (core).

Analysis never loads every sample of every device at once (``Experiment.samples``): it asks
for one device's few columns (``Experiment.device_columns``: numpy, no pandas) and aligns the devices on their
sample times here. The statistics themselves stay in ``analysis.stats``.
"""

from __future__ import annotations

import numpy as np


def column(frame, name: str) -> np.ndarray:
    """``frame[name]`` as float64, all NaN when the column is not there."""
    if name in frame:
        return np.asarray(frame[name], dtype="float64")
    return np.full(len(frame), np.nan)


def _increasing(t: np.ndarray) -> bool:
    return len(t) < 2 or bool((t[1:] > t[:-1]).all())


def _per_unique_t(t: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows sharing a time averaged (NaN ignored), as a pivot table's ``mean`` would."""
    if _increasing(t):
        return t, values
    tu, inverse = np.unique(t, return_inverse=True)
    ok = ~np.isnan(values)
    sums = np.bincount(inverse, weights=np.where(ok, values, 0.0), minlength=len(tu))
    counts = np.bincount(inverse, weights=ok, minlength=len(tu))
    with np.errstate(invalid="ignore", divide="ignore"):
        return tu, np.where(counts > 0, sums / counts, np.nan)


def union_times(experiment, keys) -> np.ndarray:
    """Sorted union of the sample times of ``keys`` (each device's ``t`` read alone)."""
    T = None
    for key in keys:
        t = np.asarray(experiment.device_columns(key, [])["t"], dtype="float64")
        if not len(t):
            continue
        if T is None:
            T = t if _increasing(t) else np.unique(t)
        elif len(t) != len(T) or not np.array_equal(t, T):
            T = np.union1d(T, t)
    return np.zeros(0) if T is None else T


def across_devices(experiment, keys, metric: str, how: str = "mean",
                   times: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(t, value)`` per tick across devices ``keys``: ``how`` = "mean" | "max" | "sum" of the
    devices measured at that tick (NaN where none was). ``t`` is the union of the devices'
    sample times (``times`` if already known). Memory: a few arrays of that length, plus one
    device's ``t`` and ``metric`` at a time.
    """
    T = union_times(experiment, keys) if times is None else times
    acc = np.full(len(T), np.nan) if how == "max" else np.zeros(len(T))
    count = None if how == "max" else np.zeros(len(T))
    for key in keys:
        frame = experiment.device_columns(key, [metric])
        if not len(frame) or metric not in frame:
            continue
        t, values = _per_unique_t(np.asarray(frame["t"], dtype="float64"), np.asarray(frame[metric], dtype="float64"))
        del frame
        if len(t) == len(T) and np.array_equal(t, T):  # the usual case: every device at every tick
            target_acc, target_count, idx = acc, count, None
        else:
            idx = np.searchsorted(T, t)
            target_acc = acc[idx]
            target_count = None if count is None else count[idx]
        ok = ~np.isnan(values)
        if how == "max":
            np.fmax(target_acc, values, out=target_acc)
        else:
            np.add(target_acc, values, out=target_acc, where=ok)
            np.add(target_count, ok, out=target_count)
        if idx is not None:
            acc[idx] = target_acc
            if count is not None:
                count[idx] = target_count
    if how == "max":
        return T, acc
    result = acc
    if how == "mean":
        np.divide(acc, count, out=result, where=count > 0)
    result[count == 0] = np.nan
    return T, result


def metric_over_time(experiment, metric: str, how: str = "mean", gpus: list[str] | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """``(t, value)`` of a sampled metric: the host's own series for a host metric, else the
    GPUs (``gpus``: these only; default all) combined per tick (``how``: "mean" for
    utilisations, "sum" for power). Empty when the metric was not stored."""
    from gpuprof_jupyter.core.metrics import METRICS

    if metric not in experiment.sample_columns():  # one device's column read at a time below
        return np.zeros(0), np.zeros(0)
    if (METRICS[metric].scope if metric in METRICS else "gpu") == "host":
        frame = experiment.device_columns("host", [metric])
        return np.asarray(frame["t"], dtype="float64"), column(frame, metric)
    return across_devices(experiment, gpus or [d["key"] for d in experiment.meta.gpu_devices], metric, how)


__all__ = ["column", "union_times", "across_devices", "metric_over_time"]
