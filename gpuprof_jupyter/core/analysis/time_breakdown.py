"""Where the time of a traced window went, per rank: compute, communication, memory copies, idle.

Runs in any process (core).

Pure functions over torch.profiler's Chrome trace (Kineto's JSON). Two breakdowns; the result
names which (``kind``), since they measure different things:

* ``"gpu"``, when the window holds GPU activity (Kineto's categories ``kernel``,
  ``gpu_memcpy``, ``gpu_memset``): Holistic Trace Analysis's definitions (docs/trace.md,
  "Where the time went"). A kernel is *communication* when its name starts with ``nccl``
  (``ncclKernel_*``, ``ncclDevKernel_*``) or holds ``gloo:``, *memory* when it is a
  ``gpu_memcpy``/``gpu_memset`` event or its name holds ``Memcpy``/``Memset``, *computation*
  otherwise. The span is HTA's kernel time: from the first GPU event's start to the last one's
  end (inside the window). ``idle`` is the span with no GPU event; ``compute`` the union of the
  computation kernels; HTA's non-compute time (span - compute - idle) is split into the
  communication not hidden by computation and the memory copies under neither. ``overlap`` is
  HTA's computation/communication overlap: the share of communication time during which a
  computation kernel ran. Idle causes, per CUDA stream, for each gap between consecutive GPU
  events: *host wait* when the event was launched (its ``cuda_runtime`` event, matched by
  correlation id) after the previous one ended, *kernel wait* when shorter than HTA's
  ``consecutive_kernel_delay`` (30 ns), *other* otherwise; shares of the streams' idle time.
* ``"cpu"``, a CPU-only window: the share of the window in which the process ran an operator
  (``cpu_op``), a collective (``c10d::*`` operators, ``gloo:*``/``nccl:*`` ranges,
  ``record_param_comms``), waited for data (torch's ``enumerate(DataLoader)#...`` ranges) or
  none of them (``idle``: Python between operators, sleeping, waiting on something untraced).
  Each instant counts once, in that order of priority: data wait, then collective, then op.

All times are microseconds (Kineto's unit); shares are of the span (GPU) or of the window (CPU).
"""

from __future__ import annotations

from gpuprof_jupyter.core.analysis.trace_summary import GPU_CATEGORIES, busy_intervals, traced_window

KERNEL_WAIT_US = 0.030  # HTA's consecutive_kernel_delay: 30 ns
COLLECTIVE_PREFIXES = ("c10d::", "gloo:", "nccl:", "record_param_comms")
DATA_WAIT_PREFIX = "enumerate(DataLoader)#"
DOMINANT_SHARE = 0.40  # idle or exposed communication at least this share of the window...
# ...and more than any other part of it: a finding (analysis.breakdown_findings)

Intervals = list[tuple[float, float]]


def kernel_type(event: dict) -> str:
    """``"communication"``, ``"memory"`` or ``"computation"`` (HTA's ``get_kernel_type``, plus
    Kineto's memcpy/memset categories)."""
    name = str(event.get("name", ""))
    if name.startswith("nccl") or "gloo:" in name:
        return "communication"
    if event.get("cat") in ("gpu_memcpy", "gpu_memset") or "Memcpy" in name or "Memset" in name:
        return "memory"
    return "computation"


def _timed(trace: dict, categories) -> list[dict]:
    return [e for e in trace.get("traceEvents", ())
            if e.get("ph") == "X" and e.get("cat") in categories and isinstance(e.get("ts"), (int, float))
            and isinstance(e.get("dur"), (int, float))]


def _clip(intervals: Intervals, lo: float, hi: float) -> Intervals:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]


def _length(intervals: Intervals) -> float:
    return sum(b - a for a, b in intervals)


def _intersect(x: Intervals, y: Intervals) -> Intervals:
    """The intersection of two sorted, merged interval lists."""
    out, i, j = [], 0, 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def _union(events: list[dict], lo: float, hi: float) -> Intervals:
    return _clip(busy_intervals(events), lo, hi)


def gpu_breakdown(trace: dict) -> dict | None:
    """HTA's temporal breakdown, overlap and idle causes of ``trace``'s GPU events, over their
    span; None without GPU events."""
    events = _timed(trace, GPU_CATEGORIES)
    if not events:
        return None
    start = min(e["ts"] for e in events)
    end = max(e["ts"] + e["dur"] for e in events)
    span = end - start
    kinds: dict[str, list[dict]] = {"computation": [], "communication": [], "memory": []}
    for e in events:
        kinds[kernel_type(e)].append(e)
    comp, comm = _union(kinds["computation"], start, end), _union(kinds["communication"], start, end)
    busy = _length(_union(events, start, end))
    hidden = _length(_intersect(comm, comp))
    compute, comm_time = _length(comp), _length(comm)
    exposed_comm = comm_time - hidden
    memory = max(0.0, busy - compute - exposed_comm)
    idle = max(0.0, span - busy)
    share = (lambda v: v / span) if span > 0 else (lambda v: None)
    return {"kind": "gpu", "span_us": span, "compute": share(compute), "communication": share(exposed_comm),
            "memory": share(memory), "idle": share(idle), "non_compute": share(exposed_comm + memory),
            "communication_us": comm_time, "overlap": hidden / comm_time if comm_time > 0 else None,
            "idle_causes": idle_causes(trace, events)}


def idle_causes(trace: dict, events: list[dict]) -> dict | None:
    """Shares of the streams' idle time: ``host_wait``, ``kernel_wait``, ``other`` (HTA's idle time
    breakdown, summed over streams); None when no stream had a gap."""
    launches = {(e.get("args") or {}).get("correlation"): e["ts"]
                for e in _timed(trace, ("cuda_runtime", "cuda_driver"))}
    streams: dict = {}
    for e in events:
        streams.setdefault((e.get("pid"), (e.get("args") or {}).get("stream", e.get("tid"))), []).append(e)
    totals = {"host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0}
    for stream in streams.values():
        stream.sort(key=lambda e: e["ts"])
        for prev, e in zip(stream, stream[1:]):
            prev_end = prev["ts"] + prev["dur"]
            gap = e["ts"] - prev_end
            if gap <= 0:
                continue
            launched = launches.get((e.get("args") or {}).get("correlation"))
            if launched is not None and launched > prev_end:
                totals["host_wait"] += gap
            elif gap < KERNEL_WAIT_US:
                totals["kernel_wait"] += gap
            else:
                totals["other"] += gap
    total = sum(totals.values())
    if total <= 0:
        return None
    return {**{k: v / total for k, v in totals.items()}, "idle_us": total}


def _is_collective(name: str) -> bool:
    return name.startswith(COLLECTIVE_PREFIXES)


def cpu_breakdown(trace: dict, window: tuple[float, float]) -> dict | None:
    """Shares of ``window`` (trace us) in data wait, collectives, other operators and idle, on
    the CPU; None for an empty window."""
    lo, hi = window
    length = hi - lo
    if length <= 0:
        return None
    events = _timed(trace, ("cpu_op", "user_annotation"))
    data = _union([e for e in events if str(e.get("name", "")).startswith(DATA_WAIT_PREFIX)], lo, hi)
    coll = _union([e for e in events if _is_collective(str(e.get("name", "")))], lo, hi)
    ops = _union([e for e in events if e.get("cat") == "cpu_op"], lo, hi)
    data_s = _length(data)
    coll_s = _length(coll) - _length(_intersect(coll, data))
    either = busy_intervals([{"ts": a, "dur": b - a} for a, b in data + coll])
    ops_s = _length(ops) - _length(_intersect(ops, either))
    idle = max(0.0, length - data_s - coll_s - ops_s)
    return {"kind": "cpu", "span_us": length, "ops": ops_s / length, "collectives": coll_s / length,
            "data_wait": data_s / length, "idle": idle / length}


def window_breakdown(trace: dict, info: dict) -> dict | None:
    """The GPU breakdown when the trace has GPU activity (over its GPU span, as HTA), else the
    CPU one over the traced window (``info``: the window's record, ``meta.trace``)."""
    found = gpu_breakdown(trace)
    if found is not None:
        return found
    events = _timed(trace, ("cpu_op", "user_annotation"))
    return cpu_breakdown(trace, traced_window(trace, info, events))


def experiment_breakdowns(experiment) -> list[dict]:
    """One entry per traced window (``--trace`` window, or each ``--trace on-alert`` capture):
    ``{"window", "alert", "ranks": [{"rank", **breakdown}]}``; a window traced in several ranks
    (``gpuprof run --trace-ranks``) has one row per rank. [] without a saved trace."""
    info = experiment.meta.trace or {}
    captures = experiment.capture_traces()
    if captures:
        windows = [(record, {_rank_of(trace, None): (trace, {**info, **record})}) for record, trace in captures]
    else:
        ranks = experiment.rank_traces()
        rank_infos = info.get("ranks") or {}
        if len(ranks) > 1:
            traces = {rank: (trace, {**info, **rank_infos.get(str(rank), {})}) for rank, trace in ranks.items()}
        else:
            trace = experiment.trace
            traces = {_rank_of(trace, next(iter(ranks), None)): (trace, info)} if trace else {}
        windows = [(info, traces)] if traces else []
    out = []
    for record, traces in windows:
        rows = []
        for rank, (trace, window_info) in traces.items():
            found = window_breakdown(trace, window_info)
            if found is not None:
                rows.append({"rank": rank, **found})
        if rows:
            out.append({"window": record.get("window") or record.get("spec"),
                        "alert": (record.get("alert") or {}).get("rule"), "ranks": rows})
    return out


def _rank_of(trace: dict, default):
    """The rank Kineto wrote in the trace (``distributedInfo.rank``), else ``default``."""
    rank = (trace.get("distributedInfo") or {}).get("rank")
    return rank if isinstance(rank, int) else default


def dominant_waste(breakdown: dict | None) -> tuple[str, float] | None:
    """("idle" or "communication", share) when that part is at least ``DOMINANT_SHARE`` of the
    window and larger than every other part; None otherwise."""
    if not breakdown:
        return None
    parts = ("compute", "communication", "memory", "idle") if breakdown["kind"] == "gpu" else (
        "ops", "collectives", "data_wait", "idle")
    shares = {p: breakdown.get(p) for p in parts if breakdown.get(p) is not None}
    if not shares:
        return None
    top = max(shares, key=shares.get)
    if top in ("idle", "communication", "collectives") and shares[top] >= DOMINANT_SHARE:
        return top, shares[top]
    return None


__all__ = ["COLLECTIVE_PREFIXES", "DOMINANT_SHARE", "KERNEL_WAIT_US", "cpu_breakdown", "dominant_waste",
           "experiment_breakdowns", "gpu_breakdown", "idle_causes", "kernel_type", "window_breakdown"]
