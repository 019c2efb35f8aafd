"""Numbers and values, one way each: JSON-safe conversion, coercion, and every formatter (percent,
signed change, bytes, rate, time, energy, money, a setting's value, a missing value) that the
summaries, the comparison, findings, rules, alerts, the tune table, the CLI, the report, the
server's JSON and pipeline.yaml's comments use.

Runs in any process (core). Below analysis and the views, so a finding's text and a table cell
format a value the same way.

Missing values, one rule: None, NaN and the infinities are *missing*. A formatter prints a
missing figure as ``MISSING`` ("n/a"); ``json_safe`` writes it as ``null`` (JSON has neither
NaN nor infinity); ``as_number`` returns None for it. A setting a run did not record at all is
``NOT_RECORDED`` and prints as "not recorded". The JupyterLab extension's formatters
(``labextension/src/format.ts``) print the same text: ``tests/format_cases.json`` holds the
cases both are tested against.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

from gpuprof_jupyter.core.figure import ESTIMATED, SIMULATED, Figure
from gpuprof_jupyter.core.metrics import METRICS

GIB = 1024 ** 3  # bytes in a GiB
MISSING = "n/a"  # a figure that was not measured (None, NaN, infinite)


class _NotRecorded:
    """The value of a setting a run did not record (not None: None is a value a run can record)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NOT_RECORDED"

    def __reduce__(self):
        return "NOT_RECORDED"


NOT_RECORDED = _NotRecorded()
NOT_RECORDED_TEXT = "not recorded"


def missing(value) -> bool:
    """None, NaN or an infinity (Python or numpy floats): shown as "n/a" by every formatter here."""
    if value is None:
        return True
    if type(value) is float:  # the common case, without the abstract classes' checks
        return not math.isfinite(value)
    if type(value) is int:
        return False
    try:
        return isinstance(value, Real) and not isinstance(value, Integral) and not math.isfinite(value)
    except (TypeError, ValueError, OverflowError):
        return False


def as_number(value):
    """A real number as itself (an int stays an int, numpy scalars become Python's); None for a
    missing value (None, NaN, infinite), a bool, text or anything else."""
    if type(value) is float:
        return value if math.isfinite(value) else None
    if type(value) is int:
        return value
    if isinstance(value, bool) or not isinstance(value, Real):
        return None
    if isinstance(value, Integral):
        return int(value)
    value = float(value)
    return value if math.isfinite(value) else None


def as_float(value) -> float | None:
    """``as_number`` after ``float()`` (text such as "3.5" reads too): None when it is not a finite number."""
    if isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def json_safe(obj):
    """``obj`` as plain JSON data: mappings (keys as text), lists (tuples too), text, bools,
    ints and finite floats; numpy scalars unwrapped; missing numbers (NaN, infinite, pandas' NA)
    as None; anything else as its ``str``."""
    if type(obj).__module__ == "numpy":
        obj = obj.tolist()  # a scalar becomes Python's bool, int or float; an array a list
    if obj is None or isinstance(obj, (str, bool)):
        return obj
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, Real):
        return as_number(obj)
    if type(obj).__name__ in ("NAType", "NaTType"):  # pandas' missing values
        return None
    return str(obj)


def finite_or_none(values) -> list:
    """A list of floats with each missing one (NaN, infinite) as None: what Bokeh draws as a break."""
    return [None if (v != v or v in (math.inf, -math.inf)) else v for v in values]


def fmt_number(value, digits: int = 1) -> str:
    """A plain number with ``digits`` decimals ('3.1'); "n/a" when missing or not a number."""
    number = as_number(value)
    return MISSING if number is None else f"{number:.{digits}f}"


def fmt_pct(value, digits: int = 0) -> str:
    """A percentage figure (0..100): '40 %'."""
    return MISSING if missing(value) else f"{value:.{digits}f} %"


def fmt_frac(value, digits: int = 0) -> str:
    """A share (0..1, a float or a Fraction) as a percentage: '40 %'."""
    return MISSING if missing(value) else f"{100 * float(value):.{digits}f} %"


def _signed(value: float, digits: int) -> str:
    """``value`` with its sign; one that rounds to zero is '+0', never '-0'."""
    text = f"{value:+.{digits}f}"
    return "+" + text[1:] if float(text) == 0 else text


def fmt_change(rel, digits: int = 0) -> str:
    """A relative change (0.25 = a quarter more) as a signed percentage: '+25 %', '-3.5 %' ('+0 %'
    for a change that rounds to nothing, never '-0 %')."""
    return MISSING if missing(rel) else f"{_signed(100 * rel, digits)} %"


def fmt_points(delta, digits: int = 1) -> str:
    """A change between two percentages, in percentage points: '+12.5 pts'."""
    return MISSING if missing(delta) else f"{_signed(delta, digits)} pts"


def fmt_setting(value) -> str:
    """A setting's value as every view writes it (comparison, report, tune table, pipeline.yaml's
    comments): booleans 'true'/'false' and None 'null' as in the YAML file the settings are kept
    in, a setting the run did not record 'not recorded', anything else its ``str``."""
    if value is NOT_RECORDED:
        return NOT_RECORDED_TEXT
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)


def fmt_unit(value, unit: str, digits: int | None = None, significant: int | None = None) -> str:
    """A number in a fixed unit, never scaled: as written (``{:g}``), with ``digits`` decimals, or
    with ``significant`` digits: a setting, limit or threshold as a person gives it ('0.5 s',
    '90 %', '64 MiB', '10 min'), a clock's reading in seconds ('t=12.30 s'), a short time beside
    a setting in seconds ('0.0101 s'). A run's figure that may be large or small goes through the
    scaled formatters below, or ``fmt_figure``."""
    if missing(value):
        return MISSING
    spec = f".{digits}f" if digits is not None else f".{significant}g" if significant is not None else "g"
    return f"{value:{spec}} {unit}"


def fmt_gib(value, digits: int = 1) -> str:
    """Bytes as a number of GiB without the unit ('14.5'): for 'used/total GiB' pairs."""
    return MISSING if missing(value) else f"{value / GIB:.{digits}f}"


def fmt_memory(used, total) -> str:
    """GPU memory as the status bar and the live header show it: '14.5/40.0 GiB'."""
    return f"{fmt_gib(used)}/{fmt_gib(total)} GiB"


def fmt_idle(seconds) -> str:
    """A length of time in whole minutes, as the status bar says "GPU idle 14 min": '45 s' under
    a minute, '2 h 05 min' from an hour (the extension's format.ts ``idle`` prints the same)."""
    if missing(seconds):
        return MISSING
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def fmt_bytes(value, digits: int = 1) -> str:
    """Bytes in binary units: '512 B', '1.5 GiB' (``digits`` decimals above a KiB)."""
    if missing(value):
        return MISSING
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.{digits}f} {unit}"
        value /= 1024


def fmt_watts(value) -> str:
    return MISSING if missing(value) else f"{value:.0f} W"


def fmt_energy(joules) -> str:
    if missing(joules):
        return MISSING
    if joules >= 3.6e5:
        return f"{joules / 3.6e6:.3f} kWh"
    if joules >= 1e3:
        return f"{joules / 1e3:.1f} kJ"
    return f"{joules:.0f} J"


def fmt_seconds(value) -> str:
    if missing(value):
        return MISSING
    if value >= 3600:
        return f"{int(value // 3600)} h {int(value % 3600 // 60):02d} min"
    if value >= 60:
        return f"{int(value // 60)} min {value % 60:04.1f} s"
    if value >= 1:
        return f"{value:.1f} s"
    if value < 1e-3:  # a step of 0.3 ms is not "0 ms"
        return fmt_time(value)
    return f"{value * 1000:.0f} ms"


def fmt_rate(value, unit: str = "/s") -> str:
    """A rate with thousands separators and one decimal: '1,234.5/s', '528.4 samples/s'."""
    return MISSING if missing(value) else f"{value:,.1f}{unit}"


def fmt_time(seconds) -> str:
    """Seconds down to microseconds: '12 µs', '3.40 ms', '1.2 s' (longer: ``fmt_seconds``)."""
    if missing(seconds):
        return MISSING
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return fmt_seconds(seconds)


def fmt_gap(start_s: float, end_s: float, at: bool = True) -> str:
    """A recorded gap as the notes, the live header and the phase band name it:
    'sampler paused 2.1 s at t=3.0 s' (``at=False``: without where)."""
    text = f"sampler paused {fmt_unit(end_s - start_s, 's', 1)}"
    return f"{text} at t={fmt_unit(start_s, 's', 1)}" if at else text


def fmt_cost(value, currency: str = "$") -> str:
    """Money: whole units from 100, cents from 1, four decimals below ('$0.0123')."""
    if missing(value):
        return MISSING
    if abs(value) >= 100:
        return f"{currency}{value:,.0f}"
    if abs(value) >= 1:
        return f"{currency}{value:,.2f}"
    return f"{currency}{value:.4f}"


def fmt_metric_value(value: float, metric: str) -> str:
    """A rule's threshold or figure for ``metric``: 4 significant digits and the metric's unit
    ('60 %', '10.25 GiB'); a ``*_frac`` figure as a percentage with one decimal."""
    unit = METRICS[metric].unit if metric in METRICS else ""
    if metric.endswith("_frac"):
        return f"{100 * value:.1f} %"
    if metric.startswith(("latency_", "ttft_")) and metric.endswith("_s"):  # serving times: '50.00 ms'
        return fmt_time(value)
    if unit == "B" or metric.endswith("_bytes"):  # memory: '10.25 GiB' (B in the metric's own unit)
        return f"{value / GIB:.2f} GiB" if abs(value) >= 0.5 * GIB else f"{value / 2**20:.1f} MiB"
    if not unit:  # a summary figure named by its unit: a rate, power, energy
        unit = ("/s" if metric.endswith("_per_s") else "W" if metric.endswith("_w") else "kWh"
                if metric.endswith("_kwh") else "J" if metric.endswith("_j") else "")
    text = f"{value:.4g}"
    if unit == "/s":
        return f"{text}/s"
    return f"{text} {unit}" if unit and unit not in ("bitmask",) else text


def fmt_value(kind: str, value, currency: str = "$") -> str:
    """A comparison cell by the row's kind (seconds, kwh, cost, pct, frac, watts, bytes, rate,
    joules; else 4 significant digits). Energy here has 3 significant digits, not
    ``fmt_energy``'s scaled units: rows of one table line up."""
    if missing(value):
        return MISSING
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


def _figure_number(figure: Figure) -> str:
    """A known figure's value in its unit, through the formatters above."""
    value, unit, digits = figure.value, figure.unit, figure.digits
    if unit == "%":
        return fmt_pct(value, digits or 0)
    if unit == "share":
        return fmt_frac(value, digits or 0)
    if unit == "change":
        return fmt_change(value, 1 if digits is None else digits)
    if unit == "pts":
        return fmt_points(value)
    if unit == "B":
        return fmt_bytes(value, 1 if digits is None else digits)
    if unit == "B/s":
        return fmt_bytes(value) + "/s"
    if unit == "W":
        return fmt_watts(value)
    if unit == "J":  # below a kJ with 3 significant digits: 0.5 J is not "0 J"
        return fmt_energy(value) if abs(value) >= 1e3 else f"{value:.3g} J"
    if unit == "kWh":
        return f"{value:.3g} kWh"
    if unit == "s":
        return fmt_seconds(value)
    if unit == "time":
        return fmt_time(value)
    if unit.endswith("/s"):  # '/s', 'samples/s', 'requests/s', 'tokens/s'
        return fmt_rate(value, unit if unit == "/s" else " " + unit)
    if unit == "cost":
        return fmt_cost(value, figure.currency)
    if unit == "count":
        return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"
    if unit == "offset":
        return fmt_unit(value, "s", 1)
    if unit == "ratio":
        return f"{value:.2f}x"
    if unit == "logged":
        return f"{value:.4g}"
    if unit == "logged change":
        return f"{value:+.4g}"
    return f"{value:.4g} {'°C' if unit == 'degC' else unit}"


def provenance_label(figure: Figure) -> str:
    """What follows a figure that is not a plain measurement: ' (simulated)', ' (estimated: BASIS)',
    '' otherwise (a measurement names its source where its view lists sources)."""
    if figure.kind == SIMULATED:
        return " (simulated)"
    if figure.kind == ESTIMATED:
        return f" (estimated: {figure.basis})"
    return ""


def fmt_figure(figure: Figure, labelled: bool = True) -> str:
    """A figure as every view writes it: its value in its unit and, when simulated or estimated,
    its label ('14.6 GiB (simulated)', '327 (estimated: a fit over 3 runs)'); an unknown figure
    is "n/a", never 0. Only ``Figure`` values: a bare number is refused (a TypeError), so no view
    can print a figure without its unit and provenance. ``labelled=False`` only where the same
    cell carries the label already (a change printed beside its labelled value)."""
    if not isinstance(figure, Figure):
        raise TypeError(f"fmt_figure takes a Figure (core/figure.py), not {type(figure).__name__}: "
                        "build one with its unit and provenance")
    if not figure.known:
        return MISSING
    return _figure_number(figure) + (provenance_label(figure) if labelled else "")


def fmt_figures(figures, sep: str = " / ") -> str:
    """Several figures of one cell ('45 % / 80 %'), the label once at the end when they share it."""
    figures = list(figures)
    labels = {provenance_label(f) for f in figures if f.known}
    if len(labels) != 1:
        return sep.join(fmt_figure(f) for f in figures)
    label = labels.pop()
    return sep.join(_figure_number(f) if f.known else MISSING for f in figures) + label
