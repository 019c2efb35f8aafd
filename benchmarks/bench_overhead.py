"""Profiler overhead, in a real ipykernel whose sampler process reads a fake NVML with realistic
per-call latencies (``GPUPROF_FAKE_NVML``), 10 Hz, live view on.

* Kernel CPU: a torch CPU training loop runs under ``%%gpuprofile --source nvml``; inside the
  cell, the CPU time of every ``gpuprof-*`` thread of the *kernel* (the link, which also forwards the live view since issue 40)
  is read from /proc/self/task/<native_id>/schedstat before and after: share of one core.
  The GIL they can hold is bounded by that time.
* The sampler process: its CPU (/proc/PID/stat) per sample, and the cadence measured inside
  it (|actual - scheduled| tick starts, asked of it before the cell ends), beside the same
  figure of a bare 10 Hz sleeper process on the sampler's core(s) in the same seconds: the
  machine's own wake-up lateness, which no code of ours can beat.
* Wall clock: the same loop plain (A) and profiled (B) in A-B-B-A order, many pairs, at 1 and
  8 GPUs. Each cell runs the loop untimed for ``warm_s`` (the run's steady state: its live
  updates come once a second), then times it for ``pair_s``. The loop has one intra-op thread;
  where there are two cores or more, the training (main) thread is placed alone on one core and
  every other thread of the kernel (ours, ipykernel's, ZMQ's), with the sampler process, on the
  others (``os.sched_setaffinity``, again before each timed loop: a thread a run starts inherits
  the main thread's core). That is where a scheduler puts them when the machine has a core to
  spare, and what is measured is the profiler's cost to the training core, not threads made to
  queue behind it. IPython's input
  history is kept in memory (``NO_HISTORY_WRITES``). Each pair records the machine's load
  while it ran: the CPU used by processes other than the kernel, its sampler process and this
  runner (from /proc/stat), and the steal time; a pair taken under heavy interference
  (``INTERFERENCE``) is discarded and counted. "A busy process per core": one spinning process
  pinned to each core. Per kept pair the ratio B/A, the training thread's own on-CPU time
  (schedstat) and the CPU of the kernel's other threads; figures: the median and a 95 % t
  interval of the mean. Gate: the interval's upper bound (<= 1.05); aim: the median <= 1.01.
* The headline, the live view as a user meets it (issue 40, ``_live_blocks``): nothing placed,
  the live view switched on and off in alternating blocks of steps inside one profiled run, at
  1 and 8 GPUs, quiet and with a busy process per core; per thread of the kernel, what the view
  adds (CPU, wake-ups, the training thread's waits for the GIL).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import time

from ._common import ROOT, figure, mean_ci, pct, save
from ._train import TRAIN_SETUP

NAME = "overhead"
# a cell: ``warm_s`` untimed, then ``pair_s`` timed (two live updates; a run's start is bench_startup's)
CFG = {"tiny": {"share_s": 3.0, "pairs": 2, "pair_s": 0.3, "warm_s": 0.0},
       "quick": {"share_s": 30.0, "pairs": 24, "pair_s": 2.0, "warm_s": 1.0},
       "full": {"share_s": 60.0, "pairs": 80, "pair_s": 2.0, "warm_s": 1.0}}
# A pair is discarded when, while it ran, other processes used more than this share of one core
# on average, or steal time (the hypervisor running someone else) took more than this share of
# all CPU time: either can slow A or B alone by more than the 1 % the ratio must resolve.
INTERFERENCE = {"others_core_max": 0.15, "steal_frac_max": 0.02}

PLACEMENT = """
import os, torch
torch.set_num_threads(1)  # one intra-op thread: the loop is one core's work
from gpuprof_jupyter.runtime.link import sampler_link as _sl
if len(_cores) >= 2:
    _pin(_sl().pid, set(_cores[1:]))
    _placed = {"training_thread": [_cores[0]], "others": _cores[1:]}
    _place()
"""

THREADS = """
import os, threading, time as _time
_cores = sorted(os.sched_getaffinity(0))
_placed = None  # PLACEMENT sets it where there are two cores or more
def _pin(pid, cores):
    for tid in os.listdir(f"/proc/{pid}/task"):  # every thread (sched_setaffinity is per thread)
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:  # a thread that ended meanwhile
            pass
def _place():  # the training (main) thread alone on the first core, every other thread of the kernel on the others
    if _placed is not None:
        _pin(os.getpid(), set(_cores[1:]))
        os.sched_setaffinity(threading.main_thread().native_id, {_cores[0]})
def _sched():  # the training thread's (on-CPU ns, runnable-but-waiting ns), and every other thread's on-CPU ns
    me = threading.get_native_id()
    rest = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                fields = f.read().split()
        except OSError:  # a thread that ended meanwhile
            continue
        if int(tid) == me:
            own = [int(v) for v in fields[:2]]
        else:
            rest += int(fields[0])
    return own + [rest]
def _gp_cpu():
    out = {}
    for t in threading.enumerate():
        if t.name.startswith("gpuprof-"):
            try:
                with open(f"/proc/self/task/{t.native_id}/schedstat") as f:
                    out[f"{t.name}:{t.native_id}"] = int(f.read().split()[0])
            except OSError:
                pass
    return out
"""


# IPython saves each cell's input to SQLite from a thread of its own at the start of the next
# cell: in a plain cell that write ran inside the timed loop (2-3 ms of CPU in a 0.4 s loop, on
# the training core), in a profiled one it was over before the loop began (the magic's start
# outlasts it): a bias in the profiler's favour. The history is kept in memory until exit instead.
NO_HISTORY_WRITES = "get_ipython().history_manager.db_cache_size = 10**6"


def _setup() -> str:
    return f"""
import sys; sys.path.insert(0, {str(ROOT)!r})
{NO_HISTORY_WRITES}
{TRAIN_SETUP}
{THREADS}
"""


def _jiffies(pid: int) -> int:
    """utime + stime of a process, in clock ticks (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _machine_jiffies() -> tuple[int, int, int]:
    """(busy, steal, total) clock ticks of all CPUs since boot (/proc/stat's first line)."""
    with open("/proc/stat") as f:
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in f.readline().split()[1:9])
    return user + nice + system + irq + softirq, steal, user + nice + system + idle + iowait + irq + softirq + steal


class LoadWindow:
    """The machine's load over a window, apart from our own processes (the kernel, its sampler
    process, this runner): CPU of the others in cores, steal share, load average at the end."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self._start = self._read()

    def _read(self):
        own = sum(_jiffies(pid) for pid in self.pids)
        runner = os.times()
        return time.monotonic(), _machine_jiffies(), own, (runner.user + runner.system) * os.sysconf("SC_CLK_TCK")

    def close(self) -> dict:
        (t0, (b0, s0, all0), own0, run0), (t1, (b1, s1, all1), own1, run1) = self._start, self._read()
        tick = os.sysconf("SC_CLK_TCK")
        others = max(0.0, (b1 - b0) - (own1 - own0) - (run1 - run0)) / tick / max(t1 - t0, 1e-9)
        with open("/proc/loadavg") as f:
            load1 = float(f.read().split()[0])
        return {"others_core": round(others, 3), "steal_frac": round((s1 - s0) / max(all1 - all0, 1), 4),
                "load1": load1}


def interfered(load: dict) -> bool:
    return load["others_core"] > INTERFERENCE["others_core_max"] or load["steal_frac"] > INTERFERENCE["steal_frac_max"]


PROFILED_BODY = """
from gpuprof_jupyter.runtime.link import sampler_link as _sl
from gpuprof_jupyter.core.protocol import Ping
def _proc_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
import os
_pid = _sl().pid
_place()
_p0 = _proc_cpu(_pid); _c0 = _gp_cpu(); _w0 = _time.perf_counter()
train_steps(_steps)
_w1 = _time.perf_counter(); _c1 = _gp_cpu(); _p1 = _proc_cpu(_pid)
_ping = _sl().request(Ping(lateness=True))
_res = {"wall": _w1 - _w0, "cpu": {k: _c1[k] - _c0.get(k, 0) for k in _c1}, "lat": _ping["lateness"],
        "sampler_cpu_s": _p1 - _p0, "gaps": _ping["gaps"]}
"""


def _spin(core: int) -> None:
    """A busy process on ``core``: pinned, so each core has one for the whole run (left to the
    scheduler, they moved between cores from one cell to the next, and a cell sharing the
    training core with one took twice as long: a bimodal ratio that measured their placement)."""
    os.sched_setaffinity(0, {core})
    while True:
        pass


def _reference_ticker(cores, seconds: float, interval: float, queue) -> None:
    """A bare sleeper on the sampler's core(s), on the fast lane's schedule (it never drifts) and
    doing nothing else: its lateness is the machine's own (timer, scheduler, hypervisor)."""
    import threading

    if cores:
        os.sched_setaffinity(0, set(cores))
    wake, lateness = threading.Event(), []
    next_tick = time.monotonic() + interval / 2
    end = next_tick + seconds
    while next_tick < end:
        wake.wait(max(0.0, next_tick - time.monotonic()))
        lateness.append(abs(time.monotonic() - next_tick))
        next_tick += interval
    queue.put(lateness)


def _run_kernel(n_gpus: int, cfg: dict, abba: bool, place: bool = True, busy: bool = False) -> dict:
    from tests.kernel_helpers import execute, running_kernel, text_of
    import tempfile

    from ._common import fake_nvml_env

    env = {"GPUPROF_STORE": "", **fake_nvml_env(n_gpus, "h100", realistic=True)}
    with tempfile.TemporaryDirectory() as tmp, running_kernel(tmp, {**env, "GPUPROF_STORE": os.path.join(tmp, "store")}) as (km, kc):
        def run(code: str, timeout: float = 600) -> str:
            reply, msgs = execute(kc, code, timeout=timeout)
            if reply["status"] != "ok":
                raise RuntimeError(f"kernel cell failed: {text_of(msgs)[-2000:]}")
            return text_of(msgs)

        def value(expr: str):
            return printed(run(f"import json as _j; print('@@' + _j.dumps({expr}))"))

        def printed(text: str):
            return json.loads(text.split("@@", 1)[1].splitlines()[0])

        run("%load_ext gpuprof_jupyter\nimport gpuprof_jupyter")
        run(_setup())
        run("%%gpuprofile --source nvml -n warm\ntrain_steps(5)")  # the sampler process is up
        placed = None
        if place:
            run(PLACEMENT)
            placed = value("_placed")
        pids = [value("os.getpid()"), value("_sl().pid")]
        spinners = []
        if busy:  # a busy process per core, started here: their CPU is the condition, not interference
            spinners = [multiprocessing.get_context("spawn").Process(target=_spin, args=(core,), daemon=True)
                        for core in sorted(os.sched_getaffinity(0))]
            for spinner in spinners:
                spinner.start()
            pids += [s.pid for s in spinners]
        run(f"_steps = steps_for({cfg['share_s']})")
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        reference = ctx.Process(target=_reference_ticker, daemon=True,
                                args=(placed["others"] if placed else None, cfg["share_s"] + 3.0, 0.1, queue))
        reference.start()
        run("%%gpuprofile --source nvml -n share\n" + PROFILED_BODY)
        share = value("_res")
        share["reference_lat"] = queue.get(timeout=cfg["share_s"] + 60)
        reference.join(5)
        pairs = []
        if abba:
            run(f"_steps = steps_for({cfg['pair_s']}); _warm = steps_for({cfg['warm_s']}) if {cfg['warm_s']} else 0")
            plain = ("train_steps(_warm) if _warm else None\n_place()\n"
                     "_s0 = _sched(); _w0 = _time.perf_counter(); train_steps(_steps); _wall = _time.perf_counter() - _w0\n"
                     "_s1 = _sched(); import json as _j\n"
                     "print('@@' + _j.dumps({'wall': _wall, 'cpu': (_s1[0] - _s0[0]) / 1e9, 'wait': (_s1[1] - _s0[1]) / 1e9, "
                     "'rest': (_s1[2] - _s0[2]) / 1e9}))")
            prof = "%%gpuprofile --source nvml -n abba\n" + plain
            while len(pairs) < cfg["pairs"]:
                for first, second in ((plain, prof), (prof, plain)):  # A-B, then B-A
                    window = LoadWindow(pids)
                    x, y = printed(run(first)), printed(run(second))
                    a, b = (x, y) if first is plain else (y, x)
                    pairs.append({"a": a["wall"], "b": b["wall"], "a_cpu": a["cpu"], "b_cpu": b["cpu"],
                                  "a_wait": a["wait"], "b_wait": b["wait"], "a_rest": a["rest"], "b_rest": b["rest"],
                                  **window.close()})
            pairs = pairs[:cfg["pairs"]]
        for spinner in spinners:
            spinner.kill()
            spinner.join(5)
        return {"share": share, "pairs": pairs, "placed": placed}


def wall_ratio(pairs: list[dict]) -> dict:
    """The kept pairs' ratios (B/A): median, mean and its 95 % t interval; how many were discarded."""
    kept = [p for p in pairs if not interfered(p)]
    ratios = [p["b"] / p["a"] for p in kept]
    out = {"pairs": len(pairs), "kept": len(kept), "discarded": len(pairs) - len(kept),
           "others_core_median": statistics.median(p["others_core"] for p in pairs) if pairs else None,
           "load1_max": max((p["load1"] for p in pairs), default=None)}
    if len(ratios) >= 2:
        m, lo, hi = mean_ci(ratios)
        cpu = [p["b_cpu"] / p["a_cpu"] for p in kept]
        c_m, c_lo, c_hi = mean_ci(cpu)
        out.update(median=statistics.median(ratios), mean=m, ci_low=lo, ci_high=hi,
                   plain_s=statistics.median(p["a"] for p in kept),
                   # the wall time split: the training thread on its CPU, and runnable but waiting for one
                   cpu_ratio_median=statistics.median(cpu), cpu_ratio_ci=[c_lo, c_hi],
                   wait_share_plain=statistics.median(p["a_wait"] / p["a"] for p in kept),
                   wait_share_profiled=statistics.median(p["b_wait"] / p["b"] for p in kept),
                   # what profiling adds to the kernel's other threads (ours, ipykernel's I/O, ZMQ)
                   # while the loop runs: ms of CPU per s of wall time, profiled minus plain
                   rest_added_ms_per_s=statistics.median(1e3 * (p["b_rest"] / p["b"] - p["a_rest"] / p["a"])
                                                         for p in kept))
    return out


def run(mode: str = "quick") -> dict:
    import sys

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    cfg = CFG[mode]
    results = {}
    figures = []
    # 1 GPU quiet and with a busy process per core (the goal), 8 GPUs quiet beside them
    for n, busy in ((1, False), (1, True), (8, False)):
        tag, where = f"{n}gpu" + ("_busy" if busy else ""), f"{n} GPU(s)" + (", a busy process per core" if busy else "")
        r = _run_kernel(n, cfg, abba=True, busy=busy)
        share = r["share"]
        wall = share["wall"]
        total_ns = sum(share["cpu"].values())
        by_thread: dict[str, int] = {}
        for k, v in share["cpu"].items():
            by_thread[k.split(":")[0]] = by_thread.get(k.split(":")[0], 0) + v
        pct_core = 100.0 * total_ns / 1e9 / wall
        lat = share["lat"]
        per_sample_us = share["sampler_cpu_s"] / max(len(lat), 1) * 1e6
        results[tag] = {"wall_s": wall, "thread_cpu_ns": by_thread, "cpu_pct_of_core": pct_core,
                        "sampler_cpu_s": share["sampler_cpu_s"], "late_ms_p50": pct(lat, 50) * 1e3,
                              "late_ms_p99": pct(lat, 99) * 1e3, "ticks": len(lat), "gaps": share["gaps"],
                              "pairs": r["pairs"]}
        if not busy:
            figures.append(figure(f"kernel_cpu_{tag}", f"kernel's profiler threads (gpuprof-*: the link, forwarding the live view too), % of one core, 10 Hz, {where}, live view, torch loop",
                                round(pct_core, 3), "%", "<= 0.5 %", 0.5, gated=True,
                                note=", ".join(f"{k} {v / 1e6 / wall:.2f} ms/s" for k, v in sorted(by_thread.items()))
                                     + f"; {wall:.0f} s measured; the GIL they can hold is bounded by this time"))
        figures.append(figure(f"sampler_process_cpu_{tag}", f"sampler process CPU per sample (NVML fake + host + writes), {where}",
                              round(per_sample_us, 1), "µs", note=f"{share['sampler_cpu_s']:.2f} s CPU for {len(lat)} ticks "
                                                                   f"({100 * share['sampler_cpu_s'] / wall:.1f} % of a core, its own process)"))
        ref = share["reference_lat"]
        results[tag].update(reference_late_ms_p99=pct(ref, 99) * 1e3, reference_late_ms_max=max(ref) * 1e3)
        figures.append(figure(f"process_p99_late_ms_{tag}", f"cadence inside the sampler process: p99 |actual - scheduled|, {where}, 10 Hz",
                              round(pct(lat, 99) * 1e3, 2), "ms", "<= 2 ms", 2.0, gated=True,
                              note=f"p50 {pct(lat, 50) * 1e3:.2f} ms, max {max(lat) * 1e3:.1f} ms, {len(lat)} ticks, "
                                   f"{len(share['gaps'])} recorded gaps"))
        figures.append(figure(f"reference_p99_late_ms_{tag}", f"the machine's own: p99 |actual - scheduled| of a bare 10 Hz "
                                                              f"sleeper process on the sampler's core(s), same seconds, {where}",
                              round(pct(ref, 99) * 1e3, 2), "ms",
                              note=f"p50 {pct(ref, 50) * 1e3:.2f} ms, max {max(ref) * 1e3:.1f} ms, {len(ref)} ticks"))
        ratio = wall_ratio(r["pairs"])
        results[tag]["placed"] = r["placed"]
        results[tag]["wall_ratio"] = ratio
        if "ci_high" in ratio:
            figures.append(figure(
                f"wall_ratio_{tag}", f"wall time profiled / plain, {ratio['kept']} kept A-B pairs, {where}: 95 % CI upper bound",
                round(ratio["ci_high"], 4), "x", "<= 1.05 (aim: median <= 1.01)", 1.05, gated=True,
                note=f"median {ratio['median']:.4f}, mean {ratio['mean']:.4f}, 95 % CI [{ratio['ci_low']:.4f}, "
                     f"{ratio['ci_high']:.4f}]; {ratio['discarded']} of {ratio['pairs']} pairs discarded for "
                     f"interference (others' CPU median {ratio['others_core_median']:.2f} core, load1 max "
                     f"{ratio['load1_max']:.1f}); loop {ratio['plain_s']:.2f} s plain; "
                     + (f"training thread on CPU {r['placed']['training_thread']}, the kernel's other threads and the "
                        f"sampler process on {r['placed']['others']}"
                        if r["placed"] else "no placement (one core)")))
            figures.append(figure(f"wall_ratio_median_{tag}", f"wall time profiled / plain, median of the kept pairs, {where}",
                                  round(ratio["median"], 4), "x", "<= 1.01", 1.01, gated=False))
            figures.append(figure(
                f"train_cpu_ratio_{tag}", f"training thread's on-CPU time profiled / plain (schedstat), median of the kept pairs, {where}",
                round(ratio["cpu_ratio_median"], 4), "x",
                note=f"95 % CI of the mean [{ratio['cpu_ratio_ci'][0]:.4f}, {ratio['cpu_ratio_ci'][1]:.4f}]; runnable but "
                     f"waiting for a CPU: {100 * ratio['wait_share_plain']:.2f} % of the wall time plain, "
                     f"{100 * ratio['wait_share_profiled']:.2f} % profiled"))
            figures.append(figure(
                f"kernel_threads_added_{tag}", f"CPU that profiling adds to the kernel's other threads while the loop runs "
                f"(ours, ipykernel's I/O, ZMQ: profiled - plain, schedstat), median of the kept pairs, {where}",
                round(ratio["rest_added_ms_per_s"], 3), "ms/s",
                note="on the other core(s), with the sampler process, where there are two (the placement above); "
                     "they still take the GIL from the training thread for up to this time"))
        else:
            figures.append(figure(f"wall_ratio_{tag}", f"wall time profiled / plain, {where}: too few pairs kept",
                                  None, "x", "<= 1.05 (aim: median <= 1.01)", 1.05, gated=True,
                                  note=f"{ratio['discarded']} of {ratio['pairs']} pairs discarded for interference "
                                       f"(others' CPU median {ratio['others_core_median']} core)"))
    from . import _live_blocks

    unplaced, headline = _live_blocks.run(mode)  # the scheduler's own placement: the rows a user meets
    results.update(unplaced)
    figures = headline + figures
    data = {"figures": figures, "runs": results, "config": {**cfg, "unplaced": _live_blocks.CFG[mode]}}
    save(NAME, data, mode)
    return data


if __name__ == "__main__":
    import sys

    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else "quick")["figures"], indent=1))
