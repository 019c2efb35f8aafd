"""Start-up (issue 9, part 6): ``%load_ext gpuprof_jupyter`` in a fresh IPython (imports,
magic registration, the sampler process started in the background; BokehJS is only sent by
a real kernel's front end and is not counted), and the fixed cost of one profiled cell:
session start, stop (the sampler process writes Parquet, summary, metadata) and the static
rendering that replaces the live view. Measured three ways: warm (the process already runs:
every cell after the first), the first cell right after ``%load_ext`` (the process started
there, in the background), and a cold start (no ``%load_ext``: ``profile()`` in a script).
Then whole cells as a user runs them (issue 22): ``%%gpuprofile`` cells with the live view at
2 fake GPUs against plain cells in fresh IPython processes, the static ending timed alone.
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


LIVE_CELLS = """
import json, os, statistics, sys, tempfile, time
sys.path.insert(0, os.getcwd())
from benchmarks._common import fake_nvml_env
os.environ.update(fake_nvml_env(2, "h100", realistic=True))
os.environ["GPUPROF_STORE"] = tempfile.mkdtemp()
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
PAUSE_S, WARM = {pause}, {warm}
def cell(src):
    t = time.perf_counter(); result = shell.run_cell(src); dt = time.perf_counter() - t
    assert result.success, result
    return dt
shell.run_line_magic("load_ext", "gpuprof_jupyter")
from gpuprof_jupyter.notebook import static_ending
ending, show = [], static_ending.show_static_ending
def timed_ending(*args, **kwargs):
    t = time.perf_counter(); show(*args, **kwargs); ending.append(time.perf_counter() - t)
static_ending.show_static_ending = timed_ending
body = "x = sum(range(10000))\\n"
time.sleep(PAUSE_S)
plain_first = cell(body)
first = cell("%%gpuprofile --source nvml -n first\\n" + body)
plain = [cell(body) for _ in range(WARM)]
warm = [cell("%%gpuprofile --source nvml -n warm\\n" + body) for _ in range(WARM)]
quiet = [cell("%%gpuprofile --source nvml --quiet -n quiet\\n" + body) for _ in range(WARM)]
from gpuprof_jupyter.notebook.live import dashboard
print(json.dumps({{"first_s": first, "plain_first_s": plain_first, "plain_s": statistics.median(plain),
                  "warm_s": statistics.median(warm), "quiet_s": statistics.median(quiet),
                  "first_ending_s": ending[0], "ending_s": statistics.median(ending[1:WARM + 1])}}))
"""


def _live_cells(repeat: int, pause_s: float, cache: str) -> dict:
    """Profiled cells with the live view (2 fake GPUs) against plain ones, in a fresh IPython
    right after ``%load_ext`` (``pause_s`` later: what it imports in the background is done)."""
    return run_json_subprocess(LIVE_CELLS.format(pause=pause_s, warm=repeat), timeout=300, env={"XDG_CACHE_HOME": cache})


def _one_cell(name: str, store: str) -> tuple[float, float, float]:
    from gpuprof_jupyter.runtime.session import ProfileSession
    from gpuprof_jupyter.render.static_plots import static_output_bundles

    session = ProfileSession(name, interval=0.1, source="nvml", store=store)
    t0 = time.perf_counter()
    session.start()
    t1 = time.perf_counter()
    experiment = session.stop()
    t2 = time.perf_counter()
    static_output_bundles(experiment)
    return t1 - t0, t2 - t1, time.perf_counter() - t2


def _started_process() -> float:
    """Start a sampler process as ``%load_ext`` does and wait until its start is done (its
    warm-up imports too); the CPU seconds it took (its own, measured by psutil)."""
    import psutil

    from gpuprof_jupyter.core.protocol import Ping
    from gpuprof_jupyter.notebook.status import warm_up
    from gpuprof_jupyter.runtime.link import sampler_link

    link = sampler_link()
    link.close()
    warm_up()
    while "gpuprof-warmup" in link.request(Ping())["threads"]:
        time.sleep(0.02)
    cpu = psutil.Process(link.pid).cpu_times()
    return cpu.user + cpu.system


def _cell_cost(repeat: int) -> dict:
    """start / stop / static rendering of an empty profiled cell (fake NVML in the sampler
    process, 1 GPU): cold, just after the background start, then warm (median); and the first
    cell of a process whose start is done, with that start's CPU."""
    import os

    from gpuprof_jupyter.notebook.status import warm_up
    from gpuprof_jupyter.runtime.link import sampler_link

    from ._common import fake_nvml_env

    os.environ.update(fake_nvml_env(1, "h100", realistic=True))
    link = sampler_link()
    with tempfile.TemporaryDirectory() as store:
        cold = _one_cell("cold", store)  # no process yet: started by the cell itself
        _one_cell("imports", store)  # the kernel's one-off imports (Bokeh, ...), not the process
        link.close()
        warm_up()  # what %load_ext does
        after_load_ext = _one_cell("after-load-ext", store)
        rows = [_one_cell(f"cell{i}", store) for i in range(repeat)]
        process_start_cpu = _started_process()
        after_start = _one_cell("after-start", store)
    med = [statistics.median(c) for c in zip(*rows)]
    return {"start_s": med[0], "stop_s": med[1], "static_s": med[2], "total_s": sum(med),
            "after_load_ext_total_s": sum(after_load_ext), "after_load_ext_start_s": after_load_ext[0],
            "cold_total_s": sum(cold), "cold_start_s": cold[0],
            "process_start_cpu_s": process_start_cpu, "after_start_total_s": sum(after_start)}


def run(mode: str = "quick") -> dict:
    loads = [run_json_subprocess(LOAD_EXT, timeout=120) for _ in range(REPEAT[mode])]
    load_s = statistics.median(r["load_ext_s"] for r in loads)
    cell = run_json_subprocess(
        "import json; from benchmarks.bench_startup import _cell_cost; "
        f"print(json.dumps(_cell_cost({REPEAT[mode]})))", timeout=300)
    extra = mode != "tiny"  # the smoke test: one process, no cold-cache or paused runs
    with tempfile.TemporaryDirectory() as cache:  # the Bokeh templates' cache (render.bokeh_templates)
        new_cache = _live_cells(REPEAT[mode], 0.0, cache) if extra else None  # builds them: a first run ever
        live = [_live_cells(REPEAT[mode], 0.0, cache) for _ in range(REPEAT[mode] // 2 + 1 if extra else 1)]
        paused = _live_cells(REPEAT[mode], 3.0, cache) if extra else None
    first_over = statistics.median(r["first_s"] - r["plain_first_s"] for r in live)
    warm_over = statistics.median(r["warm_s"] - r["plain_s"] for r in live)
    quiet_over = statistics.median(r["quiet_s"] - r["plain_s"] for r in live)
    ending = statistics.median(r["ending_s"] for r in live)
    figures = [
        figure("load_ext_s", "%load_ext gpuprof_jupyter in a fresh IPython (median of fresh processes)", round(load_s, 3), "s",
               "<= 1 s", 1.0, gated=True, note="heavy modules imported by it: " + (", ".join(loads[0]["heavy_modules_loaded"]) or "none")),
        figure("cell_fixed_ms", "fixed cost per profiled cell: start + stop/persist + static rendering (median, process warm)",
               round(cell["total_s"] * 1e3, 1), "ms", "<= 150 ms", 150.0, gated=True,
               note=f"start {cell['start_s']*1e3:.0f} ms, stop {cell['stop_s']*1e3:.0f} ms, static {cell['static_s']*1e3:.0f} ms"),
        figure("first_cell_after_load_ext_ms", "the first profiled cell right after %load_ext (process started there, in the background)",
               round(cell["after_load_ext_total_s"] * 1e3, 1), "ms", "<= 150 ms", 150.0, gated=True,
               note=f"its start {cell['after_load_ext_start_s'] * 1e3:.0f} ms waits for what is not done yet of the "
                    f"sampler process's own start, {cell['process_start_cpu_s'] * 1e3:.0f} ms of CPU (Python, numpy, "
                    f"pyarrow, NVML, the run's modules); once that is done, a first cell costs "
                    f"{cell['after_start_total_s'] * 1e3:.0f} ms"),
        figure("live_cell_over_plain_ms", "a profiled cell with the live view over a plain one, 2 GPUs, warm (median)",
               round(warm_over * 1e3, 1), "ms", note=f"--quiet: {quiet_over * 1e3:.0f} ms; fresh IPython processes, fake NVML"),
        figure("static_ending_ms", "static ending per cell (PNG + plots + summary in place of the live view), 2 GPUs",
               round(ending * 1e3, 1), "ms", "<= 200 ms", 200.0, gated=True,
               note=f"first cell of a process: {statistics.median(r['first_ending_s'] for r in live) * 1e3:.0f} ms"),
        figure("first_live_cell_over_plain_ms", "the first profiled cell (live view, 2 GPUs) right after %load_ext, over a plain cell",
               round(first_over * 1e3, 1), "ms", "<= 500 ms", 500.0, gated=True,
               note=f"median of {len(live)} fresh processes, Bokeh templates cached by an earlier process; "
                    + (f"3 s after %load_ext: {(paused['first_s'] - paused['plain_first_s']) * 1e3:.0f} ms; "
                       f"the first run ever (templates built): {(new_cache['first_s'] - new_cache['plain_first_s']) * 1e3:.0f} ms"
                       if extra else "tiny mode: templates built by this process")),
        figure("cold_cell_ms", "a cold start: no %load_ext, the run starts the sampler process itself (profile() in a script)",
               round(cell["cold_total_s"] * 1e3, 1), "ms",
               note=f"of which start {cell['cold_start_s']*1e3:.0f} ms: a new Python with pyarrow and NVML (no pandas since issue 22); "
                    "the kernel's own one-off imports (Bokeh) are included too"),
    ]
    data = {"figures": figures, "load_ext_runs": loads, "cell": cell, "live_cells": live, "live_after_pause": paused,
            "live_new_cache": new_cache}
    save(NAME, data, mode)
    return data


if __name__ == "__main__":
    import sys

    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else "quick")["figures"], indent=1))
