"""The --trace window's cost (issue 14, part 6): a torch CPU training loop profiled with
``trace="steps=A:B"``; step time inside the window against outside it, measured side by side
in the same run (each round one session, the window in its middle), plus the profiler's own
start, stop and export times and the saved trace's size.

CPU activities only: this machine has no GPU. With CUDA the profiler also records kernels
(CUPTI), whose cost is not measured here.
"""

from __future__ import annotations

import json
import statistics

from ._common import figure, mean_ci, run_json_subprocess, save

NAME = "trace"
SIZES = {"tiny": (1, 12, 4, 8), "quick": (5, 60, 20, 40), "full": (10, 120, 40, 80)}  # rounds, steps, A, B


def worker(rounds: int, steps: int, a: int, b: int) -> dict:
    """In a fresh interpreter: ``rounds`` sessions of ``steps`` steps traced over steps a..b-1."""
    import os
    import tempfile

    import gpuprof_jupyter as gp
    from benchmarks._train import namespace
    from gpuprof_jupyter.core.store.directory import Store

    ns = namespace()
    ns["train_steps"](20)  # warm up outside any session
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            with gp.profile(name=f"round{r}", source="host", store=tmp, trace=f"steps={a}:{b}") as p:
                for _ in range(steps):
                    ns["train_steps"](1)
                    gp.step(128)
            exp = p.experiment
            info, overhead = exp.meta.trace, exp.summary["trace"]["overhead"]
            path = Store(tmp).directory(exp.meta) / info["file"]
            out.append({"slowdown": overhead["slowdown"], "in_s": overhead["step_p50_in_s"],
                        "out_s": overhead["step_p50_out_s"], "start_s": info["start_cost_s"],
                        "stop_s": info["stop_cost_s"], "export_s": info["export_cost_s"],
                        "events": info["events"], "bytes": os.path.getsize(path), "steps": info["steps"],
                        "activities": info["activities"]})
    return {"rounds": out}


def run(mode: str = "quick") -> dict:
    rounds, steps, a, b = SIZES[mode]
    code = ("import json; from benchmarks.bench_trace import worker; "
            f"print(json.dumps(worker({rounds}, {steps}, {a}, {b})))")
    data = run_json_subprocess(code, timeout=900)
    rs = data["rounds"]
    ratios = [r["slowdown"] for r in rs]
    mean, low, high = mean_ci(ratios)
    median = statistics.median
    per_step_events = median([r["events"] / r["steps"] for r in rs])
    figures = [
        figure("window_slowdown", f"step time p50 inside / outside the window, same run (steps={a}:{b} of {steps}, "
               f"{rounds} round(s), CPU activities only)", round(median(ratios), 2), "x",
               note=f"mean {mean:.2f}, 95 % CI {low:.2f}-{high:.2f}; step p50 {median([r['in_s'] for r in rs]) * 1e3:.2f} "
                    f"ms inside vs {median([r['out_s'] for r in rs]) * 1e3:.2f} ms outside"),
        figure("start_first_ms", "profiler start, first in the process", round(rs[0]["start_s"] * 1e3, 1), "ms"),
        figure("start_ms", "profiler start, later rounds (median)",
               round(median([r["start_s"] for r in rs[1:]] or [rs[0]["start_s"]]) * 1e3, 2), "ms"),
        figure("stop_ms", "profiler stop (median)", round(median([r["stop_s"] for r in rs]) * 1e3, 2), "ms"),
        figure("export_ms", "trace export + cap + gzip save at the run's end (median)",
               round(median([r["export_s"] for r in rs]) * 1e3, 1), "ms"),
        figure("events_per_step", "trace events per traced step", round(per_step_events, 1), "events"),
        figure("kb_per_step", "saved trace (gzip) per traced step",
               round(median([r["bytes"] / r["steps"] for r in rs]) / 1000, 2), "KB"),
    ]
    result = {"figures": figures, "rounds": rs, "sizes": {"rounds": rounds, "steps": steps, "window": [a, b]},
              "note": "no GPU on this machine: CPU activities only"}
    save(NAME, result, mode)
    return result


if __name__ == "__main__":
    import sys

    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else "quick")["figures"], indent=1))
