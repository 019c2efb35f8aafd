"""Number, time and money formatting for every renderer: the text and HTML summaries, the
comparison, findings, rule results and alerts, the CLI and the report. Units readable, missing
values shown as "n/a".

Runs in any process (core). Below analysis and the views, so a finding's text and a table cell
format a value the same way.
"""

from __future__ import annotations

import math

from gpuprof_jupyter.core.metrics import METRICS


def missing(value) -> bool:
    """None or NaN: shown as "n/a" by every formatter here."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def fmt_pct(value, digits: int = 0) -> str:
    return "n/a" if missing(value) else f"{value:.{digits}f} %"


def fmt_frac(value) -> str:
    """A share (0..1, a float or a Fraction) as a whole percentage: '40 %'."""
    return "n/a" if missing(value) else f"{100 * float(value):.0f} %"


def fmt_bytes(value) -> str:
    if missing(value):
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024


def fmt_watts(value) -> str:
    return "n/a" if missing(value) else f"{value:.0f} W"


def fmt_energy(joules) -> str:
    if missing(joules):
        return "n/a"
    if joules >= 3.6e5:
        return f"{joules / 3.6e6:.3f} kWh"
    if joules >= 1e3:
        return f"{joules / 1e3:.1f} kJ"
    return f"{joules:.0f} J"


def fmt_seconds(value) -> str:
    if missing(value):
        return "n/a"
    if value >= 3600:
        return f"{int(value // 3600)} h {int(value % 3600 // 60):02d} min"
    if value >= 60:
        return f"{int(value // 60)} min {value % 60:04.1f} s"
    if value >= 1:
        return f"{value:.1f} s"
    return f"{value * 1000:.0f} ms"


def fmt_rate(value, unit: str = "/s") -> str:
    return "n/a" if missing(value) else f"{value:,.1f}{unit}"


def fmt_time(seconds) -> str:
    """Seconds down to microseconds: '12 us', '3.40 ms', '1.2 s' (longer: ``fmt_seconds``)."""
    if missing(seconds):
        return "n/a"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return fmt_seconds(seconds)


def fmt_gap(start_s: float, end_s: float, at: bool = True) -> str:
    """A recorded gap as the notes, the live header and the phase band name it:
    'sampler paused 2.1 s at t=3.0 s' (``at=False``: without where)."""
    text = f"sampler paused {end_s - start_s:.1f} s"
    return f"{text} at t={start_s:.1f} s" if at else text


def fmt_cost(value, currency: str = "$") -> str:
    """Money: whole units from 100, cents from 1, four decimals below ('$0.0123')."""
    if missing(value):
        return "n/a"
    if abs(value) >= 100:
        return f"{currency}{value:,.0f}"
    if abs(value) >= 1:
        return f"{currency}{value:,.2f}"
    return f"{currency}{value:.4f}"


def fmt_metric_value(value: float, metric: str) -> str:
    """A rule's threshold or figure for ``metric``: 4 significant digits and the metric's unit
    ('60 %', '2.5e+10 B'); a ``*_frac`` figure as a percentage with one decimal."""
    unit = METRICS[metric].unit if metric in METRICS else ""
    if metric.endswith("_frac"):
        return f"{100 * value:.1f} %"
    if metric.startswith(("latency_", "ttft_")) and metric.endswith("_s"):  # serving times: '50.00 ms'
        return fmt_time(value)
    text = f"{value:.4g}"
    return f"{text} {unit}" if unit and unit not in ("bitmask",) else text


def fmt_value(kind: str, value, currency: str = "$") -> str:
    """A comparison cell by the row's kind (seconds, kwh, cost, pct, frac, watts, bytes, rate,
    joules; else 4 significant digits). Energy here has 3 significant digits, not
    ``fmt_energy``'s scaled units: rows of one table line up."""
    if missing(value):
        return "n/a"
    if kind == "seconds":
        return fmt_seconds(value)
    if kind == "latency":
        return fmt_time(value)
    if kind == "kwh":
        return f"{value:.3g} kWh"
    if kind == "cost":
        return fmt_cost(value, currency)
    if kind == "pct":
        return fmt_pct(value)
    if kind == "frac":
        return fmt_frac(value)
    if kind == "watts":
        return fmt_watts(value)
    if kind == "bytes":
        return fmt_bytes(value)
    if kind == "rate":
        return fmt_rate(value)
    if kind == "joules":
        return f"{value:.3g} J"
    return f"{value:.4g}"
