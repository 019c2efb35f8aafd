"""Where each traced window's time went, per rank: a table beside the window in the summary and
the report, with its plain-text twin.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

Reads ``summary["trace"]["breakdowns"]`` (``core/analysis/time_breakdown.py``). GPU windows and
CPU-only windows measure different things, so they get different tables, each titled with what
it is.
"""

from __future__ import annotations

from gpuprof_jupyter.core.figure import measured
from gpuprof_jupyter.core.format import MISSING, fmt_figure, fmt_figures
from gpuprof_jupyter.render.html import Markup, html, join, table

GPU_TITLE = "where the time went (GPU kernels; Holistic Trace Analysis's definitions, shares of the GPU's span)"
CPU_TITLE = "where the time went (CPU activities only: no GPU activity in the trace; shares of the window)"
BASIS = "torch.profiler's trace of the window, broken down by core/analysis/time_breakdown.py"


def _share(value) -> str:
    """A share of the window (or of the GPU's span), measured from the trace."""
    return fmt_figure(measured(value, "share", BASIS))


def _head(window: dict, row: dict) -> dict:
    alert = f" after [{window['alert']}]" if window.get("alert") else ""
    return {"window": f"{window.get('window')}{alert}", "rank": MISSING if row.get("rank") is None else str(row["rank"])}


def _causes(row: dict) -> str:
    causes = row.get("idle_causes")
    if not causes:
        return MISSING
    return fmt_figures([measured(causes.get(k), "share", BASIS) for k in ("host_wait", "kernel_wait", "other")])


def breakdown_rows(t: dict) -> tuple[list[dict], list[dict]]:
    """(GPU rows, CPU rows) of every window and rank in ``t`` (``summary["trace"]``)."""
    gpu, cpu = [], []
    for window in t.get("breakdowns") or []:
        for row in window.get("ranks") or []:
            if row.get("kind") == "gpu":
                gpu.append({**_head(window, row), "compute": _share(row.get("compute")),
                            "communication (not hidden)": _share(row.get("communication")),
                            "memory copies": _share(row.get("memory")), "idle": _share(row.get("idle")),
                            "communication hidden by compute": _share(row.get("overlap")),
                            "idle: host wait / kernel wait / other": _causes(row)})
            else:
                cpu.append({**_head(window, row), "ops": _share(row.get("ops")),
                            "collectives": _share(row.get("collectives")),
                            "waiting for data": _share(row.get("data_wait")),
                            "idle (no op)": _share(row.get("idle"))})
    return gpu, cpu


def breakdown_html(t: dict) -> Markup:
    """The tables ('' when no window was broken down)."""
    parts = [html("<div class='gpuprof-breakdown' data-kind='{}'><b>{}</b>{}</div>", kind, title, table(rows))
             for kind, title, rows in zip(("gpu", "cpu"), (GPU_TITLE, CPU_TITLE), breakdown_rows(t)) if rows]
    return join(parts)


def breakdown_text(t: dict) -> list[str]:
    lines = []
    for title, rows in zip((GPU_TITLE, CPU_TITLE), breakdown_rows(t)):
        if rows:
            lines.append(f"  {title}:")
            lines += ["    " + "; ".join(f"{k}: {v}" for k, v in row.items()) for row in rows]
    return lines


__all__ = ["breakdown_html", "breakdown_rows", "breakdown_text"]
