"""One merged trace for Perfetto or chrome://tracing: torch.profiler's events of the ``--trace``
window plus our counters (``sm_util``, ``mem_bw_util``, ``power_w`` per GPU, host ``cpu_util``,
the steps' data-wait share) as counter tracks, and our steps and phases as spans.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

One clock: torch's timestamps are microseconds after its ``baseTimeNanoseconds`` (a wall-clock
time); each sample is placed through its own ``wall_time``, steps and phases through the
session's start (``meta.trace['wall0']`` + seconds since start). Counters cover the window
and ``MARGIN_S`` either side. Writing it to a file is ``export/trace.py``'s.
"""

from __future__ import annotations

import math

from gpuprof_jupyter.core.analysis.ranks import rank_label
from gpuprof_jupyter.core.analysis.trace_summary import trace_ts

MARGIN_S = 2.0
GPU_COUNTERS = (("sm_util", "%"), ("mem_bw_util", "%"), ("power_w", "W"))
HOST_COUNTERS = (("cpu_util", "%"),)
PID = 999_999_001  # our own "process" in the viewer, apart from torch's
TID_STEPS, TID_PHASES, TID_ALERTS = 1, 2, 3
TID_RANK_STEPS = 100  # + rank: the steps of each rank on our own process's tracks
RANK_PID = 999_000_000  # + rank: one viewer process per rank when several ranks were traced


class NoTrace(LookupError):
    """The experiment has no saved trace window."""


def _meta_event(name: str, args: dict, tid: int = 0) -> dict:
    return {"ph": "M", "name": name, "pid": PID, "tid": tid, "args": args}


def _counter_events(experiment, trace: dict, lo: float, hi: float) -> list[dict]:
    events = []
    gpus = [d["key"] for d in experiment.meta.gpu_devices]
    stored = set(experiment.sample_columns())
    wanted = [(key, GPU_COUNTERS) for key in gpus] + [("host", HOST_COUNTERS)]
    for device, counters in wanted:
        names = [m for m, _ in counters if m in stored]
        if not names:
            continue
        frame = experiment.device_frame(device, ["wall_time", *names])
        if "wall_time" not in frame:
            continue
        inside = frame[(frame["wall_time"] >= lo) & (frame["wall_time"] <= hi)]
        for metric, unit in counters:
            if metric not in inside:
                continue
            for wall, value in zip(inside["wall_time"].to_numpy(), inside[metric].to_numpy()):
                if not math.isnan(value):
                    events.append({"ph": "C", "name": f"{device} {metric} ({unit})", "pid": PID, "tid": 0,
                                   "ts": trace_ts(trace, float(wall)), "args": {metric: float(value)}})
    return events


def _step_spans(steps, trace: dict, wall0: float, lo: float, hi: float, tid: int = TID_STEPS,
                counter: str = "data wait (share of step)") -> list[dict]:
    """Steps as spans, with their data-wait share as a counter."""
    events = []
    for i, (end, duration, wait) in enumerate(zip(steps["t_end_s"], steps["duration_s"], steps["wait_s"])):
        start = wall0 + end - duration
        if start > hi or wall0 + end < lo:
            continue
        ts = trace_ts(trace, start)
        events.append({"ph": "X", "cat": "gpuprof", "name": f"step {i}", "pid": PID, "tid": tid, "ts": ts,
                       "dur": duration * 1e6, "args": {"step": i, "data_wait_s": wait}})
        share = wait / duration if duration > 0 else 0.0
        events.append({"ph": "C", "name": counter, "pid": PID, "tid": 0, "ts": ts, "args": {"data_wait": share}})
    return events


def _session_spans(experiment, trace: dict, wall0: float, lo: float, hi: float) -> list[dict]:
    """Steps (per rank, each on its own track, when ranks reported) and our phases, as spans."""
    ranks = experiment.rank_steps() if len(experiment.rank_steps()) > 1 else {}
    if not ranks:
        events = _step_spans(experiment.steps, trace, wall0, lo, hi)
    else:
        events = []
        for rank, steps in ranks.items():
            tid = TID_RANK_STEPS + rank
            events.append(_meta_event("thread_name", {"name": f"steps of {rank_label(rank)}"}, tid))
            events += _step_spans(steps, trace, wall0, lo, hi, tid, f"data wait (share of step), {rank_label(rank)}")
    for phase in experiment.meta.phases:
        if phase.get("source") == "record_function":
            continue  # already in torch's events
        start, end = wall0 + phase["start_s"], wall0 + (phase.get("end_s") or phase["start_s"])
        if start > hi or end < lo:
            continue
        events.append({"ph": "X", "cat": "gpuprof", "name": phase["name"], "pid": PID, "tid": TID_PHASES,
                       "ts": trace_ts(trace, start), "dur": (end - start) * 1e6})
    return events


def merged_trace(experiment) -> dict:
    """torch's trace of the window with our counters, steps and phases added (a new dict)."""
    trace = experiment.trace
    if not trace:
        raise NoTrace(f"experiment {experiment.name!r} has no trace: profile it with --trace steps=A:B "
                      "(or seconds=S:T)" + (f" (its window: {experiment.meta.trace.get('status')})"
                                            if experiment.meta.trace else ""))
    info = experiment.meta.trace
    wall0 = info["wall0"]
    captures = experiment.capture_traces()  # --trace on-alert: one window per alert traced
    ours = [
        _meta_event("process_name", {"name": f"gpuprof: {experiment.name} (counters, steps, phases)"}),
        _meta_event("process_sort_index", {"sort_index": -1}),
        _meta_event("thread_name", {"name": "steps (gpuprof_jupyter.step)"}, TID_STEPS),
        _meta_event("thread_name", {"name": "phases (gpuprof_jupyter.phase)"}, TID_PHASES),
    ]
    if captures:
        ours.append(_meta_event("thread_name", {"name": "alerts traced (--trace on-alert)"}, TID_ALERTS))
    for window in [record for record, _ in captures] or [info]:
        lo = wall0 + window.get("start_s", 0.0) - MARGIN_S
        hi = wall0 + window.get("end_s", window.get("start_s", 0.0)) + MARGIN_S
        ours += _counter_events(experiment, trace, lo, hi)
        ours += _session_spans(experiment, trace, wall0, lo, hi)
        if window.get("alert"):
            ours.append(_alert_span(window, trace, wall0))
    traces = experiment.rank_traces()
    merged = {k: v for k, v in trace.items() if k != "traceEvents"}
    if len(traces) > 1:
        events = rank_groups(traces, trace)
    else:
        events = list(trace.get("traceEvents", []))
        for _, other in captures[1:]:  # the later captures' events, on the first one's clock
            shift_us = clock_shift_us(other, trace)
            events += [dict(e, ts=float(e["ts"]) + shift_us) if "ts" in e else e for e in other.get("traceEvents", [])]
    merged["traceEvents"] = events + ours
    merged["gpuprof"] = {"experiment": experiment.name, "id": experiment.id, "window": info.get("spec"),
                         "status": info.get("status"), "activities": info.get("activities"),
                         "clock": "ts: us after baseTimeNanoseconds (UNIX ns); samples placed by wall_time",
                         "simulated": experiment.meta.simulated}
    return merged


def _alert_span(window: dict, trace: dict, wall0: float) -> dict:
    """The alert that caused a capture, as a span over the steps it traced."""
    alert = window["alert"]
    start, end = wall0 + window.get("start_s", 0.0), wall0 + window.get("end_s", window.get("start_s", 0.0))
    return {"ph": "X", "cat": "gpuprof", "name": f"alert: {alert.get('rule')}", "pid": PID, "tid": TID_ALERTS,
            "ts": trace_ts(trace, start), "dur": (end - start) * 1e6,
            "args": {"alert_t_s": alert.get("t_s"), "evidence": alert.get("evidence"), "steps": window.get("window"),
                     "file": window.get("file")}}


def clock_shift_us(trace: dict, reference: dict) -> float:
    """What to add to ``trace``'s timestamps to put them on ``reference``'s clock (each counts
    from its own ``baseTimeNanoseconds``)."""
    base = reference.get("baseTimeNanoseconds") or 0
    return ((trace.get("baseTimeNanoseconds") or base) - base) / 1000


def rank_groups(traces: dict[int, dict], reference: dict) -> list[dict]:
    """Every rank's torch events in one track group per rank (one viewer "process": ``RANK_PID +
    rank``), on ``reference``'s clock (each trace counts from its own ``baseTimeNanoseconds``).
    A rank's processes (its CPU threads, its GPU's streams) become threads of its group, named
    after the process they came from."""
    out = []
    for rank, trace in traces.items():
        shift_us = clock_shift_us(trace, reference)
        pid = RANK_PID + rank
        names = {e.get("pid"): (e.get("args") or {}).get("name", "") for e in trace.get("traceEvents", [])
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
        out += [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": rank_label(rank)}},
                {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": rank}}]
        for event in trace.get("traceEvents", []):
            if event.get("ph") == "M" and event.get("name", "").startswith("process_"):
                continue
            source = event.get("pid")
            event = dict(event, pid=pid, tid=_rank_tid(source, event.get("tid")))
            if event.get("ph") == "M" and event.get("name") == "thread_name":
                thread = (event.get("args") or {}).get("name", "")
                event["args"] = {"name": f"{names.get(source, '')} {thread}".strip()}
            if "ts" in event:
                event["ts"] = float(event["ts"]) + shift_us
            out.append(event)
    return out


def _rank_tid(pid, tid):
    """One thread id per (process, thread) of a rank, unique inside its group."""
    if isinstance(pid, int) and isinstance(tid, int):
        return pid * 10_000_000 + tid
    return f"{pid}:{tid}"


__all__ = ["MARGIN_S", "NoTrace", "merged_trace", "rank_groups"]
