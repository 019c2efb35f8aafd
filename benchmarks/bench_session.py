"""The session record's cost (issue 39, part 1): what ``%load_ext`` alone costs while nothing is profiled.

Three figures, each in a fresh interpreter that stands for the kernel (the link to the sampler
process and the cell events, no Jupyter):

* the kernel's threads while idle, with the record on: the kernel process's CPU time (every
  thread's, from ``/proc``'s schedstat, in ns) over a window in which it runs no cell, as % of
  one core (its only thread of ours is the link's);
* the sampler process at the record's 1 Hz with 8 fake GPUs (realistic NVML latencies,
  ``_common.fake_nvml_env``): its CPU over the same window with the record on, minus the
  same process idle with the record off (both in the note), as % of one core;
* a plain cell's fixed cost with the record on: IPython's ``pre_run_cell`` and
  ``post_run_cell`` handlers (``notebook/profiled_cell.py``) run back to back, median, against
  the same with the record off.
"""

from __future__ import annotations

from ._common import figure, run_json_subprocess, save

NAME = "session"
WINDOW_S = {"tiny": 3.0, "quick": 20.0, "full": 60.0}
MARKS = {"tiny": 200, "quick": 2000, "full": 10000}

IDLE = """
import json, os, sys, tempfile, time
sys.path.insert(0, os.getcwd())
from benchmarks._common import fake_nvml_env
os.environ.update(fake_nvml_env(8, "a100", realistic=True))
from gpuprof_jupyter.core.protocol import Ping, SessionControl
from gpuprof_jupyter.runtime.link import sampler_link
link = sampler_link().ensure()
link.request(Ping(), timeout=60)
store = tempfile.mkdtemp()
def cpu_s(pid):  # every thread's CPU time, in ns (schedstat): finer than the 10 ms of cpu_times()
    total = 0
    for task in os.listdir(f"/proc/{{pid}}/task"):
        try:
            with open(f"/proc/{{pid}}/task/{{task}}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError):
            pass
    return total / 1e9
def window(on):
    link.tell(SessionControl(on=on, interval=1.0, store=store))
    time.sleep(3.0)  # the record's thread opened its sources (or stopped)
    k0, p0, w0 = cpu_s(os.getpid()), cpu_s(link.pid), time.monotonic()
    time.sleep({window})
    k1, p1, w1 = cpu_s(os.getpid()), cpu_s(link.pid), time.monotonic()
    return (k1 - k0) / (w1 - w0) * 100, (p1 - p0) / (w1 - w0) * 100
off_kernel, off_process = window(False)
on_kernel, on_process = window(True)
print(json.dumps({{"kernel_on_pct": on_kernel, "kernel_off_pct": off_kernel,
                  "process_on_pct": on_process, "process_off_pct": off_process}}))
"""

MARK = """
import json, os, statistics, sys, tempfile, time
sys.path.insert(0, os.getcwd())
from benchmarks._common import fake_nvml_env
os.environ.update(fake_nvml_env(8, "a100", realistic=True))
from gpuprof_jupyter.core.protocol import Ping
from gpuprof_jupyter.notebook import profiled_cell, session_cells
from gpuprof_jupyter.runtime.link import sampler_link
sampler_link().ensure().request(Ping(), timeout=60)
class Info:
    raw_cell = "x = sum(range(10))\\n"
class Result:
    info, error_before_exec, error_in_exec = Info, None, None
def marks(n):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        profiled_cell._pre_run_cell(Info)
        profiled_cell._post_run_cell(Result)
        times.append(time.perf_counter() - t)
    return statistics.median(times), sorted(times)[int(0.99 * (len(times) - 1))]
off = marks({n})
session_cells.turn_on(tempfile.mkdtemp())
on = marks({n})
print(json.dumps({{"on_median_s": on[0], "on_p99_s": on[1], "off_median_s": off[0]}}))
"""


def run(mode: str = "quick") -> dict:
    idle = run_json_subprocess(IDLE.format(window=WINDOW_S[mode]), timeout=300)
    marks = run_json_subprocess(MARK.format(n=MARKS[mode]), timeout=300)
    record_pct = idle["process_on_pct"] - idle["process_off_pct"]
    figures = [
        figure("session_kernel_idle_cpu_pct", "the kernel's threads while idle, session record on (% of a core)",
               round(idle["kernel_on_pct"], 3), "%", "<= 0.05 %", 0.05, gated=True,
               note=f"record off: {idle['kernel_off_pct']:.3f} %; {WINDOW_S[mode]:g} s window"),
        figure("session_sampler_cpu_pct", "the sampler process's record at 1 Hz, 8 fake GPUs (% of a core, on minus off)",
               round(record_pct, 3), "%", "<= 0.3 %", 0.3, gated=True,
               note=f"on {idle['process_on_pct']:.3f} %, off {idle['process_off_pct']:.3f} %; realistic fake latencies"),
        figure("session_plain_cell_ms", "a plain cell's fixed cost with the record on (pre/post_run_cell, median)",
               round(marks["on_median_s"] * 1e3, 3), "ms", "<= 2 ms", 2.0, gated=True,
               note=f"p99 {marks['on_p99_s'] * 1e3:.3f} ms; record off {marks['off_median_s'] * 1e3:.3f} ms; "
                    f"{MARKS[mode]} cells"),
    ]
    data = {"idle": idle, "marks": marks, "figures": figures}
    save(NAME, data, mode)
    return data
