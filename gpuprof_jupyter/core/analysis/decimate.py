"""Min/max-preserving decimation of wide time series, gaps kept as breaks.

Runs in any process (core).

Plots of long runs cannot ship every sample to the browser, and a plain stride would drop a
spike. Here time is cut into equal buckets and each bucket keeps, per column, its minimum and
maximum in the order they occurred (tsdownsample's MinMax, done on a shared time axis so many
series can live in one wide data source). One series is drawn at the times its extremes were
sampled; several sharing one axis at fixed places in each bucket (1/4 and 3/4 of it), since
their extremes fall at different times. A bucket with no samples, or a
recorded sampler gap, becomes a NaN row: the line breaks rather than joining across time we
did not see (docs/facts.md, "A long C call starves a Python thread").

Two forms:
* ``minmax_decimate(t, Y, max_points, gaps)``: one pass over a finished series;
* ``MinMaxHistory``: an online accumulator with bounded memory for a live run of any
  length (buckets double in width when full, merging pairs, so spikes survive).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from gpuprof_jupyter.core.analysis.stats import gap_spans


def _as_2d(Y) -> np.ndarray:
    Y = np.asarray(Y, dtype="float64")
    return Y.reshape(-1, 1) if Y.ndim == 1 else Y


def _emit(starts, width, mn, mx, tmin, tmax, has, gap_after) -> tuple[np.ndarray, np.ndarray]:
    """Rows for buckets: 2 per bucket with data (min/max in time order), 1 NaN row per empty run."""
    n, ncols = mn.shape
    if n == 0 or not has.any():
        return np.empty(0), np.empty((0, ncols))
    first, last = int(np.argmax(has)), int(n - 1 - np.argmax(has[::-1]))
    ts, rows = [], []
    min_first = np.where(np.isnan(tmax), True, tmin <= tmax)
    a = np.where(min_first, mn, mx)
    b = np.where(min_first, mx, mn)
    if ncols == 1:  # one series: its extremes at the times they were sampled
        middle = starts + width * 0.5  # (a bucket of NaN only: one break row there)
        ta = np.where(np.isnan(tmin[:, 0]), middle, np.where(min_first, tmin, tmax)[:, 0])
        tb = np.where(np.isnan(tmin[:, 0]), middle, np.where(min_first, tmax, tmin)[:, 0])
    else:  # a shared axis for several series: fixed places in the bucket
        ta, tb = starts + width * 0.25, starts + width * 0.75
    prev_empty = False
    for i in range(first, last + 1):
        if not has[i]:
            if not prev_empty:
                ts.append(starts[i] + width * 0.5)
                rows.append(np.full(ncols, np.nan))
            prev_empty = True
            continue
        prev_empty = False
        if ta[i] == tb[i]:  # one sample in the bucket: one point
            ts.append(ta[i])
            rows.append(a[i])
        else:
            ts.extend((ta[i], tb[i]))
            rows.extend((a[i], b[i]))
        if gap_after[i] and i != last:
            ts.append(starts[i] + width)
            rows.append(np.full(ncols, np.nan))
            prev_empty = True
    return np.asarray(ts), np.vstack(rows)


def _bucket_reduce(idx: np.ndarray, t: np.ndarray, Y: np.ndarray, nb: int):
    """Per-bucket min, max and their times for rows assigned to buckets ``idx`` (sorted)."""
    ncols = Y.shape[1]
    mn = np.full((nb, ncols), np.nan)
    mx = np.full((nb, ncols), np.nan)
    tmin = np.full((nb, ncols), np.nan)
    tmax = np.full((nb, ncols), np.nan)
    has = np.zeros(nb, dtype=bool)
    if len(idx) == 0:
        return mn, mx, tmin, tmax, has
    order = np.argsort(idx, kind="stable")
    idx, t, Y = idx[order], t[order], Y[order]
    uniq, starts = np.unique(idx, return_index=True)
    has[uniq] = True
    lo = np.where(np.isnan(Y), np.inf, Y)
    hi = np.where(np.isnan(Y), -np.inf, Y)
    bounds = list(starts) + [len(idx)]
    for k, b in enumerate(uniq):
        s, e = bounds[k], bounds[k + 1]
        seg_lo, seg_hi = lo[s:e], hi[s:e]
        imin, imax = seg_lo.argmin(axis=0), seg_hi.argmax(axis=0)
        cols = np.arange(ncols)
        vmin, vmax = seg_lo[imin, cols], seg_hi[imax, cols]
        valid = np.isfinite(vmin)
        mn[b] = np.where(valid, vmin, np.nan)
        mx[b] = np.where(valid, vmax, np.nan)
        tmin[b] = np.where(valid, t[s:e][imin], np.nan)
        tmax[b] = np.where(valid, t[s:e][imax], np.nan)
    return mn, mx, tmin, tmax, has


def minmax_decimate(
    t: Sequence[float], Y, max_points: int = 1500, gaps: Sequence[Sequence[float]] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """Decimate rows ``(t, Y)`` to at most ``max_points`` rows per column, keeping extremes.

    Args:
        t: sample times (s), ascending.
        Y: values, shape (n,) or (n, columns); NaN = not measured.
        max_points: the most rows returned (NaN break rows included).
        gaps: recorded gaps, ``[start_s, end_s]`` or ``[start_s, end_s, source]``; each becomes
            a NaN row (a break).
    Returns:
        ``(t_out, Y_out)`` float64; when the input already fits, the input with NaN rows
        inserted at gaps.
    """
    t = np.asarray(t, dtype="float64")
    Y = _as_2d(Y)
    gaps = [g for g in gap_spans(gaps) if g[1] > g[0]]
    if len(t) == 0:
        return t, Y
    if len(t) + len(gaps) <= max_points:
        return _insert_gap_rows(t, Y, gaps)
    nb = max(1, (max_points - 1) // 2 - len(gaps) // 2)
    t0, t1 = float(t[0]), float(t[-1])
    width = max((t1 - t0) / nb, 1e-9) * (1 + 1e-9)
    idx = np.minimum(((t - t0) / width).astype(np.int64), nb - 1)
    mn, mx, tmin, tmax, has = _bucket_reduce(idx, t, Y, nb)
    gap_after = np.zeros(nb, dtype=bool)
    for start, _end in gaps:
        gap_after[min(max(int((start - t0) / width), 0), nb - 1)] = True
    ts, rows = _emit(t0 + width * np.arange(nb), width, mn, mx, tmin, tmax, has, gap_after)
    if len(ts) > max_points:  # many gaps and empty runs: drop surplus NaN rows at the end
        ts, rows = ts[:max_points], rows[:max_points]
    return ts, rows


def _bridge_other_rows(column: np.ndarray, t: np.ndarray, tp: np.ndarray, yp: np.ndarray, gaps) -> None:
    """Rows of the wide table that belong to other devices (another lane's times) lie between
    two of this series' own samples: give them the point of the straight segment a line plot
    draws between those two samples, so the line is not broken by rows that are not its own.
    Never across a recorded gap or a NaN sample (a break stays a break), never outside the
    series' own span: nothing is added that the plot of the series alone would not show."""
    if len(tp) < 2:
        return
    k = np.searchsorted(tp, t, side="right") - 1  # this series' sample at or before each row
    inside = (k >= 0) & (k < len(tp) - 1)
    k = np.clip(k, 0, len(tp) - 2)
    left_t, right_t, left_y, right_y = tp[k], tp[k + 1], yp[k], yp[k + 1]
    bridged = inside & (t > left_t) & (t < right_t) & ~np.isnan(left_y) & ~np.isnan(right_y) & np.isnan(column)
    for start, _end in gaps:  # a gap starts at a sample: no segment leaves it
        bridged &= np.abs(left_t - start) > 1e-9
    frac = (t[bridged] - left_t[bridged]) / (right_t[bridged] - left_t[bridged])
    column[bridged] = left_y[bridged] + frac * (right_y[bridged] - left_y[bridged])


def minmax_decimate_parts(
    t: np.ndarray, parts, columns: int, max_points: int = 1500, gaps: Sequence[Sequence[float]] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """``minmax_decimate`` of a wide table that is never built: its columns come a few at a time.

    Args:
        t: the wide table's rows, ascending (e.g. the union of several devices' sample times).
        parts: iterable of ``(column_indices, t_part, Y_part)``: the values of those columns at
            times ``t_part`` (ascending, a subset of ``t``); a column is NaN wherever no part
            gives it a value. Each part is reduced to its buckets and can then be dropped, so
            memory stays at one part plus the buckets however long the series.
        columns: how many columns the wide table has.
    Returns:
        what ``minmax_decimate(t, wide, max_points, gaps)`` returns for that wide table.
    """
    t = np.asarray(t, dtype="float64")
    gaps = [g for g in gap_spans(gaps) if g[1] > g[0]]
    if len(t) + len(gaps) <= max_points:  # small: build the wide table itself
        wide = np.full((len(t), columns), np.nan)
        for cols, tp, Yp in parts:
            tp, Yp = np.asarray(tp, dtype="float64"), _as_2d(Yp)
            rows = np.searchsorted(t, tp)
            wide[np.ix_(rows, np.asarray(cols))] = Yp
            for k, col in enumerate(cols):
                _bridge_other_rows(wide[:, col], t, tp, Yp[:, k], gaps)
        return minmax_decimate(t, wide, max_points, gaps)
    nb = max(1, (max_points - 1) // 2 - len(gaps) // 2)
    t0, t1 = float(t[0]), float(t[-1])
    # lanes sampled apart (the host lane, a batched GPU source) interleave their times: a bucket
    # spans a few rows of the union, so each has every series and lines are not broken
    nb = max(1, min(nb, int((t1 - t0) / (3 * float(np.median(np.diff(t)))))))
    width = max((t1 - t0) / nb, 1e-9) * (1 + 1e-9)
    has = np.zeros(nb, dtype=bool)
    has[np.minimum(((t - t0) / width).astype(np.int64), nb - 1)] = True
    mn, mx = np.full((nb, columns), np.nan), np.full((nb, columns), np.nan)
    tmin, tmax = np.full((nb, columns), np.nan), np.full((nb, columns), np.nan)
    for cols, tp, Yp in parts:
        tp = np.asarray(tp, dtype="float64")
        idx = np.minimum(((tp - t0) / width).astype(np.int64), nb - 1)
        pmn, pmx, ptmin, ptmax, _has = _bucket_reduce(idx, tp, _as_2d(Yp), nb)
        cols = np.asarray(cols)
        mn[:, cols], mx[:, cols], tmin[:, cols], tmax[:, cols] = pmn, pmx, ptmin, ptmax
    gap_after = np.zeros(nb, dtype=bool)
    for start, _end in gaps:
        gap_after[min(max(int((start - t0) / width), 0), nb - 1)] = True
    ts, rows = _emit(t0 + width * np.arange(nb), width, mn, mx, tmin, tmax, has, gap_after)
    if len(ts) > max_points:
        ts, rows = ts[:max_points], rows[:max_points]
    return ts, rows


def _insert_gap_rows(t: np.ndarray, Y: np.ndarray, gaps) -> tuple[np.ndarray, np.ndarray]:
    if not gaps:
        return t, Y
    positions = np.searchsorted(t, [g[0] for g in gaps], side="right")
    gap_t = np.array([(g[0] + g[1]) / 2 for g in gaps])
    return (np.insert(t, positions, gap_t),
            np.insert(Y, positions, np.full((len(gaps), Y.shape[1]), np.nan), axis=0))


class MinMaxHistory:
    """Online min/max decimation with bounded memory: at most ``2 * buckets`` rows out.

    ``add(t, Y)`` takes time-ordered batches; ``mark_gap(start_s)`` breaks the line after
    the bucket holding ``start_s``. When a time falls past the last bucket, bucket width
    doubles and neighbouring buckets merge (min of mins, max of maxes), so a spike is never
    decimated away however long the run.
    """

    def __init__(self, columns: int, buckets: int = 1500, width_s: float = 0.5) -> None:
        if buckets < 2 or buckets % 2:
            raise ValueError("buckets must be an even number >= 2")
        self.columns, self.buckets, self.width = columns, buckets, float(width_s)
        self.t0: float | None = None
        shape = (buckets, columns)
        self.mn, self.mx = np.full(shape, np.nan), np.full(shape, np.nan)
        self.tmin, self.tmax = np.full(shape, np.nan), np.full(shape, np.nan)
        self.has = np.zeros(buckets, dtype=bool)
        self.gap_after = np.zeros(buckets, dtype=bool)
        self.rows_in = 0

    def _coarsen(self) -> None:
        def pair(a, b, pick_a):
            return np.where(pick_a, a, b)

        mn_a, mn_b = self.mn[0::2], self.mn[1::2]
        mx_a, mx_b = self.mx[0::2], self.mx[1::2]
        pick_min = ~(mn_b < mn_a) & ~np.isnan(mn_a)
        pick_max = ~(mx_b > mx_a) & ~np.isnan(mx_a)
        half = self.buckets // 2
        new = {}
        new["mn"] = pair(mn_a, mn_b, pick_min)
        new["tmin"] = pair(self.tmin[0::2], self.tmin[1::2], pick_min)
        new["mx"] = pair(mx_a, mx_b, pick_max)
        new["tmax"] = pair(self.tmax[0::2], self.tmax[1::2], pick_max)
        for name, arr in new.items():
            full = np.full((self.buckets, self.columns), np.nan)
            full[:half] = arr
            setattr(self, name, full)
        has = np.zeros(self.buckets, dtype=bool)
        has[:half] = self.has[0::2] | self.has[1::2]
        gap = np.zeros(self.buckets, dtype=bool)
        gap[:half] = self.gap_after[0::2] | self.gap_after[1::2]
        self.has, self.gap_after = has, gap
        self.width *= 2

    def add(self, t, Y) -> None:
        t = np.asarray(t, dtype="float64")
        if len(t) == 0:
            return
        Y = _as_2d(Y)
        if self.t0 is None:
            self.t0 = float(t[0])
        while (t[-1] - self.t0) / self.width >= self.buckets:
            self._coarsen()
        idx = np.clip(((t - self.t0) / self.width).astype(np.int64), 0, self.buckets - 1)
        mn, mx, tmin, tmax, has = _bucket_reduce(idx, t, Y, self.buckets)
        for b in np.flatnonzero(has):
            self._merge(b, mn[b], mx[b], tmin[b], tmax[b])
        self.rows_in += len(t)

    def _merge(self, b, mn, mx, tmin, tmax) -> None:
        old_mn, old_mx = self.mn[b], self.mx[b]
        take_min = np.isnan(old_mn) | (mn < old_mn)
        take_max = np.isnan(old_mx) | (mx > old_mx)
        self.mn[b] = np.where(take_min & ~np.isnan(mn), mn, old_mn)
        self.tmin[b] = np.where(take_min & ~np.isnan(mn), tmin, self.tmin[b])
        self.mx[b] = np.where(take_max & ~np.isnan(mx), mx, old_mx)
        self.tmax[b] = np.where(take_max & ~np.isnan(mx), tmax, self.tmax[b])
        self.has[b] = True

    def mark_gap(self, start_s: float) -> None:
        if self.t0 is None:
            return
        b = int((start_s - self.t0) / self.width)
        if 0 <= b < self.buckets:
            self.gap_after[b] = True

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """The decimated series so far: ``(t, Y)`` with at most ``2 * buckets`` rows."""
        if self.t0 is None:
            return np.empty(0), np.empty((0, self.columns))
        starts = self.t0 + self.width * np.arange(self.buckets)
        ts, rows = _emit(starts, self.width, self.mn, self.mx, self.tmin, self.tmax, self.has, self.gap_after)
        limit = 2 * self.buckets
        return ts[:limit], rows[:limit]


__all__ = ["minmax_decimate", "minmax_decimate_parts", "MinMaxHistory"]
