"""Start-up (issue 5, item 6): ``%load_ext gpuprof_jupyter`` in a fresh IPython (imports and
magic registration; BokehJS is only sent by a real kernel's front end and is not counted),
and the fixed cost of one profiled cell: session start, stop (persist: Parquet, summary,
metadata) and the static rendering that replaces the live view.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time

from ._common import figure, run_json_subprocess, save

NAME = "startup"
REPEAT = {"tiny": 2, "quick": 5, "full": 11}

LOAD_EXT = """
import json, time
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
t = time.perf_counter()
shell.run_line_magic("load_ext", "gpuprof_jupyter")
dt = time.perf_counter() - t
import sys
heavy = sorted(m for m in ("pandas", "pyarrow", "bokeh", "torch", "matplotlib", "pynvml", "jupyter_bokeh") if m in sys.modules)
print(json.dumps({"load_ext_s": dt, "heavy_modules_loaded": heavy}))
"""


def _cell_cost(repeat: int) -> dict:
    """start / stop / static rendering of an empty profiled cell (fake NVML, 1 GPU)."""
    from gpuprof_jupyter.runtime.session import ProfileSession
    from gpuprof_jupyter.views.static_plots import static_output_bundles

    from ._common import fake_nvml

    rows = []
    with fake_nvml(1, "h100", realistic=True), tempfile.TemporaryDirectory() as store:
        for i in range(repeat + 1):
            session = ProfileSession(f"cell{i}", interval=0.1, source="nvml", store=store)
            t0 = time.perf_counter()
            session.start()
            t1 = time.perf_counter()
            experiment = session.stop()
            t2 = time.perf_counter()
            static_output_bundles(experiment)
            t3 = time.perf_counter()
            if i:  # the first one pays one-off imports: reported apart
                rows.append((t1 - t0, t2 - t1, t3 - t2))
            else:
                first = (t1 - t0, t2 - t1, t3 - t2)
    med = [statistics.median(c) for c in zip(*rows)]
    return {"start_s": med[0], "stop_s": med[1], "static_s": med[2], "total_s": sum(med), "first_cell_total_s": sum(first)}


def run(mode: str = "quick") -> dict:
    loads = [run_json_subprocess(LOAD_EXT, timeout=120) for _ in range(REPEAT[mode])]
    load_s = statistics.median(r["load_ext_s"] for r in loads)
    cell = run_json_subprocess(
        "import json; from benchmarks.bench_startup import _cell_cost; "
        f"print(json.dumps(_cell_cost({REPEAT[mode]})))", timeout=300)
    figures = [
        figure("load_ext_s", "%load_ext gpuprof_jupyter in a fresh IPython (median of fresh processes)", round(load_s, 3), "s",
               "<= 1 s", 1.0, gated=True, note="heavy modules imported by it: " + (", ".join(loads[0]["heavy_modules_loaded"]) or "none")),
        figure("cell_fixed_ms", "fixed cost per profiled cell: start + stop/persist + static rendering (median)",
               round(cell["total_s"] * 1e3, 1), "ms", "<= 150 ms", 150.0, gated=True,
               note=f"start {cell['start_s']*1e3:.0f} ms, stop {cell['stop_s']*1e3:.0f} ms, static {cell['static_s']*1e3:.0f} ms; "
                    f"first cell of a kernel (one-off imports) {cell['first_cell_total_s']*1e3:.0f} ms"),
    ]
    data = {"figures": figures, "load_ext_runs": loads, "cell": cell}
    save(NAME, data, mode)
    return data


if __name__ == "__main__":
    import sys

    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else "quick")["figures"], indent=1))
