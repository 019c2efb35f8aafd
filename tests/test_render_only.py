"""Every table a person reads is built in ``render/``, every unit is formatted in ``core/format.py``.

The package's source is read with ``ast`` (nothing imported, nothing started) and each module is
checked for what it must leave to those two places. What counts, precisely:

Building a table (allowed in ``render/`` only, where ``render/text_table.py`` is the one builder):

* ``str.ljust`` / ``str.rjust`` / ``str.center`` calls (padding a cell to a column's width);
* a format spec with a width (``f"{name:<12}"``, ``f"{x:>{w}}"``, ``f"{x:8.1f}"``, and the same in
  ``"{:>8}".format(...)`` and ``"%-12s" % name``); a zero-padded width (``:02d``, a clock's
  minutes) is not a column;
* a rule: a one-character text of ``-``, ``=``, ``─``, ``━`` or ``_`` times a number (``"-" * width``).

Formatting a unit (allowed in ``core/format.py`` only; everything else calls its formatters):

* an f-string, a ``"...".format()`` text or a ``%`` template (``"..." % value``, a log call's
  ``"... %.1f GiB"``) whose literal text right after
  a formatted value starts with a unit (``f"{x:.1f} ms"``, ``f"{share} %"``, ``"{:.0f} W".format(p)``,
  ``"%d s" % n``), or a value joined to a text that starts with one (``str(x) + " ms"``); the units:
  ``UNITS``, and ``LETTER_UNITS`` after a space;
* a formatted value that converts a unit inside the f-string (``f"{b / 2**30:.1f}"``, ``f"{s * 1e3}"``:
  divided or multiplied by 1e3, 1000, 1e6, 1e9, 2**20, 2**30, 1024 ** n, ``GIB`` or ``MIB``);
* the literal ``"n/a"`` (the missing figure is ``core.format.MISSING``); docstrings are not code
  and are not read.

Error messages, argparse help and log lines are text a person reads too, and they take the same
rule: a unit in them goes through ``core/format.py``. The exceptions, each with its reason, are in
``ALLOWED`` below. The planted cases at the end prove the checker sees each kind.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.test_figure import _docstrings

PACKAGE = Path(__file__).resolve().parent.parent / "gpuprof_jupyter"

UNITS = ("ms", "µs", "us", "ns", "sec", "min", "GiB", "MiB", "KiB", "GB", "MB", "kW", "kJ", "kWh", "%", "pts", "°C",
         "Hz", "MHz")
LETTER_UNITS = ("s", "h", "B", "W", "J")  # after a space only: f"{name}s" is a plural
# a unit right after a formatted value: the unit, then the text ends or a non-letter follows
_UNIT_AFTER = re.compile(r"^( ?(" + "|".join(re.escape(u) for u in sorted(UNITS, key=len, reverse=True))
                         + r")| (" + "|".join(LETTER_UNITS) + r"))(?![A-Za-z0-9_])")
_TEMPLATE_FIELD = re.compile(r"(\{[^{}]*\}|%[-+ #0-9.]*[dfgeiu])")
_PERCENT_FIELD = re.compile(r"%[-+ #0-9.]*[dfgeiu]")
_PERCENT_WIDTH = re.compile(r"(?<!%)%[-+ #]*[1-9]\d*(\.\d+)?[sdfgeiu]")  # '%-12s', '%8.1f': not '%02d'

# a width: after an alignment (a number or a nested field), or alone (a number, not a zero fill)
_WIDTH_SPEC = re.compile(r"^(.?[<>^=][-+ ]?#?(\d+|\{)|[-+ ]?#?[1-9])")
_RULE_CHARS = {"-", "=", "─", "━", "_"}
_SCALES = {1e3, 1e6, 1e9, 2 ** 20, 2 ** 30, 2 ** 10}
_SCALE_NAMES = {"GIB", "MIB", "KIB"}

# (module path relative to the package, kind): why it may. None today: log lines, error messages
# and argparse help print their units through core/format.py like every other text. An exception
# goes here only with its reason, for a text that is not read as a figure or a table.
ALLOWED: dict[tuple[str, str], str] = {
}

TABLE, UNIT, MISSING = "table", "unit", "n/a"


def _const_number(node) -> float | None:
    """A numeric constant, or a constant power (2**30, 1024 ** 3), as a number; None otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        base, exp = _const_number(node.left), _const_number(node.right)
        if base is not None and exp is not None:
            return base ** exp
    return None


def _is_scale(node) -> bool:
    number = _const_number(node)
    if number is not None:
        return number in _SCALES
    return isinstance(node, ast.Name) and node.id in _SCALE_NAMES or (
        isinstance(node, ast.Attribute) and node.attr in _SCALE_NAMES)


def _converts(node) -> bool:
    """``value / 2**30``, ``value * 1e3``... inside a formatted value, outside any call (a value
    converted for a formatter, ``fmt_time(us / 1e6)``, is that formatter's to print)."""
    if isinstance(node, ast.Call):
        return False
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.Mult)) \
            and (_is_scale(node.left) or _is_scale(node.right)):
        return True
    return any(_converts(child) for child in ast.iter_child_nodes(node))


def _spec_text(spec) -> str:
    """A FormattedValue's format spec as text, a nested ``{w}`` written as ``{``."""
    if spec is None:
        return ""
    return "".join(v.value if isinstance(v, ast.Constant) else "{" for v in spec.values)


def _template_units(text: str) -> bool:
    """A ``.format()`` or ``%`` template whose field is followed by a unit."""
    return any(_UNIT_AFTER.match(text[m.end():]) for m in _TEMPLATE_FIELD.finditer(text))


def _template_widths(text: str) -> bool:
    return any(_WIDTH_SPEC.match(m.group(1)[1:-1].partition(":")[2]) for m in re.finditer(r"(\{[^{}]*\})", text)
               if ":" in m.group(1))


def findings(source: str) -> list[tuple[int, str, str]]:
    """(line, kind, what) for each table built, unit formatted or "n/a" written in ``source``."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    out: list[tuple[int, str, str]] = []
    in_fstring: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = node.values
            in_fstring.update(id(v) for v in parts)
            for i, part in enumerate(parts):
                if not isinstance(part, ast.FormattedValue):
                    continue
                in_fstring.update(id(n) for n in ast.walk(part))
                after = parts[i + 1] if i + 1 < len(parts) else None
                if isinstance(after, ast.Constant) and isinstance(after.value, str) and _UNIT_AFTER.match(after.value):
                    out.append((node.lineno, UNIT, f"a value followed by {after.value.strip()[:12]!r}"))
                if _converts(part.value):
                    out.append((node.lineno, UNIT, "a unit converted inside an f-string"))
                if _WIDTH_SPEC.match(_spec_text(part.format_spec)):
                    out.append((node.lineno, TABLE, f"a width in a format spec ({_spec_text(part.format_spec)!r})"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("ljust", "rjust", "center"):
                out.append((node.lineno, TABLE, f"str.{node.func.attr}"))
            template = node.func.value
            if node.func.attr == "format" and isinstance(template, ast.Constant) and isinstance(template.value, str):
                if _template_units(template.value):
                    out.append((node.lineno, UNIT, f"a .format() template with a unit: {template.value[:30]!r}"))
                if _template_widths(template.value):
                    out.append((node.lineno, TABLE, f"a .format() template with a width: {template.value[:30]!r}"))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.right, ast.Constant) \
                and isinstance(node.right.value, str) and _UNIT_AFTER.match(node.right.value) \
                and not isinstance(node.left, (ast.Constant, ast.JoinedStr)):
            out.append((node.lineno, UNIT, f"a value joined to {node.right.value.strip()[:12]!r}"))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for text, other in ((node.left, node.right), (node.right, node.left)):
                if isinstance(text, ast.Constant) and text.value in _RULE_CHARS and _const_number(other) is None:
                    out.append((node.lineno, TABLE, f"a rule: {text.value!r} * n"))
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docs:
            continue
        if re.search(r"(?<![\w/])n/a(?![\w/])", node.value):
            out.append((node.lineno, MISSING, 'the literal "n/a" (core.format.MISSING)'))
        if any(_UNIT_AFTER.match(node.value[m.end():]) for m in _PERCENT_FIELD.finditer(node.value)):
            out.append((node.lineno, UNIT, f"a % template with a unit: {node.value[:30]!r}"))
        if _PERCENT_WIDTH.search(node.value):
            out.append((node.lineno, TABLE, f"a % template with a width: {node.value[:30]!r}"))
    return sorted(set(out))


def _kind_allowed_in(path: str, kind: str) -> bool:
    """Tables in ``render/``, units and "n/a" in ``core/format.py``."""
    if kind == TABLE:
        return path.startswith("render/")
    return path == "core/format.py"


def test_no_module_outside_render_builds_a_table_or_formats_a_unit():
    problems = []
    for file in sorted(PACKAGE.rglob("*.py")):
        path = file.relative_to(PACKAGE).as_posix()
        for line, kind, what in findings(file.read_text(encoding="utf-8")):
            if not _kind_allowed_in(path, kind) and (path, kind) not in ALLOWED:
                problems.append(f"gpuprof_jupyter/{path}:{line}: {kind}: {what}")
    assert not problems, ("format units with core/format.py and build tables in render/ (render/text_table.py):\n"
                          + "\n".join(problems))


def test_every_exception_is_still_needed():
    """An exception whose module no longer does what it excused is taken out of ``ALLOWED``."""
    for (path, kind), why in ALLOWED.items():
        assert why, path
        kinds = {k for _, k, _ in findings((PACKAGE / path).read_text(encoding="utf-8"))}
        assert kind in kinds, f"{path} no longer needs its {kind} exception"


@pytest.mark.parametrize("source, kind", [
    ('f"{x:.1f} ms"', UNIT),
    ('f"{share} %"', UNIT),
    ('f"{p:.0f} W"', UNIT),
    ('f"{x:.1f}ms"', UNIT),
    ('f"{used}/{total} GiB"', UNIT),
    ('f"took {t:.2f} s)"', UNIT),
    ('f"{b / 2**30:.1f}"', UNIT),
    ('f"{b / (1024 ** 3):.1f}"', UNIT),
    ('f"{secs * 1e3:.0f}"', UNIT),
    ('f"{b / GIB:.2f}"', UNIT),
    ('"{:.0f} W".format(p)', UNIT),
    ('"%d s" % n', UNIT),
    ('str(round(x, 1)) + " ms"', UNIT),
    ('log.warning("idle %.0f s while it held %.1f GiB", idle, held / 2**30)', UNIT),
    ('x = "n/a"', MISSING),
    ('f"value: n/a"', MISSING),
    ('"name".ljust(12)', TABLE),
    ('" ".join(c.rjust(w) for c, w in zip(cells, widths))', TABLE),
    ('title.center(40)', TABLE),
    ('f"{name:<12}|"', TABLE),
    ('f"{x:>{width}}"', TABLE),
    ('f"{x:8.1f}"', TABLE),
    ('"{:>8}".format(x)', TABLE),
    ('"%-12s %8.1f" % (name, value)', TABLE),
    ('"-" * width', TABLE),
    ('len(heads) * "="', TABLE),
])
def test_the_checker_sees_each_kind(source, kind):
    assert kind in {k for _, k, _ in findings(source)}, findings(source)


@pytest.mark.parametrize("source", [
    'f"{n} steps"',  # a count of a thing, not a unit
    'f"{n} experiment{plural}"',
    'f"{corner}s, one a line"',  # a plural
    'f"{major // 1000}.{minor}"',  # a version number
    'f"{minutes:02d}"',  # a zero fill (a clock), not a column
    'f"{name!r} is not a setting"',
    'f"rank {rank} stopped"',
    '"s" * (n != 1)',  # a plural's s
    '"-" * 3',  # a fixed divider, not a column's width
    'def f():\n    """Missing figures print as "n/a"."""',  # a docstring
    'f"{path}/n/apple"',
    'x / 2**30',  # a conversion for a computation, not printed here
    'fmt_time(x)',
    '"sm_util > 60 for >=80% per step"',  # a rule's text: no %-field
    'log.warning("kernel %s stopped: %s", kernel, why)',
    '"%02d:%02d" % (h, m)',  # a clock's zero fill
    '"50%% of %s" % x',  # an escaped percent sign
    'f"{fmt_time(us / 1e6)}"',  # converted for a formatter, which prints the unit
    'f"{value:{spec}}"',  # a spec chosen at run time, no width
])
def test_the_checker_leaves_plain_text_alone(source):
    assert findings(source) == []
