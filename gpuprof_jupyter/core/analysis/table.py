"""``experiments()``: one row per experiment, the figures people compare.

Runs in any process (core).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from gpuprof_jupyter.core.analysis.summary import summary_of

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = [
    "id", "name", "status", "started_at", "duration_s", "devices", "source", "simulated",
    "sm_util_mean", "sm_util_p50", "sm_util_p95", "sm_low_frac", "mem_bw_util_mean",
    "power_mean_w", "energy_j", "energy_kwh", "gpu_mem_peak_bytes", "cpu_util_mean",
    "samples_per_s", "data_wait_frac",
]


def _num(value):
    return float("nan") if value is None else value


def experiment_row(experiment) -> dict:
    meta = experiment.meta
    summary = summary_of(experiment)
    overall = summary.get("overall", {})
    steps = summary.get("steps", {})
    gpus = [d for d in meta.devices if d.get("kind") == "gpu"]
    row = {
        "id": meta.id,
        "name": meta.name,
        "status": meta.status,
        "started_at": meta.started_at,
        "duration_s": _num(meta.duration_s if meta.duration_s is not None else summary.get("duration_s")),
        "devices": ", ".join(f"{d['key']}: {d['name']}" for d in gpus) or "host only",
        "source": meta.source,
        "simulated": bool(meta.simulated),
    }
    for column in COLUMNS[8:18]:
        row[column] = _num(overall.get(column))
    if math.isnan(row["cpu_util_mean"]):
        row["cpu_util_mean"] = _num(summary.get("host", {}).get("cpu_util_mean"))
    row["samples_per_s"] = _num(steps.get("samples_per_s"))
    row["data_wait_frac"] = _num(steps.get("data_wait_frac"))
    return row


def typed_column(values: list):
    """A column that keeps the values' types where some are missing (None): integers as
    ``Int64`` (``64``, never ``64.0``), bools as ``boolean``, numbers as ``Float64``; mixed
    or text values as objects."""
    import pandas as pd

    present = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    kinds = {bool if isinstance(v, bool) else int if isinstance(v, int) else float if isinstance(v, float)
             else object for v in present}
    dtype = {frozenset({bool}): "boolean", frozenset({int}): "Int64",
             frozenset({float}): "Float64", frozenset({int, float}): "Float64"}.get(frozenset(kinds), "object")
    cleaned = [None if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in values]
    return pd.Series(cleaned, dtype=dtype)


def experiments_frame(experiments) -> "pd.DataFrame":
    """One row per experiment: ``COLUMNS``, then one column per param and per logged metric,
    each typed by ``typed_column`` (an experiment without that param holds <NA>)."""
    import pandas as pd

    rows, params, logged = [], {}, {}  # names, first seen first; a param wins over a logged metric
    for experiment in experiments:
        row = experiment_row(experiment)
        for key, value in experiment.meta.params.items():
            params.setdefault(key, None)
            row[key] = value
        for key, value in experiment.meta.user_metrics.items():
            logged.setdefault(key, None)
            row.setdefault(key, value)
        rows.append(row)
    frame = pd.DataFrame(rows, columns=COLUMNS)
    for key in (k for k in {**params, **logged} if k not in COLUMNS):
        frame[key] = typed_column([row.get(key) for row in rows])
    frame["started_at"] = pd.to_datetime(frame["started_at"], utc=True, errors="coerce")
    return frame
