"""Time-weighted statistics over unevenly spaced samples, gaps excluded.

Runs in any process (core).

Each sample stands for the time until the next sample of the same device, however far that
is (a Prometheus source scraped every 15 s gives 15 s samples). A sample followed by a
*recorded* gap (a source's next reading came more than two of its own intervals late,
recorded where it happened: docs/architecture.md) stands for nothing: gaps are excluded and
reported, never counted as zeros, never interpolated, and never inferred from spacing here.
NaN values carry no weight.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np


def gap_spans(gaps) -> list[tuple[float, float]]:
    """Recorded gaps as ``(start_s, end_s)``, whichever shape each is stored in:
    ``[start_s, end_s]`` (the sampling lane) or ``[start_s, end_s, source]``."""
    return [(float(g[0]), float(g[1])) for g in gaps or ()]


def sample_weights(t: np.ndarray, interval: float, gaps=()) -> np.ndarray:
    """Seconds each sample stands for; the last one stands for one interval.

    ``gaps``: the recorded gaps from the experiment metadata (:func:`gap_spans` shapes); the
    sample at a gap's start gets weight 0. Nothing else is excluded, however wide the spacing.
    """
    t = np.asarray(t, dtype="float64")
    if len(t) == 0:
        return np.zeros(0)
    dt = np.diff(t, append=t[-1] + interval)
    for start, _end in gap_spans(gaps):
        dt[np.abs(t - start) < 1e-9] = 0.0
    return np.clip(dt, 0.0, None)


def overlap_weights(t: np.ndarray, weights: np.ndarray, start: float, end: float) -> tuple[slice, np.ndarray]:
    """Seconds of ``[start, end)`` each sample stands for: its own span ``[t, t + weight)`` cut
    to the window (a step, a sliding window). Returns the slice of ``t`` that can overlap (the
    sample in effect at ``start`` included, so a step shorter than the interval still has
    one) and the cut weights of that slice; gaps (weight 0) stay excluded.
    """
    lo = max(int(np.searchsorted(t, start, side="right")) - 1, 0)
    hi = max(int(np.searchsorted(t, end, side="left")), lo)
    inside = t[lo:hi]
    cut = np.minimum(inside + weights[lo:hi], end) - np.maximum(inside, start)
    return slice(lo, hi), np.clip(cut, 0.0, None)


def _valid(values: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ok = ~np.isnan(values) & (weights > 0)
    return values[ok], weights[ok]


def weighted_mean(values: np.ndarray, weights: np.ndarray) -> float:
    v, w = _valid(values, weights)
    return float(np.dot(v, w) / w.sum()) if w.sum() > 0 else float("nan")


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The value below which a share ``q`` of the measured time lies."""
    return weighted_quantiles(values, weights, (q,))[0]


def weighted_quantiles(values: np.ndarray, weights: np.ndarray, qs) -> list[float]:
    """``weighted_quantile`` for several shares ``qs`` at once (one sort)."""
    v, w = _valid(values, weights)
    if w.sum() <= 0:
        return [float("nan")] * len(qs)
    order = np.argsort(v, kind="stable")
    cum = w[order]
    np.cumsum(cum, out=cum)
    return [float(v[order[np.searchsorted(cum, q * cum[-1], side="left").clip(0, len(v) - 1)]]) for q in qs]


def time_share_exact(condition: np.ndarray, values: np.ndarray, weights: np.ndarray) -> Fraction | None:
    """Share of the measured time for which ``condition`` holds, as an exact fraction of
    integer nanoseconds (None when nothing was measured). Float sums of sample spacings
    drift by a few 1e-17: a series above its threshold exactly 80 % of the time must give
    exactly 4/5, so that ``>=80%`` holds and ``>80%`` does not.
    """
    ok = ~np.isnan(values) & (weights > 0)
    ns = np.rint(np.asarray(weights, dtype="float64") * 1e9).astype(np.int64)
    total = int(ns[ok].sum())
    return Fraction(int(ns[ok & condition].sum()), total) if total > 0 else None


def time_share(condition: np.ndarray, values: np.ndarray, weights: np.ndarray) -> float:
    """Share of the measured time (where ``values`` is not NaN) for which ``condition`` holds."""
    share = time_share_exact(condition, values, weights)
    return float("nan") if share is None else float(share)


def measured_time(values: np.ndarray, weights: np.ndarray) -> float:
    return float(weights[~np.isnan(values)].sum())
