"""Number formatting shared by every view: units readable, missing values shown as "n/a".

Runs in the kernel; the Jupyter server and the ``gpuprof`` command render it too.
"""

from __future__ import annotations

import math


def missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def fmt_pct(value, digits: int = 0) -> str:
    return "n/a" if missing(value) else f"{value:.{digits}f} %"


def fmt_frac(value) -> str:
    return "n/a" if missing(value) else f"{100 * value:.0f} %"


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
