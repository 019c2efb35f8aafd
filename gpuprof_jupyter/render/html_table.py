"""One HTML table of rows (dicts with the same keys), as the summary and the trace tables draw it.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.
"""

from __future__ import annotations

from html import escape


def table_html(rows: list[dict]) -> str:
    """A ``gpuprof-table``: one header row from the first row's keys, values escaped; "" without rows."""
    if not rows:
        return ""
    head = "".join(f"<th>{escape(k)}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{escape(str(v))}</td>" for v in r.values()) + "</tr>" for r in rows)
    return f'<table class="gpuprof-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
