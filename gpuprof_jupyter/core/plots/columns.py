"""Rows into the live plots' columns: batches with a break at each gap, the decimated history,
the bands, and the latest value of each metric for the header.

Runs in the sampler process (``sampler_process/live_view.py``), and in tests and benchmarks.

No Bokeh: the columns are plain lists, named by ``spec.column_name``, for ``patch_doc``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from gpuprof_jupyter.core.analysis.decimate import MinMaxHistory
from gpuprof_jupyter.core.analysis.stats import gap_spans
from gpuprof_jupyter.core.format import fmt_gap
from gpuprof_jupyter.core.metrics import PROCESS_SHARE_METRICS
from gpuprof_jupyter.core.plots.spec import PlotSpec

RECENT_ROWS = 1500  # rows kept at full rate in the browser (rollover)
HISTORY_BUCKETS = 1500  # -> at most 3000 decimated rows: under 5,000 points per series in all
SHARE_HOLD_S = 2.5  # own/other shares come once a second: the header keeps them this long
_SHARES = frozenset(PROCESS_SHARE_METRICS)


@dataclass(frozen=True)
class _GapMark:
    start: float  # seconds since the session start
    end: float


@dataclass
class Batch:
    """Rows to stream: ``{"t": [...], column: [...]}`` (NaN rows mark gaps)."""

    data: dict[str, list]
    rows: int


def _round(values: np.ndarray, digits: int) -> list:
    out = np.round(values, digits)
    return out.tolist()


class LiveColumns:
    """Turns ticks into column batches (recent rows) and keeps the min/max-decimated history.

    ``push(tick)`` and ``add_gaps`` append only; ``drain`` takes what came since its last call.
    """

    def __init__(self, spec: PlotSpec, t0: float, interval: float, recent_rows: int = RECENT_ROWS,
                 history_buckets: int = HISTORY_BUCKETS) -> None:
        self.spec = spec
        self.t0 = t0
        self.recent_rows = recent_rows
        self.series = spec.series()
        self.pending: deque = deque()
        self.history = MinMaxHistory(len(self.series), history_buckets, width_s=max(interval, 0.05))
        self.gaps: list[tuple[float, float]] = []
        self.rows_streamed = 0
        # per device: (metric, column index, scale) of its series; columns grouped by digits
        self._by_device: dict[str, list[tuple[str, int, float]]] = {}
        for j, s in enumerate(self.series):
            self._by_device.setdefault(s.device, []).append((s.metric, j, s.scale))
        self._digit_groups = [(d, [j for j, s in enumerate(self.series) if s.digits == d])
                              for d in sorted({s.digits for s in self.series})]

    def push(self, tick) -> None:
        self.pending.append(tick)

    def add_gaps(self, gaps) -> None:
        """Gaps the sampler process recorded (``[start_s, end_s(, source)]``): the one definition
        (docs/architecture.md); the view never infers one from the spacing of rows."""
        self.pending.extend(_GapMark(start, end) for start, end in gap_spans(gaps))

    def drain(self) -> Batch | None:
        """New rows since the last call as one batch (a NaN row at each recorded gap), or None."""
        pending = self.pending
        items = [pending.popleft() for _ in range(len(pending))]
        if not items:
            return None
        ncols = len(self.series)
        rows: list[tuple[float, bool, dict]] = []  # (t, real, reading)
        for item in items:
            if isinstance(item, _GapMark):
                self.gaps.append((item.start, item.end))
                self.history.mark_gap(item.start)
                rows.append(((item.start + item.end) / 2, False, {}))
            else:
                rows.append((item.mono - self.t0, True, item.reading))
        rows.sort(key=lambda row: row[0])  # a gap is reported with the rows after it
        Y = np.full((len(rows), ncols), math.nan)
        by_device = self._by_device
        for i, (_t, _real, reading) in enumerate(rows):
            row = Y[i]
            for device, values in reading.items():
                for metric, j, scale in by_device.get(device, ()):
                    value = values.get(metric)
                    if value is not None:
                        row[j] = float(value) * scale
        n = len(rows)
        T = np.asarray([row[0] for row in rows])
        real = np.asarray([row[1] for row in rows])
        keep = real & (~np.isnan(Y).all(axis=1) | (ncols == 0))
        self.history.add(T[keep], Y[keep])
        data = {"t": _round(T, 3)}
        columns: list = [None] * ncols
        for digits, idx in self._digit_groups:  # one round and one tolist per group of columns
            for j, values in zip(idx, np.round(Y[:, idx], digits).T.tolist()):
                columns[j] = values
        for s, values in zip(self.series, columns):
            data[s.column] = values
        self.rows_streamed += n
        return Batch(data, n)

    def history_data(self) -> dict[str, list]:
        """The decimated history (everything so far) as columns, float32-rounded lists."""
        T, Y = self.history.points()
        data = {"t": _round(T, 3)}
        for j, s in enumerate(self.series):
            data[s.column] = _round(Y[:, j], s.digits) if len(T) else []
        return data

    def points_per_series(self, history_rows: int) -> int:
        """Points one series has in the browser: recent window (rollover) + history."""
        return min(self.rows_streamed, self.recent_rows) + history_rows


class LatestValues:
    """The newest value of each metric per device, for the header's current values: a device's
    own/other shares (a 1 s source, so most rows lack them) are kept for ``SHARE_HOLD_S`` so
    the header does not flicker."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, float]] = {}
        self._share_t: dict[str, float] = {}  # device -> time of its last own/other share reading

    def add(self, device: str, values: dict, t: float) -> None:
        if not _SHARES.isdisjoint(values):
            self._share_t[device] = t
        elif t - self._share_t.get(device, -math.inf) <= SHARE_HOLD_S:
            previous = self.values.get(device) or {}
            kept = {m: previous[m] for m in PROCESS_SHARE_METRICS if m in previous}
            if kept:
                values = {**values, **kept}
        self.values[device] = values


def band_data(phases, gaps, now_s: float | None) -> dict[str, list]:
    """Labelled bands: phases (open ones end at ``now_s``) and recorded gaps (grey; either
    stored shape, :func:`analysis.stats.gap_spans`)."""
    palette = ["#8dd3c7", "#fdb462", "#bebada", "#fb8072", "#80b1d3", "#b3de69", "#fccde5"]
    left, right, names, colours, labels = [], [], [], [], []
    names_seen: dict[str, int] = {}
    for p in phases:
        start = p["start_s"] if isinstance(p, dict) else p.start_s
        end = p["end_s"] if isinstance(p, dict) else p.end_s
        name = p["name"] if isinstance(p, dict) else p.name
        if end is None:
            end = now_s if now_s is not None else start
        k = names_seen.setdefault(name, len(names_seen))
        left.append(float(start)); right.append(float(end)); names.append(name)
        colours.append(palette[k % len(palette)]); labels.append(name)
    for start, end in gap_spans(gaps):
        left.append(float(start)); right.append(float(end))
        names.append(fmt_gap(start, end, at=False)); colours.append("#9e9e9e")
        labels.append(names[-1] if end - start >= 2.0 else "")  # short gaps: band only, no clutter
    return {"left": left, "right": right, "name": names, "colour": colours, "label": labels}


__all__ = ["LiveColumns", "LatestValues", "Batch", "band_data", "RECENT_ROWS", "HISTORY_BUCKETS"]
