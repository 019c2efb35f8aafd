"""``experiments()``: one row per experiment, the figures people compare.

Runs in any process (core).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from gpuprof_jupyter.core.analysis.summary import summary_of
from gpuprof_jupyter.core.format import as_number, missing

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = [
    "id", "name", "status", "started_at", "duration_s", "devices", "source", "simulated",
    "sm_util_mean", "sm_util_p50", "sm_util_p95", "sm_low_frac", "mem_bw_util_mean",
    "power_mean_w", "energy_j", "energy_kwh", "gpu_mem_peak_bytes", "cpu_util_mean",
    "samples_per_s", "data_wait_frac",
    "latency_p50_ms", "latency_p90_ms", "latency_p99_ms", "requests_per_s",  # serving runs (analysis/latency.py)
]


def _figure(value):
    """A figure for a DataFrame cell: missing (None, NaN, infinite, not a number) as NaN."""
    number = as_number(value)
    return float("nan") if number is None else number


def experiment_row(experiment) -> dict:
    meta = experiment.meta
    summary = summary_of(experiment)
    overall = summary.get("overall", {})
    steps = summary.get("steps", {})
    gpus = meta.gpu_devices
    row = {
        "id": meta.id,
        "name": meta.name,
        "status": meta.status,
        "started_at": meta.started_at,
        "duration_s": _figure(meta.duration_s if meta.duration_s is not None else summary.get("duration_s")),
        "devices": ", ".join(f"{d['key']}: {d['name']}" for d in gpus) or "host only",
        "source": meta.source,
        "simulated": bool(meta.simulated),
    }
    for column in COLUMNS[8:18]:
        row[column] = _figure(overall.get(column))
    if math.isnan(row["cpu_util_mean"]):
        row["cpu_util_mean"] = _figure(summary.get("host", {}).get("cpu_util_mean"))
    row["samples_per_s"] = _figure(steps.get("samples_per_s"))
    row["data_wait_frac"] = _figure(steps.get("data_wait_frac"))
    requests = summary.get("requests") or {}
    for q in ("p50", "p90", "p99"):
        seconds = as_number(requests.get(f"latency_{q}_s"))
        row[f"latency_{q}_ms"] = _figure(None if seconds is None else seconds * 1000)
    row["requests_per_s"] = _figure(requests.get("requests_per_s"))
    return row


def typed_column(values: list):
    """A column that keeps the values' types where some are missing (None): integers as
    ``Int64`` (``64``, never ``64.0``), bools as ``boolean``, numbers as ``Float64``; mixed
    or text values as objects."""
    import pandas as pd

    present = [v for v in values if not missing(v)]
    kinds = {bool if isinstance(v, bool) else int if isinstance(v, int) else float if isinstance(v, float)
             else object for v in present}
    dtype = {frozenset({bool}): "boolean", frozenset({int}): "Int64",
             frozenset({float}): "Float64", frozenset({int, float}): "Float64"}.get(frozenset(kinds), "object")
    cleaned = [None if missing(v) else v for v in values]
    return pd.Series(cleaned, dtype=dtype)


def listing_row(experiment) -> dict:
    """``experiment_row`` plus the experiment's ``params`` and ``user_metrics`` (as mappings):
    what the store's listing keeps per experiment (``core/listing.py``)."""
    job = experiment.meta.context.get("job") or {}
    return {**experiment_row(experiment), "params": dict(experiment.meta.params),
            "user_metrics": dict(experiment.meta.user_metrics),
            # a part of a multi-node job (core/job.py): ``gpuprof list`` shows the job as one row
            **({"job": job["key"], "job_part": job.get("part"), "job_parts": job.get("parts"),
                "job_host": job.get("host")} if isinstance(job.get("key"), str) else {})}


def extra_columns(rows: list[dict]) -> list[str]:
    """The columns after ``COLUMNS``: one per param and per logged metric, first seen first."""
    extra: dict[str, None] = {}
    for row in rows:
        extra.update(dict.fromkeys(row.get("params", ())))
        extra.update(dict.fromkeys(row.get("user_metrics", ())))
    return [k for k in extra if k not in COLUMNS]


def flat_record(row: dict) -> dict:
    """One listing row as a flat record: its params and logged metrics as columns of their own
    (a param wins over a logged metric of the same name)."""
    record = {k: v for k, v in row.items() if k not in ("params", "user_metrics")}
    record.update(row.get("params", {}))
    for key, value in row.get("user_metrics", {}).items():
        record.setdefault(key, value)
    return record


def frame_of_rows(rows: list[dict]) -> "pd.DataFrame":
    """One row per listing row: ``COLUMNS``, then one column per param and per logged metric,
    each typed by ``typed_column`` (an experiment without that param holds <NA>)."""
    import pandas as pd

    extra, records = extra_columns(rows), [flat_record(row) for row in rows]
    columns = {c: [record.get(c) for record in records] for c in COLUMNS}  # column-wise: fast for 10,000 rows
    columns.update((key, typed_column([record.get(key) for record in records])) for key in extra)
    frame = pd.DataFrame(columns)
    for c in COLUMNS[8:]:  # the figures: floats, NaN when missing (as from the summary)
        frame[c] = frame[c].astype("float64")
    frame["started_at"] = pd.to_datetime(frame["started_at"], utc=True, errors="coerce", format="ISO8601")
    return frame

