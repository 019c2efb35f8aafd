"""Units in rules: ``latency_p99 < 50 ms``, ``gpu_mem_peak_bytes < 20 GiB``, ``sm_util > 60 %``.

Runs in any process (core).

A rule's number may carry a unit where its metric has one: ``ms`` or ``s`` for a time,
``GiB`` or ``MiB`` for bytes, ``%`` for a percentage (or a ``*_frac`` share, divided by 100).
The number is converted to the metric's own unit (seconds, bytes, percent) when the rule is
parsed, so ``50 ms`` and ``0.05`` are the same rule. A unit the metric cannot take is an
error naming the units it can (``requests_per_s > 200 ms``, ``latency_p99 < 50 GiB``).
``%`` after a metric whose unit is not known (a logged ``accuracy``) is accepted as before.

A unit is required where a bare number would be read in a unit the rule does not show: after a
short name (``latency_p99 < 50`` would be 50 s, ``peak_memory < 70`` 70 bytes,
``memory_headroom > 10`` 1000 %: each is refused, naming the unit to write). A bare number
after a ``*_frac`` figure is a share and must lie in 0..1 (``data_wait_frac < 30`` is
refused: write ``30 %``). Names that carry their unit (``duration_s``, ``gpu_mem_peak_bytes``,
``sm_util`` in %) take a bare number in that unit.

The serving figures have short names in rules (``latency_p50`` ... ``latency_max``): the
summary's ``latency_*_s`` (docs/serving.md); so do the memory figures: ``peak_memory`` (the
summary's ``memory.peak_bytes``) and ``memory_headroom`` (``memory.headroom_frac``, docs/memory.md).
"""

from __future__ import annotations

import re

from gpuprof_jupyter.core.metrics import METRICS
from gpuprof_jupyter.core.format import fmt_unit

# unit written -> (quantity, factor to the metric's base unit)
UNITS = {"ms": ("time", 1e-3), "s": ("time", 1.0), "GiB": ("bytes", float(1 << 30)), "MiB": ("bytes", float(1 << 20)),
         "%": ("percent", 1.0)}
UNIT_RE = re.compile(r"\s*(ms|s|GiB|MiB|%)(?![\w/])")
LATENCY_ALIASES = {f"latency_{q}": f"latency_{q}_s" for q in ("p50", "p90", "p95", "p99", "max", "mean")}
# the memory figures' short names (docs/memory.md): the run's peak and what was left of the device
MEMORY_ALIASES = {"peak_memory": "memory_peak_bytes", "memory_headroom": "memory_headroom_frac"}
ALIASES = {**LATENCY_ALIASES, "ttft_p50": "ttft_p50_s", "ttft_p90": "ttft_p90_s", **MEMORY_ALIASES}
_RATES = ("requests_per_s", "samples_per_s", "tokens_per_s", "request_samples_per_s", "steps_per_s")


def quantity(metric: str) -> str | None:
    """What ``metric``'s number is: "time" (seconds), "bytes", "percent", "share" (a ``*_frac``,
    0-1), "none" (a rate, a count: no unit), or None (not known: a logged metric)."""
    if metric in METRICS:
        unit = METRICS[metric].unit
        return {"%": "percent", "B": "bytes"}.get(unit, "none")
    if metric.endswith("_frac"):
        return "share"
    if metric.endswith("_bytes"):
        return "bytes"
    if metric in _RATES or metric.endswith("_per_s") or metric.endswith("_w") or metric.endswith("_kwh"):
        return "none"
    if metric.endswith("_s") or metric in ("duration_s",):
        return "time"
    base = metric.rsplit("_", 1)[0]
    if base in METRICS and METRICS[base].unit == "%":  # sm_util_mean, sm_util_p95
        return "percent"
    return None


def convert(metric: str, value: float, unit: str | None, written: str | None = None) -> float:
    """``value`` written with ``unit`` (None: none) in ``metric``'s own unit; ValueError for a
    unit the metric cannot take (the caller names the rule). ``written``: the name the rule
    used (an alias of ``metric``), for the message."""
    if unit is None:
        return value
    kind = quantity(metric)
    given, factor = UNITS[unit]
    if kind == "share" and unit == "%":
        return value / 100.0
    if kind is None and unit == "%":
        return value  # a logged metric: '%' is the writer's note, as it always was
    if given == kind:
        return value * factor
    allowed = {"time": "ms or s", "bytes": "GiB or MiB", "percent": "%", "share": "% (divided by 100)"}.get(kind)
    can = f"it takes {allowed}" if allowed else "it takes a plain number (no unit)"
    raise ValueError(f"{unit!r} is not a unit of {(written or metric)!r} ({_described(kind)}): {can}")


_TO_WRITE = {"time": "ms or s (e.g. 50 ms)", "bytes": "GiB or MiB (e.g. 70 GiB)", "share": "% (e.g. 10 %)"}


def check_bare(metric: str, value: float, written: str | None = None) -> None:
    """ValueError when ``value``, written without a unit, would be read in a unit the rule does
    not show: after a short name of a time, bytes or share figure, or a share outside 0..1."""
    kind = quantity(metric)
    if written not in (None, metric) and kind in _TO_WRITE:
        raise ValueError(f"{written!r} is {_described(kind)}: write its unit, {_TO_WRITE[kind]}")
    if kind == "share" and not 0 <= value <= 1:
        raise ValueError(f"{(written or metric)!r} is a share from 0 to 1, so {value:g} can never be met as meant: "
                         f"write {fmt_unit(value, '%')} for a percentage")


def _described(kind: str | None) -> str:
    return {"time": "a time in seconds", "bytes": "bytes", "percent": "a percentage", "share": "a share (0 to 1)",
            "none": "a rate or count", None: "a logged value of unknown unit"}[kind]


def metric_needs_requests(metric: str) -> bool:
    """A figure only a run with serving requests has."""
    return metric.startswith(("latency_", "ttft_", "host_p")) or metric in ("requests_per_s", "request_samples_per_s",
                                                                            "tokens_per_s")


__all__ = ["ALIASES", "UNITS", "UNIT_RE", "check_bare", "convert", "metric_needs_requests", "quantity"]
