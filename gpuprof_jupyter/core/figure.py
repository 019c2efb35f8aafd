"""A figure a person reads: a number, its unit and where it came from (docs/metrics.md,
"Rules that follow").

Runs in any process (core). Below core/format.py, which alone turns a ``Figure`` into text
(``fmt_figure``): renderers build figures and never format bare numbers
(tests/test_figure.py scans render/ for it).

Four provenances, each with the words a reader needs:

* measured: by which source and what it counts ("NVML utilization.gpu", "the allocator",
  "tensor sizes", "/proc of the kernel's process tree", "the step hooks");
* simulated: the simulated GPU made it; it prints with "(simulated)" wherever it surfaces;
* estimated: from what ("a fit over 3 runs", "one run's breakdown"); it prints with its basis;
* unknown: no value, and why; it prints as "n/a", never as 0.

A figure whose value is missing (None, NaN, infinite) is unknown whatever it was built as, so a
missing reading cannot be shown as a measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

MEASURED, SIMULATED, ESTIMATED, UNKNOWN = "measured", "simulated", "estimated", "unknown"
KINDS = (MEASURED, SIMULATED, ESTIMATED, UNKNOWN)

# Every unit a figure may carry, and how core/format.py writes it: a unit names the quantity, so a
# number never prints without one. "count" (steps, GPUs, requests) prints as a plain number.
UNITS = ("%", "share", "change", "pts", "B", "B/s", "W", "J", "kWh", "s", "time", "/s", "samples/s",
         "requests/s", "tokens/s", "steps/s", "count", "offset", "MHz", "degC", "cost", "ratio",
         "logged", "logged change")
# "offset": seconds since the run began, on its clock ('61.0 s', never '1 min 01.0 s': a time axis).
# "logged": a value the user logged (gpuprof_jupyter.log), in the user's own unit, which the
# profiler cannot know; "logged change": a signed difference of two such values.


@dataclass(frozen=True)
class Figure:
    """One figure. ``basis`` says where it came from, in words: the source and what it counts
    (measured), what simulated it (simulated), what it was estimated from (estimated, required)
    or why it is unknown (unknown). ``currency`` is a cost's symbol."""


    value: float | None
    unit: str
    kind: str
    basis: str = ""
    currency: str = "$"
    digits: int | None = None  # decimals of a percentage, share, change or size (None: the formatter's own)

    def __post_init__(self):
        if self.unit not in UNITS:
            raise ValueError(f"figure unit {self.unit!r} is not one of {', '.join(UNITS)}")
        if self.kind not in KINDS:
            raise ValueError(f"figure provenance {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.kind == ESTIMATED and not self.basis:
            raise ValueError("an estimated figure names its basis")
        if _missing(self.value) and self.kind != UNKNOWN:  # a missing reading is unknown, never a measurement
            object.__setattr__(self, "kind", UNKNOWN)
            object.__setattr__(self, "value", None)
        if self.kind == UNKNOWN:
            object.__setattr__(self, "value", None)

    @property
    def known(self) -> bool:
        return self.kind != UNKNOWN

    @property
    def simulated(self) -> bool:
        return self.kind == SIMULATED


def _missing(value) -> bool:
    if value is None:
        return True
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"a figure's value is a number, not {type(value).__name__}")
    return not math.isfinite(float(value))


def measured(value, unit: str, by: str) -> Figure:
    """A reading of ``by`` (the source and what it counts)."""
    return Figure(value, unit, MEASURED, by)


def simulated(value, unit: str, by: str = "the simulated GPU") -> Figure:
    return Figure(value, unit, SIMULATED, by)


def estimated(value, unit: str, basis: str) -> Figure:
    return Figure(value, unit, ESTIMATED, basis)


def unknown(unit: str, why: str = "not measured") -> Figure:
    return Figure(None, unit, UNKNOWN, why)


def cost(value, currency: str, kind: str, basis: str) -> Figure:
    return Figure(value, "cost", kind, basis, currency)


__all__ = ["Figure", "KINDS", "UNITS", "MEASURED", "SIMULATED", "ESTIMATED", "UNKNOWN",
           "measured", "simulated", "estimated", "unknown", "cost"]
