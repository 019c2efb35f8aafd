"""A capture triggered by a live alert (``--trace on-alert``, issue 41 part 5): what it costs the
steps it traces, measured as ``bench_trace`` measures the ``--trace`` window, side by side in
one run: step time inside the capture against the untraced steps before and after it.

Each round is one session of a torch CPU training loop with ``trace="on-alert"`` and an alert
rule that holds from the start (``step_time_p50_s > 0``: each rank's, here the process's, median
step in the last minute), so the sampler process fires it at its first live update once three
steps are in; the capture then opens at the next step boundary and traces 5 steps. The loop runs
until the capture has closed and as many steps again. Also: the time from the alert to the
capture's first step (the live update, once a second, and the step boundary), the profiler's
start, stop and the export that the step closing the capture pays, and the saved size.

The window is the one a rank of ``gpuprof run`` opens at the run's request
(``runtime/jobs/child_capture.py``); here it is in the profiled process itself. CPU activities
only: this machine has no GPU.
"""

from __future__ import annotations

import json
import statistics

from ._common import figure, mean_ci, run_json_subprocess, save

NAME = "alert_trace"
SIZES = {"tiny": (1, 20.0), "quick": (5, 60.0), "full": (10, 60.0)}  # rounds, at most seconds a round
RULE = "step_time_p50_s > 0"  # holds from the third step: the trigger, not what is measured


def worker(rounds: int, limit_s: float) -> dict:
    """In a fresh interpreter: ``rounds`` sessions, each traced once on its alert."""
    import os
    import tempfile
    import time

    import gpuprof_jupyter as gp
    from benchmarks._train import namespace
    from gpuprof_jupyter.core.store.directory import Store

    ns = namespace()
    ns["train_steps"](20)  # warm up outside any session
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            with gp.profile(name=f"round{r}", source="host", store=tmp, trace="on-alert", alerts=[RULE]) as p:
                info, steps, closed_at, deadline = p.session.meta.trace, 0, None, time.monotonic() + limit_s
                while time.monotonic() < deadline and (closed_at is None or steps < 2 * closed_at):
                    ns["train_steps"](1)
                    gp.step(128)
                    steps += 1
                    if closed_at is None and info.get("captures"):
                        closed_at = steps
            exp = p.experiment
            info, overhead = exp.meta.trace, exp.summary["trace"]["overhead"]
            if not info.get("captures"):
                out.append({"captured": False, "steps": steps, "notes": exp.meta.notes[-3:]})
                continue
            capture = info["captures"][0]
            path = Store(tmp).directory(exp.meta) / capture["file"]
            out.append({"captured": True, "slowdown": overhead["slowdown"], "in_s": overhead["step_p50_in_s"],
                        "out_s": overhead["step_p50_out_s"], "start_s": capture["start_cost_s"],
                        "stop_s": capture["stop_cost_s"], "export_s": capture["export_cost_s"],
                        "delay_s": capture["start_s"] - capture["alert"]["t_s"], "traced": capture["steps"],
                        "steps": steps, "bytes": os.path.getsize(path), "captures": len(info["captures"])})
    return {"rounds": out}


def run(mode: str = "quick") -> dict:
    rounds, limit_s = SIZES[mode]
    code = ("import json; from benchmarks.bench_alert_trace import worker; "
            f"print(json.dumps(worker({rounds}, {limit_s})))")
    data = run_json_subprocess(code, timeout=900)
    rs = [r for r in data["rounds"] if r["captured"]]
    missed = len(data["rounds"]) - len(rs)
    if not rs:
        raise RuntimeError(f"no round took its capture: {data['rounds']}")
    median = statistics.median
    ratios = [r["slowdown"] for r in rs]
    mean, low, high = mean_ci(ratios) if len(ratios) > 1 else (ratios[0], ratios[0], ratios[0])
    figures = [
        figure("capture_slowdown", f"step time p50 inside the capture / the untraced steps, same run ("
               f"{rs[0]['traced']} steps traced after the alert, {len(rs)} round(s), CPU activities only)",
               round(median(ratios), 2), "x",
               note=f"mean {mean:.2f}, 95 % CI {low:.2f}-{high:.2f}; step p50 {median([r['in_s'] for r in rs]) * 1e3:.2f} "
                    f"ms inside vs {median([r['out_s'] for r in rs]) * 1e3:.2f} ms outside"
                    + (f"; {missed} round(s) without a capture left out" if missed else "")),
        figure("alert_to_capture_s", "from the alert to the capture's first step (median; the live update "
               "brings the alert once a second)", round(median([r["delay_s"] for r in rs]), 2), "s"),
        figure("capture_start_ms", "profiler start at the capture's first step (median)",
               round(median([r["start_s"] for r in rs]) * 1e3, 2), "ms"),
        figure("capture_stop_ms", "profiler stop (median)", round(median([r["stop_s"] for r in rs]) * 1e3, 2), "ms"),
        figure("capture_export_ms", "export + cap + gzip save at the capture's last boundary, paid by the first step after it (median)",
               round(median([r["export_s"] for r in rs]) * 1e3, 1), "ms"),
        figure("capture_kb", "saved capture (gzip), 5 steps (median)", round(median([r["bytes"] for r in rs]) / 1000, 1),
               "KB"),
    ]
    result = {"figures": figures, "rounds": data["rounds"], "sizes": {"rounds": rounds, "limit_s": limit_s},
              "note": "no GPU on this machine: CPU activities only"}
    save(NAME, result, mode)
    return result


if __name__ == "__main__":
    import sys

    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else "quick")["figures"], indent=1))
