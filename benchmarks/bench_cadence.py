"""Cadence (issue 9, part 6): p99 of |actual - scheduled| tick start, measured inside the
sampler process, at 10 Hz and 100 Hz with 8 fake GPUs (realistic latencies), while this
process (standing for the kernel) trains a torch CPU loop and a busy process runs on each
core. Recorded gaps are reported with it.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import tempfile
import time

from ._common import fake_nvml_env, figure, pct, save
from ._train import namespace

NAME = "cadence"
SECONDS = {"tiny": 2.0, "quick": 15.0, "full": 60.0}


def _spin(stop) -> None:
    while not stop.is_set():
        pass


def busy_cores():
    """A busy process on each core, as the brief asks (returns a function stopping them)."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_spin, args=(stop,), daemon=True) for _ in range(os.cpu_count() or 1)]
    for p in procs:
        p.start()

    def finish() -> None:
        stop.set()
        for p in procs:
            p.join(5)

    return finish


def _session_run(n_gpus: int, seconds: float, interval: float) -> dict:
    from gpuprof_jupyter.runtime.session import ProfileSession
    from gpuprof_jupyter.runtime.link import sampler_link
    from gpuprof_jupyter.core.protocol import Ping

    os.environ.update(fake_nvml_env(n_gpus, "h100", realistic=True))
    link = sampler_link()
    link.close()
    link.ensure()
    ns = namespace()
    ns["train_steps"](5)  # warm
    with tempfile.TemporaryDirectory() as store:
        session = ProfileSession("cadence", interval=interval, source="nvml", store=store).start()
        t = time.perf_counter()
        while time.perf_counter() - t < seconds:  # a fixed time, not a step count calibrated before:
            ns["train_steps"](5)  # the spinners make a step's time vary too much to plan on it
        elapsed = time.perf_counter() - t
        ping = link.request(Ping(lateness=True))
        experiment = session.stop()
    lateness = ping["lateness"]
    gaps = experiment.meta.gaps
    return {
        "n_gpus": n_gpus, "interval": interval, "seconds": elapsed, "ticks": len(lateness),
        "expected_ticks": int(elapsed / interval),
        "late_ms_p50": pct(lateness, 50) * 1e3, "late_ms_p99": pct(lateness, 99) * 1e3,
        "late_ms_max": max(lateness) * 1e3 if lateness else None,
        "gaps": len(gaps), "gap_s": sum(g[1] - g[0] for g in gaps),
    }


def run(mode: str = "quick") -> dict:
    seconds = SECONDS[mode]
    finish = busy_cores()
    try:
        runs = {f"{hz}hz_8gpu": _session_run(8, seconds, 1.0 / hz) for hz in (10, 100)}
    finally:
        finish()
        os.environ.pop("GPUPROF_FAKE_NVML", None)
    figures = []
    for key, r in runs.items():
        hz = round(1 / r["interval"])
        figures.append(figure(f"p99_late_ms_{key}", f"p99 |actual - scheduled| tick start in the sampler process, {hz} Hz, "
                                                    f"{r['n_gpus']} GPUs, kernel training, a busy process per core",
                              round(r["late_ms_p99"], 2), "ms", "<= 2 ms", 2.0, gated=True,
                              note=f"p50 {r['late_ms_p50']:.2f} ms, max {r['late_ms_max']:.1f} ms, "
                                   f"{r['ticks']} of {r['expected_ticks']} ticks in {r['seconds']:.0f} s"))
        figures.append(figure(f"gaps_{key}", f"recorded gaps (a tick > 2 intervals late), {hz} Hz, {r['n_gpus']} GPUs",
                              r["gaps"], "gaps", note=f"{r['gap_s']:.2f} s in gaps"))
    data = {"figures": figures, "runs": runs}
    save(NAME, data, mode)
    return data


if __name__ == "__main__":
    import sys

    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else "quick")["figures"], indent=1))
