"""Intervals for the serving figures of a comparison: is fp32 -> bf16 a real latency change?

Runs in any process (core).

Each run's steady requests are resampled (``latency.change_interval``); a change whose 95 %
interval holds zero is "same", whatever its size: two runs of a noisy server differ by
chance.
"""

from __future__ import annotations

from gpuprof_jupyter.core.analysis.latency import change_interval

INTERVAL_FIGURES = {"latency_p50_s": "latency_p50_s", "latency_p99_s": "latency_p99_s",
                    "requests_per_s": "requests_per_s"}


def add_change_intervals(rows, experiments, baseline: int) -> None:
    """Fill ``intervals`` of the serving rows (``compare.MetricRow``); a verdict whose interval
    holds zero becomes "same"."""
    wanted = [row for row in rows if row.key in INTERVAL_FIGURES]
    if not wanted:
        return
    columns = [e.request_columns() for e in experiments]
    for row in wanted:
        row.intervals = [None] * len(experiments)
        for i in range(len(experiments)):
            if i == baseline or row.deltas[i] is None:
                continue
            interval = change_interval(columns[baseline], columns[i], INTERVAL_FIGURES[row.key])
            row.intervals[i] = interval
            if interval is not None and interval[0] <= 0 <= interval[1] and row.verdicts[i] is not None:
                row.verdicts[i] = "same"


__all__ = ["add_change_intervals"]
