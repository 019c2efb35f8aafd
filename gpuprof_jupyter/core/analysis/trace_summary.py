"""What the ``--trace`` window recorded: top operators and kernels, launches per step, GPU idle
gaps between kernels, and what tracing cost the steps inside the window.

Runs in any process (core).

Pure functions over torch.profiler's Chrome trace (a dict: ``traceEvents`` and
``baseTimeNanoseconds``) and the experiment's steps. Trace timestamps are microseconds; added to
``baseTimeNanoseconds`` they are wall-clock (UNIX) times (checked on torch 2.13), which is how
they meet our samples' ``wall_time``.

Self time of an operator: its duration minus that of the operators directly inside it on the
same thread. With CUDA activity, operators are ranked by the GPU time of the kernels they
launched (kernels carry their launching operator's ``External id``); without it (a CPU-only
machine, or CUDA not initialised by the user's code) by CPU self time, and the result says so.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

TOP_N = 10
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
MAX_ANNOTATION_SPANS = 100  # record_function ranges turned into phases, at most
# ranges torch itself opens (optimizer steps, DataLoader batches, profiler steps): not the user's phases
TORCH_ANNOTATIONS = ("Optimizer.", "ProfilerStep#", "enumerate(DataLoader)#")


def wall_time(trace: dict, ts_us: float) -> float:
    """A trace timestamp (us) as UNIX seconds."""
    return trace.get("baseTimeNanoseconds", 0) / 1e9 + ts_us / 1e6


def trace_ts(trace: dict, wall_s: float) -> float:
    """UNIX seconds as a trace timestamp (us, relative to ``baseTimeNanoseconds``)."""
    return (wall_s - trace.get("baseTimeNanoseconds", 0) / 1e9) * 1e6


def _complete(trace: dict, categories) -> list[dict]:
    return [e for e in trace.get("traceEvents", ())
            if e.get("ph") == "X" and e.get("cat") in categories and isinstance(e.get("dur"), (int, float))]


def _walk(events: list[dict]):
    """(index, parent index or None, depth) of each event, nesting by time per pid/tid."""
    by_thread: dict = defaultdict(list)
    for i, e in enumerate(events):
        by_thread[(e.get("pid"), e.get("tid"))].append(i)
    for indices in by_thread.values():
        indices.sort(key=lambda i: (events[i]["ts"], -events[i]["dur"]))
        stack: list[int] = []
        for i in indices:
            while stack and events[stack[-1]]["ts"] + events[stack[-1]]["dur"] <= events[i]["ts"]:
                stack.pop()
            yield i, (stack[-1] if stack else None), len(stack)
            stack.append(i)


def self_times(events: list[dict]) -> list[float]:
    """Each event's duration minus its direct children's (same pid/tid, nested in time), in
    ``events``' order."""
    out = [float(e["dur"]) for e in events]
    for i, parent, _ in _walk(events):
        if parent is not None:
            out[parent] -= events[i]["dur"]
    return [max(v, 0.0) for v in out]


def _nesting_depths(events: list[dict]) -> list[int]:
    depths = [0] * len(events)
    for i, _, depth in _walk(events):
        depths[i] = depth
    return depths


def _top(totals: dict, key: str, window_us: float, steps: int, n: int = TOP_N) -> list[dict]:
    rows = sorted(totals.values(), key=lambda r: r[key], reverse=True)[:n]
    for r in rows:
        r["share"] = r[key] / window_us if window_us > 0 else math.nan
        r["calls_per_step"] = r["calls"] / steps if steps else math.nan
        if key != "cuda_us":
            r.pop("cuda_us", None)  # no kernels recorded: a GPU time of 0 would look measured
        for k in ("self_us", "total_us", "cuda_us"):
            if k in r:
                r[k.replace("_us", "_s")] = r.pop(k) / 1e6
    return rows


def busy_intervals(events: list[dict]) -> list[tuple[float, float]]:
    """The union of the events' [ts, ts + dur] intervals, in order."""
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events)
    merged: list[list[float]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def gpu_idle(events: list[dict], window: tuple[float, float]) -> dict | None:
    """Time between GPU activities inside ``window`` (us): share of the window with no kernel,
    copy or memset running, and the gaps' count, median and p95. None without GPU activity."""
    if not events:
        return None
    busy = busy_intervals(events)
    start, end = window
    gaps = [b[0] - a[1] for a, b in zip(busy, busy[1:])]
    covered = sum(min(b, end) - max(a, start) for a, b in busy if b > start and a < end)
    length = end - start
    return {
        "share": max(0.0, 1 - covered / length) if length > 0 else math.nan,
        "gaps": len(gaps),
        "median_gap_us": float(np.median(gaps)) if gaps else math.nan,
        "p95_gap_us": float(np.percentile(gaps, 95)) if gaps else math.nan,
    }


def annotation_spans(trace: dict, limit: int = MAX_ANNOTATION_SPANS) -> tuple[list[tuple[str, float, float]], int]:
    """The user's outermost ``record_function`` ranges as (name, start, end) in UNIX seconds,
    earliest first, at most ``limit``; and how many were left out. Ranges torch opens itself
    (``TORCH_ANNOTATIONS``) and ranges nested in another are not phases."""
    events = [e for e in _complete(trace, ("user_annotation",))
              if not str(e.get("name", "")).startswith(TORCH_ANNOTATIONS)]
    outer = [e for e, depth in zip(events, _nesting_depths(events)) if depth == 0]
    spans = sorted((wall_time(trace, e["ts"]), wall_time(trace, e["ts"] + e["dur"]), e.get("name", "?"))
                   for e in outer)
    kept = spans[:limit]
    return [(name, a, b) for a, b, name in kept], len(spans) - len(kept)


def traced_window(trace: dict, info: dict, events: list[dict]) -> tuple[float, float]:
    """The traced window in trace microseconds: from the run's record (wall0 + start_s/end_s)
    when present, else the events' extent."""
    wall0, start, end = info.get("wall0"), info.get("start_s"), info.get("end_s")
    if wall0 is not None and start is not None and end is not None and end > start:
        return trace_ts(trace, wall0 + start), trace_ts(trace, wall0 + end)
    if not events:
        return 0.0, 0.0
    return min(e["ts"] for e in events), max(e["ts"] + e["dur"] for e in events)


def step_overhead(steps, info: dict) -> dict:
    """Step time inside the window against outside it, from the same run's steps (median, so
    the one step that pays for starting the profiler does not decide it)."""
    first, end = info.get("first_step"), info.get("end_step")
    out = {"step_p50_in_s": math.nan, "step_p50_out_s": math.nan, "slowdown": math.nan,
           "start_cost_s": info.get("start_cost_s", math.nan), "stop_cost_s": info.get("stop_cost_s", math.nan),
           "export_cost_s": info.get("export_cost_s", math.nan)}
    if steps is None or not len(steps) or first is None or end is None:
        return out
    duration = steps["duration_s"].to_numpy(dtype="float64")
    index = np.arange(len(duration))
    inside = (index >= first) & (index < end)
    if inside.any():
        out["step_p50_in_s"] = float(np.median(duration[inside]))
    if (~inside).any():
        out["step_p50_out_s"] = float(np.median(duration[~inside]))
    if out["step_p50_out_s"] > 0 and not math.isnan(out["step_p50_in_s"]):
        out["slowdown"] = out["step_p50_in_s"] / out["step_p50_out_s"]
    return out


def summarize_trace(trace: dict | None, info: dict, steps=None) -> dict:
    """Figures of the traced window. ``info``: the experiment's ``meta.trace``; ``trace``: the
    saved Chrome trace (None: only the window's facts and cost)."""
    out: dict = {"status": info.get("status"), "spec": info.get("spec"), "activities": info.get("activities", []),
                 "cpu_only": "cuda" not in info.get("activities", []), "steps": info.get("steps", 0),
                 "truncated": bool(info.get("truncated")), "overhead": step_overhead(steps, info)}
    if not trace:
        return out
    ops = _complete(trace, ("cpu_op",))
    gpu = _complete(trace, GPU_CATEGORIES)
    kernels = [e for e in gpu if e.get("cat") == "kernel"]
    lo, hi = traced_window(trace, info, ops + gpu)
    window = hi - lo
    steps_n = out["steps"] or 0
    out["window_s"] = window / 1e6
    op_name = {e.get("args", {}).get("External id"): e.get("name", "?") for e in ops}
    totals: dict = {}
    for e, self_us in zip(ops, self_times(ops)):
        r = totals.setdefault(e.get("name", "?"), {"name": e.get("name", "?"), "calls": 0, "self_us": 0.0,
                                                    "total_us": 0.0, "cuda_us": 0.0})
        r["calls"] += 1
        r["self_us"] += self_us
        r["total_us"] += e["dur"]
    for k in kernels:  # GPU time of the kernels each operator launched
        name = op_name.get(k.get("args", {}).get("External id"))
        if name in totals:
            totals[name]["cuda_us"] += k["dur"]
    basis = "cuda" if kernels else "cpu"
    out["operator_time"] = basis
    out["operators"] = _top(totals, "cuda_us" if basis == "cuda" else "self_us", window, steps_n)
    out["op_calls_per_step"] = len(ops) / steps_n if steps_n else math.nan
    ktotals: dict = {}
    for k in kernels:
        r = ktotals.setdefault(k.get("name", "?"), {"name": k.get("name", "?"), "calls": 0, "total_us": 0.0})
        r["calls"] += 1
        r["total_us"] += k["dur"]
    out["kernels"] = _top(ktotals, "total_us", window, steps_n)
    out["kernels_per_step"] = len(kernels) / steps_n if kernels and steps_n else math.nan
    out["kernel_median_us"] = float(np.median([k["dur"] for k in kernels])) if kernels else math.nan
    out["gpu_idle"] = gpu_idle(gpu, (lo, hi))
    return out


__all__ = ["annotation_spans", "busy_intervals", "gpu_idle", "self_times", "step_overhead", "summarize_trace", "traced_window",
           "trace_ts", "wall_time"]
