"""The live view's cost as a user meets it (issue 40): no placement, the live view switched on
and off in alternating blocks of steps inside one profiled run.

Runs in the benchmark runner; the cell code below runs in a real ipykernel it drives.

Whole cells, plain against profiled, differ by more from one cell to the next on a small shared
machine than the live view costs (issue 40: the same loop took 5.6 s in one cell and 9.6 s in
another). So one ``%%gpuprofile --source nvml`` cell, live view on, runs the torch loop of the
overhead benchmark (one intra-op thread) in blocks of ``block_s``, and between blocks switches
the live view's work in the kernel off and on (``LiveDashboard.pause``/``resume``: while paused
it sends nothing to the page), in A-B / B-A order, as ``bench_hooks`` alternates hooked and plain
blocks. Nothing is pinned: every thread and process is where the scheduler puts it. Per round,
the ratio of the mean step time with the view on to the one with it off; per block, for every
thread of the kernel, its on-CPU time and its time runnable but waiting for a CPU (schedstat)
and its voluntary and involuntary context switches (``/proc/self/task/<tid>/status``), and the
sampler process's CPU. The training thread's voluntary switches are its waits: it releases the
GIL around each torch op, and when another thread holds it then, it sleeps until given it back.
Another thread's voluntary switches are its sleeps, so as many wake-ups (each one a GIL
acquisition). What is off while paused is the kernel's part only: the sampler process prepares
the view's changes and sends its update once a second either way (the link's thread wakes for
it with or without the live view, to hand over the run's events).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics

from ._common import ROOT, mean_ci

CFG = {"tiny": {"rounds": 2, "block_s": 0.4, "warm_s": 0.0},
       "quick": {"rounds": 12, "block_s": 2.0, "warm_s": 2.0},
       "full": {"rounds": 40, "block_s": 2.0, "warm_s": 2.0}}
MIN_KEPT = 4  # rounds free of interference below which every round counts (and the figure says so)

KERNEL_CODE = """
import os, threading, time as _time, torch
torch.set_num_threads(1)  # one intra-op thread: the loop is one core's work
def _lb_group(tid, names, main):
    if tid == main:
        return "training"
    name = names.get(tid)
    if name is None:
        with open(f"/proc/self/task/{tid}/comm") as f:
            name = f.read().strip()
    return "ZMQ (C)" if name.startswith("ZMQbg") else name.split(" (")[0]
def _lb_threads():  # group -> [on-CPU ns, runnable-waiting ns, voluntary, involuntary switches]
    main = threading.main_thread().native_id
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                cpu, wait = (int(v) for v in f.read().split()[:2])
            with open(f"/proc/self/task/{tid}/status") as f:
                status = f.read()
            group = _lb_group(int(tid), names, main)
        except OSError:  # a thread that ended meanwhile
            continue
        vol = int(status.split("\\nvoluntary_ctxt_switches:")[1].split()[0])
        invol = int(status.split("\\nnonvoluntary_ctxt_switches:")[1].split()[0])
        row = out.setdefault(group, [0, 0, 0, 0])
        for i, v in enumerate((cpu, wait, vol, invol)):
            row[i] += v
    return out
def _lb_jiffies(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])
def _lb_machine():  # (busy, steal, total) clock ticks of all CPUs (/proc/stat)
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return v[0] + v[1] + v[2] + v[5] + v[6], v[7], sum(v)
def _lb_cpu(pids):  # clock ticks of these processes (one that ended meanwhile counts from then on as 0)
    total = 0
    for p in pids:
        try:
            total += _lb_jiffies(p)
        except OSError:
            pass
    return total
def _lb_blocks(rounds, n, warm, ours=(), watch=None):
    # ours: the busy processes that are the condition, not interference; watch: {name: pids} (the
    # browser, the Jupyter server) whose CPU each block records, and which are the condition too
    watch = watch or {}
    ours = (*ours, *(p for pids in watch.values() for p in pids))
    from gpuprof_jupyter.notebook import profiled_cell
    from gpuprof_jupyter.runtime.link import sampler_link
    dash, pid, clock = profiled_cell._run.dashboard, sampler_link().pid, _time.perf_counter_ns
    if not hasattr(dash, "pause"):  # a dashboard from before issue 40 (an older checkout, side by side)
        _live, dash.paused = dash.live, False
        dash.live = lambda update: None if dash.paused else _live(update)
        dash.pause, dash.resume = (lambda: setattr(dash, "paused", True)), (lambda: setattr(dash, "paused", False))
    train_steps(warm) if warm else None  # the run's steady state: its updates come once a second
    blocks = []
    for r in range(rounds):
        for on in ((True, False) if r % 2 == 0 else (False, True)):
            dash.resume() if on else dash.pause()
            sent0 = dash.doc_updates
            m0, o0, w0 = _lb_machine(), _lb_cpu((os.getpid(), pid, *ours)), {k: _lb_cpu(v) for k, v in watch.items()}
            s0, p0, t0 = _lb_threads(), _lb_jiffies(pid), clock()
            steps = []
            for _ in range(n):
                a = clock(); train_steps(1); steps.append(clock() - a)
            t1, p1, s1 = clock(), _lb_jiffies(pid), _lb_threads()
            m1, o1, w1 = _lb_machine(), _lb_cpu((os.getpid(), pid, *ours)), {k: _lb_cpu(v) for k, v in watch.items()}
            tick = os.sysconf("SC_CLK_TCK")
            steps.sort()
            blocks.append({"on": on, "round": r, "wall_s": (t1 - t0) / 1e9, "steps": n,
                           "step_mean_s": sum(steps) / n / 1e9, "step_median_s": steps[n // 2] / 1e9,
                           "step_p99_s": steps[min(n - 1, int(0.99 * n))] / 1e9, "sent": dash.doc_updates - sent0,
                           "sampler_cpu_s": (p1 - p0) / tick, "watched_cpu_s": {k: (w1[k] - w0[k]) / tick for k in watch},
                           "others_core": max(0, (m1[0] - m0[0]) - (o1 - o0)) / tick / ((t1 - t0) / 1e9),
                           "steal_frac": (m1[1] - m0[1]) / max(m1[2] - m0[2], 1),
                           "threads": {g: [v - s0.get(g, [0, 0, 0, 0])[i] for i, v in enumerate(row)]
                                       for g, row in s1.items()}})
    dash.resume()
    return blocks
"""


def _spinners() -> list:
    """A busy process pinned to each core (left to the scheduler, they move between cores and the
    condition changes from block to block); the kernel's threads stay unplaced."""
    from .bench_overhead import _spin

    ctx = multiprocessing.get_context("spawn")
    spinners = [ctx.Process(target=_spin, args=(core,), daemon=True) for core in sorted(os.sched_getaffinity(0))]
    for spinner in spinners:
        spinner.start()
    return spinners


def run_kernel(n_gpus: int, cfg: dict, switch_interval: float | None = None) -> dict:
    """One kernel, two profiled runs of alternating blocks: quiet, then with a busy process per
    core. {"quiet": blocks, "busy": blocks}. ``switch_interval``: the kernel's
    ``sys.setswitchinterval`` (how long a thread that wants the GIL waits before it is forced
    over; Python's default 5 ms), to see what the GIL's hand-overs cost."""
    import tempfile

    from tests.kernel_helpers import execute, running_kernel, text_of

    from ._common import fake_nvml_env
    from ._train import TRAIN_SETUP
    from .bench_overhead import NO_HISTORY_WRITES

    env = fake_nvml_env(n_gpus, "h100", realistic=True)
    with tempfile.TemporaryDirectory() as tmp, running_kernel(tmp, {**env, "GPUPROF_STORE": os.path.join(tmp, "store")}) as (_, kc):
        def run(code: str) -> str:
            reply, msgs = execute(kc, code, timeout=900)
            if reply["status"] != "ok":
                raise RuntimeError(f"kernel cell failed: {text_of(msgs)[-2000:]}")
            return text_of(msgs)

        run("%load_ext gpuprof_jupyter")
        run(f"import sys; sys.path.insert(0, {str(ROOT)!r})\n{NO_HISTORY_WRITES}\n{TRAIN_SETUP}\n{KERNEL_CODE}")
        if switch_interval is not None:
            run(f"import sys; sys.setswitchinterval({switch_interval})")
        run("%%gpuprofile --source nvml -n warm\ntrain_steps(5)")  # the sampler process is up
        run(f"_n = steps_for({cfg['block_s']}); _warm = steps_for({cfg['warm_s']}) if {cfg['warm_s']} else 0")
        out = {}
        for condition in ("quiet", "busy"):
            spinners = _spinners() if condition == "busy" else []
            cell = ("%%gpuprofile --source nvml -n live-blocks\n"
                    f"import json as _j; print('@@' + _j.dumps(_lb_blocks({cfg['rounds']}, _n, _warm, "
                    f"{[s.pid for s in spinners]!r})))")
            try:
                out[condition] = json.loads(run(cell).split("@@", 1)[1].splitlines()[0])
            finally:
                for spinner in spinners:
                    spinner.kill()
                    spinner.join(5)
        return out


def summarise(blocks: list[dict]) -> dict:
    """Per round, mean step on / off: median, mean and 95 % t interval; per state (on, off), what
    each thread group of the kernel did per second of the loop, and the sampler process's CPU."""
    from .bench_overhead import interfered

    rounds: dict[int, dict] = {}
    for b in blocks:
        rounds.setdefault(b["round"], {})["on" if b["on"] else "off"] = b
    whole = [r for r in rounds.values() if len(r) == 2]
    kept = [r for r in whole if not any(interfered(b) for b in r.values())]
    # rounds in which other processes used the machine are left out, as bench_overhead's pairs are;
    # where fewer than MIN_KEPT are left (a shared machine), every round counts, and the note says so
    used = kept if len(kept) >= MIN_KEPT else whole
    ratios = [r["on"]["step_mean_s"] / r["off"]["step_mean_s"] for r in used]
    out: dict = {"rounds": len(whole), "kept": len(kept), "all_rounds_used": used is whole, "ratios": ratios,
                 "others_core_median": statistics.median(b["others_core"] for b in blocks) if blocks else None}
    if len(ratios) >= 2:
        m, lo, hi = mean_ci(ratios)
        out.update(median=statistics.median(ratios), mean=m, ci_low=lo, ci_high=hi,
                   median_step_ratio=statistics.median(r["on"]["step_median_s"] / r["off"]["step_median_s"]
                                                       for r in used))
    for state in ("on", "off"):
        these = [b for b in blocks if b["on"] == (state == "on")]
        wall = sum(b["wall_s"] for b in these) or 1e-9
        groups: dict[str, list] = {}
        for b in these:
            for g, row in b["threads"].items():
                acc = groups.setdefault(g, [0, 0, 0, 0])
                for i, v in enumerate(row):
                    acc[i] += v
        out[state] = {
            "step_mean_ms": 1e3 * statistics.median(b["step_mean_s"] for b in these),
            "sent_per_s": sum(b["sent"] for b in these) / wall,
            "sampler_cpu_pct": 100 * sum(b["sampler_cpu_s"] for b in these) / wall,
            # the watched processes' (the browser's, the Jupyter server's) CPU, % of one core
            "watched_pct": {k: 100 * sum(b.get("watched_cpu_s", {}).get(k, 0.0) for b in these) / wall
                            for k in sorted({k for b in these for k in b.get("watched_cpu_s", {})})},
            # per thread group, per second of the loop: CPU ms, runnable-waiting ms, voluntary and involuntary switches
            "threads": {g: {"cpu_ms_s": v[0] / 1e6 / wall, "wait_ms_s": v[1] / 1e6 / wall,
                            "vol_s": v[2] / wall, "invol_s": v[3] / wall} for g, v in sorted(groups.items())},
        }
    return out


def added(summary: dict, group: str, key: str) -> float:
    """What the live view adds to a thread group's figure (per second): on minus off."""
    on, off = (summary[s]["threads"].get(group, {}).get(key, 0.0) for s in ("on", "off"))
    return on - off


__all__ = ["CFG", "run_kernel", "summarise", "added"]


def figures(results: dict, setting: str = "no placement (the scheduler's own)") -> list[dict]:
    """The unplaced rows of the overhead table, from ``{tag: summarise(...)}`` (tags such as
    ``unplaced_1gpu_busy``); ``setting``: what the runs had around them, for the labels."""
    from ._common import figure

    cores = os.cpu_count() or 1
    rows = []
    for tag, s in results.items():
        busy = tag.endswith("_busy")
        n = tag.split("_")[1]
        where = f"{n[:-3]} GPU(s), {cores} cores, " + ("a busy process per core" if busy else "quiet")
        # issue 40's goal: 1.02 quiet and 1.05 with a busy process per core on 2 cores; 1.01 where a core is free
        limit = 1.05 if busy else (1.02 if cores <= 3 else 1.01)
        if "median" not in s:
            rows.append(figure(f"live_ratio_{tag}", f"live view on / off, {setting}, {where}: too few rounds",
                               None, "x", f"<= {limit}", limit, gated=True))
            continue
        rows.append(figure(
            f"live_ratio_{tag}", f"live view on / off, mean step time, {setting}, {where}: "
            f"median of {len(s['ratios'])} rounds of alternating blocks in one run", round(s["median"], 4), "x",
            f"<= {limit}", limit, gated=True,
            note=(f"every round counted: only {s['kept']} free of interference (others' CPU median "
                  f"{s['others_core_median']:.2f} core); " if s["all_rounds_used"]
                  else f"{s['rounds'] - s['kept']} of {s['rounds']} rounds left out for interference; ")
                 + f"mean {s['mean']:.4f}, 95 % CI [{s['ci_low']:.4f}, {s['ci_high']:.4f}]; median step on / off "
                 f"{s['median_step_ratio']:.4f}; step {s['off']['step_mean_ms']:.2f} ms off; "
                 f"{s['on']['sent_per_s']:.1f} comm sends of plots a second on"))
        train = "training"
        rows.append(figure(
            f"live_training_waits_{tag}", f"the training thread's added voluntary switches a second (waits for the GIL), "
            f"live view on - off, {where}", round(added(s, train, "vol_s"), 2), "/s",
            note=f"involuntary switches {added(s, train, 'invol_s'):+.2f} /s, runnable but waiting "
                 f"{added(s, train, 'wait_ms_s'):+.3f} ms/s, own CPU {added(s, train, 'cpu_ms_s'):+.2f} ms/s; "
                 f"off: {s['off']['threads'].get(train, {}).get('vol_s', 0):.1f} voluntary /s"))
        others = sorted(g for g in set(s["on"]["threads"]) | set(s["off"]["threads"]) if g != train)
        rows.append(figure(
            f"live_threads_added_{tag}", f"CPU the live view adds to the kernel's other threads, on - off, {where}",
            round(sum(added(s, g, "cpu_ms_s") for g in others), 3), "ms/s",
            note="; ".join(f"{g} {added(s, g, 'cpu_ms_s'):+.2f} ms/s, {added(s, g, 'vol_s'):+.1f} wake-ups/s "
                           f"({s['on']['threads'].get(g, {}).get('vol_s', 0):.1f} on)"
                           for g in others if abs(added(s, g, "vol_s")) >= 0.05 or abs(added(s, g, "cpu_ms_s")) >= 0.01)
                 + f"; sampler process {s['on']['sampler_cpu_pct']:.1f} % of a core on, {s['off']['sampler_cpu_pct']:.1f} % off"))
    return rows


def run(mode: str, switch_interval: float | None = None, gpus: tuple = (1, 8)) -> tuple[dict, list[dict]]:
    """Both GPU counts, quiet and busy: ({tag: summary with its blocks}, figures)."""
    cfg = CFG[mode]
    results = {}
    for n in gpus:
        runs = run_kernel(n, cfg, switch_interval)
        for condition, blocks in runs.items():
            results[f"unplaced_{n}gpu" + ("_busy" if condition == "busy" else "")] = {**summarise(blocks), "blocks": blocks}
    return results, figures(results)


if __name__ == "__main__":  # the unplaced rows alone, printed (the table's come from bench_overhead)
    import argparse
    import sys

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    parser = argparse.ArgumentParser(prog="python -m benchmarks._live_blocks")
    parser.add_argument("mode", nargs="?", default="quick", choices=sorted(CFG))
    parser.add_argument("--switch-interval", type=float, help="the kernel's sys.setswitchinterval, in seconds")
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    _, rows = run(args.mode, args.switch_interval, tuple(args.gpus))
    print(json.dumps(rows, indent=1))
