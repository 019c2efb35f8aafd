"""The one rule of every finish: a run's data is never replaced by less of it.

Runs in any process (core).

A run can be finished by the sampler process (normal end, a dead kernel), by the kernel (its
sampler process died), by whoever lists a store and finds its writer dead (``core/crashed.py``),
and again by a second of these. Each finisher knows only part of the run: a lister has no
steps, a kernel no stream once someone converted it. So every write of ``steps.parquet``,
``samples.parquet`` and the summary goes through this rule: what is there and holds more
stays, and the finisher's note says what it could not add.
"""

from __future__ import annotations

from pathlib import Path
from gpuprof_jupyter.core.format import fmt_unit


class WouldShrink(ValueError):
    """Writing would replace a data file with one that holds less; nothing was written."""


def parquet_rows(path: Path) -> int | None:
    """Rows of the Parquet file at ``path``, None when there is none or it cannot be read (then
    whatever the finisher has is all there is)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (OSError, pa.ArrowException):
        return None


def refuse_fewer_rows(path: Path, rows: int, *, source: str = "this finish") -> None:
    """WouldShrink when the Parquet file at ``path`` already holds more than ``rows`` rows."""
    have = parquet_rows(path)
    if have is not None and have > rows:
        raise WouldShrink(f"{Path(path).name} holds {have} rows but {source} has {rows}: {Path(path).name} kept")


def summary_extent(summary: dict | None) -> tuple[int, float]:
    """What a summary covers: its steps and the seconds measured on its devices and host."""
    summary = summary or {}
    steps = int((summary.get("steps") or {}).get("count") or 0)
    parts = [*(summary.get("devices") or {}).values(), summary.get("host") or {}]
    seconds = sum(float(p.get("measured_s") or 0.0) for p in parts if isinstance(p, dict))
    return steps, seconds


def fuller_summary(old: dict | None, new: dict, notes: list[str]) -> dict:
    """``new`` unless it covers fewer steps or fewer measured seconds than ``old`` (then ``old``,
    with a note saying why)."""
    (old_steps, old_s), (new_steps, new_s) = summary_extent(old), summary_extent(new)
    if old and (new_steps < old_steps or new_s < old_s - 1e-9):
        notes.append(f"gpuprof: the summary computed now covers {new_steps} steps and {fmt_unit(new_s, 's', 1)} measured, "
                     f"the one saved before {old_steps} steps and {fmt_unit(old_s, 's', 1)}: the saved one kept")
        return old
    return new


__all__ = ["WouldShrink", "fuller_summary", "parquet_rows", "refuse_fewer_rows", "summary_extent"]
