"""One way to write HTML: escaped by default, one table builder, one simulated banner, one palette.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

Every renderer (the summary, findings, alerts, comparison, report, trace tables, the tune table,
the comparison widget and the live header) builds its HTML here. Text is escaped unless it is
``Markup`` (markupsafe, as jinja2 and Bokeh use), so an experiment name, a param, a note or a
rule typed by a user is never read as HTML: fill trusted templates with ``html(template,
*values)`` (each value escaped), never f-strings around user text. One edit here changes how a
banner, a table or a colour looks everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from html import escape as _escape_text
from numbers import Number

from markupsafe import Markup, escape

# The colours every view uses, by what they mean.
PALETTE = {
    "good": "#2e7d32",  # better, passed, the advice that follows a finding
    "bad": "#c62828",  # worse, failed, an error, an alert
    "unjudged": "#6d4c41",  # a rule that could not be judged (neither pass nor fail)
    "warn": "#ef6c00",  # a medium finding, an interrupted run
    "info": "#1565c0",  # an informative finding, a running run
    "muted": "#777",  # ids, notes, what is neither better nor worse
    "gap": "#8a6d00",  # a sampler gap
    "banner": "background:#fff3cd;color:#5c4400",  # the simulated banner, a changed setting
    "problem": "background:#fdecea;color:#611a15",  # a comparison that is not fair
}
FONT = "font-family:sans-serif;font-size:13px"
SIMULATED_TEXT = "SIMULATED GPU: these figures are not measurements"


def _escaped(value):
    """A value ready for a template field: ``Markup`` (anything with ``__html__``) as it is, text
    escaped, a number or a date as itself (its format spec, ``{:.1f}``, ``{:%Y-%m-%d}``, applies),
    anything else as escaped text. Plain strings, not a ``Markup`` per value: the summary and the
    live header fill hundreds of fields."""
    if hasattr(value, "__html__"):
        return value.__html__()
    if isinstance(value, str):
        return _escape_text(value)
    if isinstance(value, (int, float, date)) or isinstance(value, Number):
        return value
    return _escape_text(str(value))


def html(template: str, *values, **named) -> Markup:
    """``template`` (HTML written in this code, trusted) with its ``{}`` fields filled by ``values``,
    each escaped unless it is ``Markup`` (format specs work: ``{:.1f}``). What ``Markup.format``
    does, through ``str.format``: the summary renders in 0.3 ms instead of 0.8."""
    return Markup(template.format(*map(_escaped, values), **{k: _escaped(v) for k, v in named.items()}))


def join(parts, separator: str = "") -> Markup:
    """The parts one after another, each escaped unless it is ``Markup``; ``separator`` is trusted HTML."""
    return Markup(separator.join(str(_escaped(p)) for p in parts))


def coloured(text, role: str, *, bold: bool = False, cls: str | None = None) -> Markup:
    """``text`` in the palette's colour for ``role`` ('good', 'bad', ...)."""
    style = f"color:{PALETTE[role]}" + (";font-weight:bold" if bold else "")
    return html("<span{} style='{}'>{}</span>", html(" class='{}'", cls) if cls else "", style, text)


def error_html(exc: BaseException) -> str:
    """An error a widget shows instead of raising it: 'KeyError: ...' in the palette's 'bad' colour."""
    return str(coloured(f"{type(exc).__name__}: {exc}", "bad"))


def script_json(text: str) -> Markup:
    """JSON text (``json.dumps``) made safe inside a ``<script>`` element: a ``</`` in a string
    (a phase's name in the plots' bands) cannot end the script."""
    return Markup(text.replace("</", "<\\/"))


def simulated_banner(text: str = SIMULATED_TEXT) -> Markup:
    """The banner above anything that shows simulated figures."""
    return html("<div class='gpuprof-simulated' style='{};padding:4px 8px;border-radius:4px;font-weight:bold'>{}</div>",
                PALETTE["banner"], text)


def simulated_badge() -> Markup:
    """The short form of the banner, for a one-line header."""
    return html("<span class='gpuprof-simulated' style='{};padding:1px 6px;border-radius:3px;font-weight:bold'>"
                "SIMULATED</span>", PALETTE["banner"])


def problem_box(title: str, items) -> Markup:
    """A warning box: a bold title and a list (each item text or ``Markup``; a pair (kind, text)
    sets the item's ``data-warning``)."""
    lis = join(html("<li data-warning='{}'>{}</li>", *item) if isinstance(item, tuple) else html("<li>{}</li>", item)
               for item in items)
    return html("<div class='gpuprof-warnings' style='{};padding:4px 8px;border-radius:4px'><b>&#9888; {}</b>"
                "<ul style='margin:2px 0'>{}</ul></div>", PALETTE["problem"], title, lis)


def bullet_list(items, *, cls: str | None = None, title: str | None = None, item_cls: str | None = None) -> Markup:
    """A titled list (``''`` without items): each item text or ``Markup``."""
    items = list(items)
    if not items:
        return Markup("")
    lis = join(html("<li{}>{}</li>", html(" class='{}'", item_cls) if item_cls else "", item) for item in items)
    head = html("<b>{}</b>", title) if title else ""
    return html("<div{}>{}<ul style='margin:2px 0'>{}</ul></div>", html(" class='{}'", cls) if cls else "", head, lis)


@dataclass(frozen=True)
class Cell:
    """A table cell with its own class or style (a changed setting, a verdict); ``header`` makes it a ``th``."""

    content: object
    cls: str | None = None
    style: str | None = None
    header: bool = False

    def __html__(self) -> str:
        name = "th" if self.header else "td"
        return html("<{0}{1}{2}>{3}</{0}>", Markup(name), html(" class='{}'", self.cls) if self.cls else "",
                    html(" style='{}'", self.style) if self.style else "", self.content)


def _cell(value) -> Markup:
    return Markup(value.__html__()) if isinstance(value, Cell) else html("<td>{}</td>", value)


def table(rows, head=None, *, cls: str = "gpuprof-table", row_heads: bool = False) -> Markup:
    """One HTML table. ``rows``: dicts (the header is the first row's keys) or sequences with
    ``head``; a cell is text (escaped), ``Markup`` or a ``Cell``. ``row_heads``: each row's first
    cell is its header (``th``). ``''`` without rows."""
    rows = list(rows)
    if not rows:
        return Markup("")
    if head is None:
        head = list(rows[0])
    rows = [list(r.values()) if isinstance(r, dict) else list(r) for r in rows]
    thead = join(html("<th>{}</th>", h) for h in head)
    body = join(
        html("<tr>{}</tr>", join(Markup(Cell(v, style="text-align:left", header=True).__html__()) if row_heads and i == 0
                                 else _cell(v) for i, v in enumerate(r)))
        for r in rows)
    return html("<table class='{}'><thead><tr>{}</tr></thead><tbody>{}</tbody></table>", cls, thead, body)


__all__ = ["Cell", "FONT", "Markup", "PALETTE", "SIMULATED_TEXT", "bullet_list", "coloured", "escape", "html", "join",
           "problem_box", "script_json", "simulated_badge", "simulated_banner", "table"]
