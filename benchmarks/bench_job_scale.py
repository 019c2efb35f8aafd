"""A multi-node job at scale (issue 38, part 7): 64 nodes x 8 ranks x 1,000 steps, fast-forwarded.

Each node's part is written straight into a store as its ``gpuprof run`` saves it
(``tests/jobparts.py``: every rank's steps, shared step ends, no samples), then, in fresh
processes: ``gpuprof_jupyter.load(JOB_ID)`` (the index built by a listing before, as on any
store that was listed once; best of 3), ``gpuprof list`` as a whole process (best of 3: the job
is one row), and the summary text and standalone report of the job: readable at 512 ranks (a
distribution row and the outliers, not 512 rows) and under the report's size budget
(BokehJS + 1 MB, as bench_long_run's). Timings are wall time on whatever machine runs it.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ._common import ROOT, figure, run_json_subprocess, save

NAME = "job_scale"
SIZES = {"tiny": (4, 2, 50), "quick": (64, 8, 1000), "full": (64, 8, 1000)}  # nodes, ranks per node, steps

_LOAD = """
import json, sys, time
t = time.perf_counter()
import gpuprof_jupyter as gp
job = gp.load("bench-job", sys.argv[1] if len(sys.argv) > 1 else {store!r})
load_s = time.perf_counter() - t
from gpuprof_jupyter.render.summary_html import render_summary_text
from gpuprof_jupyter.render.report import render_report
import bokeh.resources
text = render_summary_text(job)
report = render_report([job])
print(json.dumps({{"load_s": load_s, "ranks": len(job.summary["ranks"]), "text_lines": len(text.splitlines()),
                  "report_bytes": len(report.encode()), "bokehjs_bytes": sum(len(js) for js in bokeh.resources.INLINE.js_raw)}}))
"""


def _fill(store: Path, nodes: int, per_node: int, steps: int) -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from gpuprof_jupyter.api import experiments
    from gpuprof_jupyter.core.store.directory import Store
    from tests.jobparts import write_part

    s = Store(store)
    for node in range(nodes):
        write_part(s, "bench-job", host=f"node{node:02d}", node=node, parts=nodes, steps=steps,
                   ranks=list(range(node * per_node, (node + 1) * per_node)), world=nodes * per_node)
    experiments(s)  # the index, as after any listing


def _list_s(store: Path) -> tuple[float, int]:
    best, rows = float("inf"), 0
    for _ in range(3):
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "gpuprof_jupyter.cli", "list", "--store", str(store)], check=True,
                             capture_output=True, text=True, cwd=str(ROOT), timeout=300).stdout
        best = min(best, time.perf_counter() - t)
        rows = len(out.splitlines()) - 2  # the store's line and the header
    return best, rows


def run(mode: str = "quick") -> dict:
    nodes, per_node, steps = SIZES[mode]
    with tempfile.TemporaryDirectory(prefix="gpuprof-job-scale-") as scratch:
        store = Path(scratch) / "store"
        t = time.perf_counter()
        _fill(store, nodes, per_node, steps)
        fill_s = time.perf_counter() - t
        loads = [run_json_subprocess(_LOAD.format(store=str(store)), timeout=600) for _ in range(3)]
        r = min(loads, key=lambda x: x["load_s"])
        list_s, list_rows = _list_s(store)
    ranks = nodes * per_node
    MB = 1e6
    limit = (r["bokehjs_bytes"] + 1_048_576) / MB
    shape = f"{nodes} nodes x {per_node} ranks x {steps:,} steps"
    figures = [
        figure("load_s", f"load(JOB_ID) of a job of {shape}, fresh process, imports included (best of 3)",
               round(r["load_s"], 3), "s", "<= 2 s", 2.0, gated=True,
               note=f"{ranks} ranks, {ranks * steps:,} steps; parts written in {fill_s:.0f} s"),
        figure("list_rows", "gpuprof list: rows for the job (one, with its parts)", list_rows, "rows", "<= 1", 1, gated=True,
               note=f"whole command {list_s:.2f} s (best of 3)"),
        figure("summary_lines", f"summary text of the job at {ranks} ranks (a distribution row and the outliers)",
               r["text_lines"], "lines", "<= 40", 40, gated=True),
        figure("report_mb", f"standalone report of the job at {ranks} ranks", round(r["report_bytes"] / MB, 2), "MB",
               f"<= BokehJS + 1 MB = {limit:.2f} MB", limit, gated=True),
    ]
    data = {"figures": figures, "raw": {**r, "list_s": list_s, "fill_s": fill_s, "nodes": nodes,
                                        "ranks_per_node": per_node, "steps": steps}}
    save(NAME, data, mode)
    return data


if __name__ == "__main__":
    import json

    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else "quick")["figures"], indent=1))
