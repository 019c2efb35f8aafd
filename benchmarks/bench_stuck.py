"""The stuck watch's costs (issue 41, parts 1 and 5): its cost per step, target <= 1 us, and the
pause a stack dump makes in the dumped process. Measured side by side in fresh interpreters.

* **Per step, side by side**: a training-like loop (each step: one ``ActivityLog.step()`` event
  and ~20 us of Python work) on the main thread while a thread hands over every 0.1 s as the
  link's thread does (the fold, ``ActivityLog.steps``), with the watch's ``check()`` in that
  hand-over and without, alternating blocks; the figure is the difference of the per-step
  medians (what the watch adds to the training thread, contention for the GIL included). The
  hand-over runs ten times as often as a run's (once a second), so the figure errs high.
* **check() alone**: one call of ``StuckWatch.check()`` over the run's own process and eight
  ranks of 10,000 steps each (what the link's thread does once a second), and that call spread
  over the steps of one second at a 10 ms step.
* **The dump's pause**: a child process registered as the child runtime registers (faulthandler
  on ``STACKS_SIGNAL``, main thread plus four waiting threads, 20 frames deep) runs a tight loop
  that records every gap between its iterations; the run dumps its stacks
  (``dump_child_stacks``) again and again. The figure is the loop's longest gap starting in the
  few ms around each signal (``WINDOW``; median over dumps), beside its longest gap in the same
  window 50 ms later, without a dump (what a shared machine's scheduler alone does).
  The holding process's own stacks (``sys._current_frames()``) pause its training thread for as
  long as taking them holds the GIL: timed the same way.
"""

from __future__ import annotations

import json
import statistics

from ._common import figure, run_json_subprocess, save

NAME = "stuck"
SIZES = {"tiny": (2, 200, 3), "quick": (15, 2_000, 30), "full": (40, 5_000, 100)}  # rounds, steps per block, dumps
TARGET_US = 1.0
WINDOW = (0.001, 0.006)  # a stall starting from 1 ms before the dump began to 6 ms after is the dump's
QUIET = 0.05  # the same window this long after: no dump there (the machine's own stalls)

_PER_STEP = """
import json, statistics, sys, threading, time
from gpuprof_jupyter.runtime.hooks.activity import ActivityLog
from gpuprof_jupyter.runtime.jobs.stuck_watch import StuckWatch

rounds, n = {rounds}, {n}

def work():
    return sum(range(300))  # a few us: the step path's share shows

def block(watched):
    t0 = time.monotonic()
    activity = ActivityLog(t0)
    watch = StuckWatch(t0, activity, None, None, lambda name, text: name, lambda r: None, [])
    stop = threading.Event()
    def hand_over():
        while not stop.wait(0.1):
            activity.steps  # the fold, as at each hand-over
            if watched:
                watch.check()
    thread = threading.Thread(target=hand_over, daemon=True)
    thread.start()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        work()
        activity.step()
        times.append(time.perf_counter() - start)
    stop.set()
    thread.join()
    return statistics.median(times)

plain, watched = [], []
for i in range(rounds):
    for w in ((False, True) if i % 2 else (True, False)):
        (watched if w else plain).append(block(w))

# check() alone: the run's own process and 8 ranks of 10,000 steps
class Child:
    def __init__(self, rank, t0):
        self.rank, self.label, self.closed, self.dropped = rank, f"rank {{rank}}", False, False
        self.hello = {{"pid": None}}
        self.activity = ActivityLog(t0)
        for k in range(10_000):
            self.activity.emit((1, t0 + 0.01 * k, None))

class Listener:
    def __init__(self, t0):
        self.children = [Child(r, t0) for r in range(8)]
        self.path = "/nonexistent/channel.sock"

    def connected(self):
        return self.children

t0 = time.monotonic() - 200.0
own = ActivityLog(t0)
for k in range(10_000):
    own.emit((1, t0 + 0.01 * k, None))
listener = Listener(t0)
watch = StuckWatch(t0, own, listener, 10_000.0, lambda name, text: name, lambda r: None, [])
watch.check()
checks = []
for _ in range(200):
    start = time.perf_counter()
    watch.check()
    checks.append(time.perf_counter() - start)
print(json.dumps({{"plain": plain, "watched": watched, "check": statistics.median(checks)}}))
"""

_CHILD = """
import faulthandler, json, sys, threading, time
from gpuprof_jupyter.core.child_channel import STACKS_FILE, STACKS_SIGNAL
folder, seconds = sys.argv[1], float(sys.argv[2])
import os
f = open(os.path.join(folder, STACKS_FILE.format(pid=os.getpid())), "a")
f.write("gpuprof main thread 0x%016x\\n" % threading.main_thread().ident); f.flush()
faulthandler.register(STACKS_SIGNAL, file=f, all_threads=True, chain=False)
for _ in range(4):
    threading.Thread(target=threading.Event().wait, daemon=True).start()
def deep(k):
    return deep(k - 1) if k else loop()
def loop():
    gaps, last = [], time.monotonic()
    end = last + seconds
    print("ready", flush=True)
    while last < end:
        now = time.monotonic()
        if now - last > 20e-6:
            gaps.append((last, now - last))
        last = now
    return gaps
print(json.dumps(deep(20)))
"""

_OWN = """
import json, statistics, threading, time
from gpuprof_jupyter.runtime.jobs.stuck_watch import own_threads
dumps = {dumps}
for _ in range(4):
    threading.Thread(target=threading.Event().wait, daemon=True).start()
marks, took = [], []
def taker():
    time.sleep(0.2)
    for _ in range(dumps):
        start = time.monotonic()
        own_threads(skip=threading.get_ident())
        took.append(time.monotonic() - start)
        marks.append(start)
        time.sleep(0.1)
thread = threading.Thread(target=taker)
thread.start()
gaps, last = [], time.monotonic()
while thread.is_alive():
    now = time.monotonic()
    if now - last > 20e-6:
        gaps.append((last, now - last))
    last = now
print(json.dumps({{"gaps": gaps, "marks": marks, "took": took}}))
"""


def _longest(gaps, start: float, end: float) -> float:
    return max([g for t, g in gaps if start <= t < end] or [0.0])


def dump_pause(dumps: int) -> dict:
    """The longest stall of a child's loop around each dump, and in windows without one."""
    import os
    import subprocess
    import sys
    import tempfile
    import time

    from gpuprof_jupyter.runtime.jobs.stuck_watch import dump_child_stacks

    from ._common import ROOT

    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        seconds = 0.5 + 0.25 * dumps
        proc = subprocess.Popen([sys.executable, "-c", _CHILD, folder, str(seconds)], stdout=subprocess.PIPE,
                                text=True, env=env, cwd=str(ROOT))
        assert proc.stdout.readline().strip() == "ready"
        marks, took = [], []
        time.sleep(0.1)
        for _ in range(dumps):
            start = time.monotonic()
            got = dump_child_stacks(folder, [proc.pid])
            took.append(time.monotonic() - start)
            if got:
                marks.append(start)
            time.sleep(0.15)
        gaps = json.loads(proc.stdout.read().strip().splitlines()[-1])
        proc.wait()
    during = [_longest(gaps, m - WINDOW[0], m + WINDOW[1]) for m in marks]
    quiet = [_longest(gaps, m + QUIET - WINDOW[0], m + QUIET + WINDOW[1]) for m in marks]
    return {"during": during, "quiet": quiet, "took": took, "dumped": len(marks)}


def run(mode: str = "quick") -> dict:
    rounds, n, dumps = SIZES[mode]
    per_step = run_json_subprocess(_PER_STEP.format(rounds=rounds, n=n))
    own = run_json_subprocess(_OWN.format(dumps=dumps))
    child = dump_pause(dumps)
    us, ms = 1e6, 1e3
    plain, watched = statistics.median(per_step["plain"]), statistics.median(per_step["watched"])
    added = watched - plain
    own_during = [_longest(own["gaps"], m - WINDOW[0], m + WINDOW[1]) for m in own["marks"]]
    own_quiet = [_longest(own["gaps"], m + QUIET - WINDOW[0], m + QUIET + WINDOW[1]) for m in own["marks"]]
    figures = [
        figure("step_us", "the stuck watch's cost per step on the training thread (watched - unwatched, the "
               "hand-over with check() 10x as often as a run's)", round(added * us, 3), "us",
               f"<= {TARGET_US:g} us", TARGET_US, gated=True,
               note=f"median step {plain * us:.2f} us unwatched vs {watched * us:.2f} us watched, {rounds} rounds of "
                    f"{n} steps each way"),
        figure("check_us", "one check() of the run's own process and 8 ranks of 10,000 steps (once a second, on the "
               "link's thread)", round(per_step["check"] * us, 1), "us",
               note=f"spread over one second of 10 ms steps: {per_step['check'] * us / 100:.3f} us a step"),
        figure("dump_pause_ms", "a rank's stack dump (faulthandler on STACKS_SIGNAL): the dumped process's longest "
               "stall around the signal (5 threads, 20 frames)", round(statistics.median(child["during"]) * ms, 3),
               "ms", note=f"median over {child['dumped']} dumps; longest stall in windows without a dump "
                          f"{statistics.median(child['quiet']) * ms:.3f} ms; the worst dump "
                          f"{max(child['during'] or [0]) * ms:.3f} ms; the run's wait for the file "
                          f"{statistics.median(child['took']) * ms:.1f} ms"),
        figure("own_pause_ms", "the holding process's own stacks (sys._current_frames()): its training thread's "
               "longest stall while they are taken", round(statistics.median(own_during) * ms, 3), "ms",
               note=f"taking them {statistics.median(own['took']) * ms:.3f} ms (median of {len(own['took'])}); "
                    f"longest stall in windows without {statistics.median(own_quiet) * ms:.3f} ms"),
    ]
    result = {"figures": figures, "per_step_s": per_step, "child": child,
              "own": {"during": own_during, "quiet": own_quiet, "took": own["took"]}}
    save(NAME, result, mode)
    return result


if __name__ == "__main__":
    import sys

    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else "quick")["figures"], indent=1))
