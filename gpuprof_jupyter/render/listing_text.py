"""``gpuprof list``'s text: the store's experiments, one a line, under a line naming the store.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

The cells are the listing's rows (``core/listing.py``) as figures in their units, "(simulated)" on
a simulated run's GPU figures; the table is ``render/text_table.py``'s, right-aligned.
"""

from __future__ import annotations

from types import SimpleNamespace

from gpuprof_jupyter.core.analysis.run_figures import run_figure
from gpuprof_jupyter.core.format import MISSING, as_number, fmt_figure, fmt_setting, missing
from gpuprof_jupyter.render.text_table import text_table

LIST_COLUMNS = ("name", "id", "status", "duration_s", "sm_util_mean", "energy_kwh")
_LIST_UNITS = {"duration_s": "s", "sm_util_mean": "%", "energy_kwh": "kWh"}  # the listing's figures (core/figure.py)


def listing_text(where, rows: list[dict]) -> str:
    """The listing of the store at ``where`` (a path) as lines: which store and how many
    experiments, then a table of ``LIST_COLUMNS`` (and "parts" when a row is a multi-node job's)."""
    if not rows:
        return f"no experiments in store {where}"
    columns = LIST_COLUMNS + (("parts",) if any(row.get("parts") for row in rows) else ())
    table = text_table([columns, *([_cell(row, c) for c in columns] for row in rows)], sep=" ", right=True)
    return "\n".join([f"store {where}: {len(rows)} experiment{'s' if len(rows) != 1 else ''}", *table])


def _cell(row: dict, column: str) -> str:
    """A listing cell: a figure in its unit, "(simulated)" on a simulated run's GPU figures, "n/a"
    when unknown; other columns as text ("n/a" when absent)."""
    value = row.get(column)
    if column in _LIST_UNITS:
        run = SimpleNamespace(simulated=bool(row.get("simulated")), source=row.get("source") or "", provenance={})
        return fmt_figure(run_figure(run, column, as_number(value), _LIST_UNITS[column]))
    return MISSING if missing(value) else fmt_setting(value)  # "parts" on a row that is no job's
