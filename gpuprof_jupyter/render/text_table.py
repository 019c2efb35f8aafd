"""The one plain-text table builder: columns padded to their widest cell, one line a row.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

Every text table a person reads is built here: ``gpuprof list``'s listing
(``render/listing_text.py``), ``--tune``'s table (``render/tune_table.py``) and the comparison's
settings and metrics (``render/comparison.py``). ``tests/test_render_only.py`` fails when a
module outside ``render/`` pads cells itself. HTML tables are ``render/html.py``'s ``table``.
"""

from __future__ import annotations

from collections.abc import Sequence


def column_widths(rows: Sequence[Sequence[str]]) -> list[int]:
    """Each column's width: its widest cell (rows may be of different lengths)."""
    widths: list[int] = []
    for row in rows:
        for i, cell in enumerate(row):
            if i == len(widths):
                widths.append(0)
            widths[i] = max(widths[i], len(str(cell)))
    return widths


def text_table(rows: Sequence[Sequence[str]], sep: str = "  ", right: bool = False,
               columns: Sequence[int] | None = None) -> list[str]:
    """``rows`` (a header row first, when there is one) as lines: each cell padded to its column's
    width over all the rows, the cells joined by ``sep``, aligned left (``right``: right), no
    trailing spaces. ``columns``: only these columns, in this order, still padded to the widths
    of the whole table (a wide table shown in groups of columns lines up from group to group)."""
    widths = column_widths(rows)
    shown = range(len(widths)) if columns is None else columns
    lines = []
    for row in rows:
        cells = [str(row[i]) if i < len(row) else "" for i in shown]
        padded = [c.rjust(widths[i]) if right else c.ljust(widths[i]) for c, i in zip(cells, shown)]
        lines.append(sep.join(padded).rstrip())
    return lines
