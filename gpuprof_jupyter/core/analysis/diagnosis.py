"""Findings: what held a run back, with the evidence in numbers and a concrete next step.

Runs in any process (core).

Each check is a pure function ``(experiment) -> Finding | None``, in a module per family of
findings; ``CHECKS`` is their registry, in the order ``diagnose()`` runs them (a stopped rank
first: it explains everything after it), and ``diagnose()`` sorts what they find by severity:

    stuck.py              a rank that stopped (stuck_finding)
    input_findings.py     input-bound, gpu-underused (and the advice the live alerts and rules share)
    device_findings.py    compute-bound, throttled, idle gaps, a lagging GPU
    memory_findings.py    memory unused, the largest batch that fits
    rank_findings.py      a straggler rank (or a slow node), ranks waiting, a rank on the wrong GPU
    job_findings.py       a job's ranks that never reported (ranks_missing), a slow node
    trace_findings.py     from a --trace window: tiny kernels, host-bound, a dominant operator, waste
    serving_findings.py   serving runs (SERVING_CHECKS)

Thresholds are module constants of each family so tests and users can see them. Shares are
time-weighted with gaps excluded (analysis.stats). A finding claims only what its metric
measured (analysis.provenance): where ``sm_util`` is NVML kernel-active time the text says so,
and a run shorter than ``MIN_WINDOWS`` of a metric's native window gives no finding from that
metric, only one saying the run was too short. Every figure of the evidence is typed
(core/figure.py, ``finding_text.fig``): a simulated run's GPU figures say "(simulated)", a
fitted estimate names its basis, a missing figure is "n/a".
"""

from __future__ import annotations

from gpuprof_jupyter.core.analysis.device_findings import compute_bound, idle_gaps, lagging_gpu, throttled
from gpuprof_jupyter.core.analysis.finding import Finding
from gpuprof_jupyter.core.analysis.input_findings import (
    NO_STEPS_ADVICE, UNDERUSED_IN_STEP_ADVICE, gpu_underused, input_advice, input_bound, low_activity_advice,
    no_steps_advice, waits_for_input)
from gpuprof_jupyter.core.analysis.job_findings import ranks_missing
from gpuprof_jupyter.core.analysis.memory_findings import memory_headroom, memory_underused
from gpuprof_jupyter.core.analysis.provenance import too_short
from gpuprof_jupyter.core.analysis.rank_findings import rank_gpu_mismatch, ranks_params, ranks_waiting, straggler_rank
from gpuprof_jupyter.core.analysis.serving_findings import SERVING_CHECKS
from gpuprof_jupyter.core.analysis.stuck import stuck_finding
from gpuprof_jupyter.core.analysis.trace_findings import dominant_operator, host_bound, tiny_kernels, window_waste

SEVERITY_ORDER = {"high": 0, "medium": 1, "info": 2}

# The registry: every check, in the order diagnose() runs them.
CHECKS = [stuck_finding, input_bound, gpu_underused, compute_bound, memory_underused, memory_headroom, throttled, idle_gaps, lagging_gpu,
          straggler_rank, ranks_waiting, ranks_missing, rank_gpu_mismatch, tiny_kernels, host_bound, dominant_operator,
          window_waste,
          *SERVING_CHECKS]


def run_too_short(experiment, metric: str, reason: str) -> Finding:
    """What replaces the findings a run too short for ``metric`` cannot support."""
    return Finding("too-short", f"Run too short for {metric}", "info", reason,
                   f"profile a longer stretch (several seconds of steady training) before judging {metric}",
                   {"metric": metric})


def diagnose(experiment, checks=None) -> list[Finding]:
    """Findings for ``experiment``, most severe first (stable within a severity).

    A check drawn from a metric the run is too short for (``uses``) is skipped; one
    ``too-short`` finding per such metric says so instead.
    """
    findings, short = [], {}
    for check in checks or CHECKS:
        metrics = getattr(check, "metrics", ())
        for metric in metrics:
            if metric not in short:
                short[metric] = too_short(experiment, metric)
        if any(short[m] for m in metrics):
            continue
        finding = check(experiment)
        if finding is not None:
            findings.append(finding)
    skipped = [m for m, reason in short.items() if reason]
    findings += [run_too_short(experiment, m, short[m]) for m in skipped]
    for finding in findings:  # a simulated run's findings rest on the simulator's figures: labelled
        finding.simulated = bool(getattr(experiment.meta, "simulated", False))
    return sorted(findings, key=lambda f: SEVERITY_ORDER.get(f.severity, 9))


__all__ = [
    "CHECKS", "SEVERITY_ORDER", "diagnose", "run_too_short",
    # the checks, from their families' modules
    "compute_bound", "dominant_operator", "gpu_underused", "host_bound", "idle_gaps", "input_bound", "lagging_gpu",
    "memory_headroom", "memory_underused", "rank_gpu_mismatch", "ranks_missing", "ranks_waiting", "straggler_rank", "stuck_finding",
    "throttled", "tiny_kernels", "window_waste",
    # the advice other modules share (input_findings.py), and a rank's settings (rank_findings.py)
    "NO_STEPS_ADVICE", "UNDERUSED_IN_STEP_ADVICE", "input_advice", "low_activity_advice", "no_steps_advice",
    "ranks_params", "waits_for_input",
]
