"""Intervals for the serving figures of a comparison: is fp32 -> bf16 a real latency change?

Runs in any process (core).

Each run's steady requests are resampled (``latency.change_interval``); a change whose 95 %
interval holds zero is "same", whatever its size: two runs of a noisy server differ by
chance.
"""

from __future__ import annotations

from gpuprof_jupyter.core.analysis.latency import change_interval
from gpuprof_jupyter.core.format import fmt_change, fmt_time

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


def serving_effect(rows, baseline: int, index: int) -> list[str]:
    """``latency p50 10.00 ms->75.00 ms (+650 %, 95 % interval +64.10 ms to +66.00 ms)`` and the like
    for the serving rows (``compare.MetricRow``) of run ``index`` against the baseline: the
    evidence an exported serving setting carries."""
    parts = []
    for row in rows:
        if row.key not in EFFECT_WORDS or row.values[index] is None or row.values[baseline] is None:
            continue
        fmt = fmt_time if row.key.startswith("latency_") else (lambda v: f"{v:,.1f}")
        text = f"{EFFECT_WORDS[row.key]} {fmt(row.values[baseline])}->{fmt(row.values[index])}"
        if row.rel[index] is not None:
            text += f" ({fmt_change(row.rel[index])}"
            interval = row.intervals[index] if row.intervals else None
            if interval is not None:
                text += ", 95 % interval " + " to ".join(("+" if v >= 0 else "-") + fmt(abs(v)) for v in interval)
            text += ")"
        parts.append(text)
    return parts


EFFECT_WORDS = {"latency_p50_s": "latency p50", "latency_p99_s": "latency p99", "requests_per_s": "requests/s",
                "request_samples_per_s": "samples/s", "tokens_per_s": "tokens/s"}

__all__ = ["add_change_intervals", "serving_effect"]
