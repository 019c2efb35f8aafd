"""``report()``: the standalone HTML report written to a file, each traced run's merged trace beside it.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

The report's text is ``render/report.py``'s (``render_report``).
"""

from __future__ import annotations

from pathlib import Path

from gpuprof_jupyter.api import load_many
from gpuprof_jupyter.core.store.atomic import write_text_atomic
from gpuprof_jupyter.export.trace import write_merged_trace
from gpuprof_jupyter.render.report import render_report


def report(*names_or_ids, path="report.html", store=None, prices=None, title: str | None = None,
           baseline=0) -> Path:
    """Write a standalone HTML report of these experiments (none: the whole store); return its path."""
    experiments = load_many(names_or_ids, store)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    links = _write_traces(experiments, path)
    html = render_report(experiments, title=title, prices=prices, baseline=baseline, trace_links=links)
    write_text_atomic(path, html)
    return path


def _write_traces(experiments, report_path: Path) -> dict[str, str]:
    """Each traced experiment's merged trace beside the report: id -> relative href."""
    links = {}
    for experiment in experiments:
        if not experiment.trace:
            continue
        name = f"{report_path.stem}-{experiment.id}.trace.json"
        write_merged_trace(experiment, report_path.parent / name)
        links[experiment.id] = name
    return links


__all__ = ["report"]
