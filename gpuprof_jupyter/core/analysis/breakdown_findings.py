"""A finding when idle time or exposed communication dominates a traced window.

Runs in any process (core).

Reads the breakdowns of ``summary["trace"]["breakdowns"]`` (``time_breakdown.experiment_breakdowns``):
of every window and rank, the one where idle time or communication not hidden by computation
(collectives, on a CPU-only window) is the largest part and at least ``DOMINANT_SHARE`` of it.
``diagnosis.window_waste`` wires it into the diagnosis' checks.
"""

from __future__ import annotations

from gpuprof_jupyter.core.analysis.finding import Finding
from gpuprof_jupyter.core.analysis.time_breakdown import dominant_waste
from gpuprof_jupyter.core.format import fmt_frac

_CAUSES = {"host_wait": "the host launching late (host wait)", "kernel_wait": "launch gaps under 30 ns (kernel wait)",
           "other": "an unknown cause (other: waiting on an event, another stream, another rank)"}


def _where(window: dict, row: dict) -> str:
    rank = f"rank {row['rank']}, " if row.get("rank") is not None else ""
    alert = f", traced after the alert [{window['alert']}]" if window.get("alert") else ""
    return f"{rank}traced window {window.get('window')}{alert}"


def _idle_cause(row: dict) -> str:
    causes = row.get("idle_causes") or {}
    named = {k: causes.get(k) for k in _CAUSES if causes.get(k) is not None}
    if not named:
        return ""
    top = max(named, key=named.get)
    return f"; {fmt_frac(named[top])} of the idle time is {_CAUSES[top]}"


def waste_finding(trace_summary: dict, gpu_idle_said: bool = False) -> Finding | None:
    """The worst dominating idle or communication share over the traced windows and ranks; None
    when none dominates. ``gpu_idle_said``: the host-bound finding already says the GPU idled."""
    worst = None
    for window in trace_summary.get("breakdowns") or []:
        for row in window.get("ranks") or []:
            found = dominant_waste(row)
            if found is None or (found[0] == "idle" and row["kind"] == "gpu" and gpu_idle_said):
                continue
            if worst is None or found[1] > worst[0][1]:
                worst = (found, row, window)
    if worst is None:
        return None
    (part, share), row, window = worst
    where, gpu = _where(window, row), row["kind"] == "gpu"
    numbers = {"part": part, "share": share, "kind": row["kind"], "rank": row.get("rank"), "window": window.get("window")}
    if part == "idle" and gpu:
        return Finding("trace-window-idle", "The GPU sat idle most of the traced window", "high",
                       f"{where}: no kernel, copy or memset ran {fmt_frac(share)} of the GPU's span{_idle_cause(row)}",
                       "open the merged trace (gpuprof trace NAME): host wait means the CPU launches too late "
                       "(syncs such as .item(), preprocessing in the loop, Python overhead: torch.compile, "
                       "DataLoader workers); other means a wait on an event, another stream or another rank",
                       numbers)
    if part == "idle":
        return Finding("trace-window-idle", "The process ran no operator most of the traced window", "medium",
                       f"{where} (CPU activities only): no operator, collective or DataLoader fetch ran "
                       f"{fmt_frac(share)} of the window",
                       "the time went to Python between operators, sleeps, locks or untraced threads: open the "
                       "merged trace (gpuprof trace NAME) and look at the gaps on the training thread", numbers)
    overlap = row.get("overlap")
    hidden = f"; only {fmt_frac(overlap)} of the communication ran under computation" if overlap is not None else ""
    what = "communication kernels not hidden by computation" if gpu else "collectives (CPU activities only)"
    return Finding("trace-window-communication", "Communication dominates the traced window", "high",
                   f"{where}: {what} took {fmt_frac(share)} of the {'GPU span' if gpu else 'window'}{hidden}",
                   "overlap communication with computation (DDP buckets: bucket_cap_mb, gradient_as_bucket_view; "
                   "FSDP backward_prefetch/forward_prefetch), or communicate less often (gradient accumulation "
                   "with no_sync); a rank far slower than the others makes the rest wait in the collective: "
                   "compare the ranks' rows", numbers)


__all__ = ["waste_finding"]
