"""Findings: what held a run back, with the evidence in numbers and a concrete next step.

Runs in any process (core).

Each check is a pure function ``(experiment) -> Finding | None``; ``diagnose()`` runs them in
order (``CHECKS``) and sorts by severity. Thresholds are module constants so tests and users
can see them. Shares are time-weighted with gaps excluded (analysis.stats).

A finding claims only what its metric measured (analysis.provenance): where ``sm_util`` is
NVML kernel-active time the text says so, and a run shorter than ``MIN_WINDOWS`` of a metric's
native window gives no finding from that metric, only one saying the run was too short.
Every figure of the evidence is typed (core/figure.py, ``_fig``): a simulated run's GPU figures
say "(simulated)", a fitted estimate names its basis, a missing figure is "n/a".
"""

from __future__ import annotations


import numpy as np

from gpuprof_jupyter.core.analysis.breakdown_findings import waste_finding
from gpuprof_jupyter.core.analysis.finding import Finding
from gpuprof_jupyter.core.analysis.job_findings import median_of, ranks_missing, slow_node
from gpuprof_jupyter.core.analysis.ranks import job_hosts, listed, rank_host, rank_name
from gpuprof_jupyter.core.analysis.serving_findings import SERVING_CHECKS
from gpuprof_jupyter.core.analysis.stuck import stuck_finding
from gpuprof_jupyter.core.figure import estimated, measured
from gpuprof_jupyter.core.format import as_float, fmt_figure, provenance_label
from gpuprof_jupyter.core.analysis.headroom import DEFAULT_MARGIN, largest_batch
from gpuprof_jupyter.core.analysis.run_batch import run_batch
from gpuprof_jupyter.core.analysis.run_figures import CLOCK, run_figure, step_figure
from gpuprof_jupyter.core.analysis.provenance import gpu_measured, measured_as, sm_is_kernel_active, too_short
from gpuprof_jupyter.core.analysis.stats import sample_weights
from gpuprof_jupyter.core.analysis.summary import summary_of

SEVERITY_ORDER = {"high": 0, "medium": 1, "info": 2}

INPUT_SM_LOW_FRAC = 0.30  # sm_util < 50 % for at least this share of the time...
INPUT_DATA_WAIT_FRAC = 0.20  # ...while the loop waited for data at least this share
INPUT_CPU_BUSY = 80.0  # or (no steps reported) the process tree used this much of its CPUs
HOST_INPUT_WAIT_FRAC = 0.30  # no GPU read: the loop waited for data at least this share of its steps
COMPUTE_SM_MEAN = 80.0  # compute-bound: mean sm_util at least this...
COMPUTE_SM_LOW_FRAC = 0.20  # ...and below 50 % for less than this share
TENSOR_IDLE = 10.0  # tensor_util mean below this: no tensor cores, i.e. fp32
MEM_UNUSED_TORCH = 0.35  # torch's allocator reserved less than this share of GPU memory
MEM_UNUSED_NVML = 0.25  # without torch statistics: used memory below this share
HEADROOM_MARGIN = DEFAULT_MARGIN  # the largest batch keeps this share of the device's memory free
THROTTLE_SHARE = 0.10  # a throttle reason active for at least this share of the time
IDLE_SM = 5.0  # sm_util below this is "idle"
IDLE_SHARE = 0.10  # interior idle stretches adding up to this share of the run...
IDLE_MIN_S = 1.0  # ...each at least this long
LAG_RATIO = 0.80  # a GPU whose mean sm_util is below this ratio of the others' median
LAG_MIN_SM = 30.0  # and the others are busy at least this much
STRAGGLER_SHARE = 0.20  # a rank whose data wait per step exceeds the others' by this share of its step
STRAGGLER_RATIO = 1.25  # or whose step time is this many times the others' (ranks not in lockstep)
RANK_WAIT_SHARE = 0.30  # a rank spending this share of its step beyond compute and data wait: waiting
# From a --trace window (analysis.trace_summary):
TRACE_TINY_KERNEL_US = 20.0  # median kernel shorter than this...
TRACE_TINY_KERNELS_PER_STEP = 100  # ...at least this many launches per step...
TRACE_GPU_IDLE_SHARE = 0.30  # ...and the GPU idle between kernels at least this share of the window
TRACE_HOST_BOUND_IDLE = 0.50  # GPU idle between (longer) kernels at least this share: host-bound
TRACE_DOMINANT_SHARE = 0.50  # one operator took at least this share of the traced window

_THROTTLES = {
    "sw_power_cap": "the software power cap",
    "hw_slowdown": "hardware slowdown (power brake or overheating)",
    "sw_thermal_slowdown": "software thermal slowdown",
    "hw_thermal_slowdown": "hardware thermal slowdown",
    "hw_power_brake_slowdown": "the external power brake",
}


def uses(*metrics: str):
    """Mark a check as drawn from these sampled metrics: ``diagnose`` skips it when the run is
    too short for one of them."""
    def mark(check):
        check.metrics = metrics
        return check
    return mark


def _fig(experiment, key: str, value, unit: str) -> str:
    """The run's figure ``key`` in ``unit`` as every view writes it (core/figure.py): a GPU figure
    of a simulated run says "(simulated)", a missing one "n/a", never 0."""
    return fmt_figure(run_figure(experiment.meta, key, value, unit))


def _together(experiment, *specs: tuple[str, object, str]) -> tuple[list[str], str]:
    """Several figures of one clause, each (key, value, unit): their texts and the label they
    share, said once after the clause ("4.0 GiB of 40.0 GiB (10 %) (simulated)"); figures of
    different provenance keep their own labels (and the shared one is "")."""
    figures = [run_figure(experiment.meta, key, value, unit) for key, value, unit in specs]
    labels = {provenance_label(f) for f in figures if f.known}
    if len(labels) == 1:
        return [fmt_figure(f, labelled=False) for f in figures], labels.pop()
    return [fmt_figure(f) for f in figures], ""


def _steps(value, unit: str) -> str:
    """A figure of the run's steps (a batch, a time per step), measured by the step hooks."""
    return fmt_figure(step_figure(value, unit))


def _traced(value, unit: str) -> str:
    """A figure of the --trace window, measured by torch.profiler."""
    return fmt_figure(measured(value, unit, "the --trace window (torch.profiler)"))


def _sm_name(experiment) -> str:
    """How evidence names ``sm_util``: by what it measured where that is kernel-active time."""
    return "kernel-active time (sm_util from NVML utilization.gpu)" if sm_is_kernel_active(experiment.meta) else "sm_util"


def _amp_setting(params: dict) -> bool | None:
    """True/False when the recorded settings say whether mixed precision was on; None if unknown."""
    for key, value in params.items():
        k = key.lower().rsplit(".", 1)[-1]
        if k in ("amp", "mixed_precision", "autocast", "use_amp", "fp16", "bf16"):
            if isinstance(value, bool):
                return value
            if isinstance(value, str):
                return value.lower() not in ("false", "no", "off", "0", "none", "fp32")
            return bool(value)
        if k in ("precision", "dtype"):
            text = str(value).lower()
            return not ("32" in text or text in ("float", "full"))
    return None


# Next steps for a GPU often idle; one wording, shared by the findings and the live alerts.
UNDERUSED_IN_STEP_ADVICE = ("profile one step with torch.profiler to find host-side work between kernels (Python "
                            "overhead, .item()/.cpu() syncs, small kernels); CUDA graphs or torch.compile can cut "
                            "launch overhead")
NO_STEPS_ADVICE = ("no training steps were found: steps come from torch's optimizer hooks and data waits from its "
                   "DataLoaders; a loop without a torch optimizer can call gpuprof_jupyter.step(n_samples) itself, "
                   "and gpuprof_jupyter.track(loader) times another loader's batches")
# Where the run's context says torch came too late for its hooks (``context["torch_imported_late"]``:
# "cell" for a profiled notebook cell, "block" for a ``profile()`` block), the advice says so first.
_LATE_TORCH = {"cell": "torch was imported inside the profiled cell, so its hooks were not installed: import it in "
                       "an earlier cell",
               "block": "torch was imported inside the profiled block, so its hooks were not installed: import it "
                        "before the block starts"}


def no_steps_advice(context: dict | None) -> str:
    """What to do when no steps were found: import torch earlier only where that applies (torch
    came after the run started), else report steps."""
    late = _LATE_TORCH.get((context or {}).get("torch_imported_late"))
    return f"{late}; or {NO_STEPS_ADVICE}" if late else NO_STEPS_ADVICE


def waits_for_input(wait: float | None, cpu: float | None) -> bool:
    """The loop waited for data (or, with no steps reported, the CPUs were busy): the input
    pipeline is what a low GPU activity points at."""
    return (wait is not None and wait >= INPUT_DATA_WAIT_FRAC) or (wait is None and cpu is not None and cpu >= INPUT_CPU_BUSY)


def input_advice(num_workers=None, cpu: float | None = None, gpu: bool = True) -> str:
    """What to try when the loop waits for data (``num_workers`` as recorded, ``cpu`` the process
    tree's mean CPU %); ``pin_memory`` only where a GPU was measured (it speeds host-to-GPU copies)."""
    step = ("give the DataLoader more workers"
            + (f" (num_workers={num_workers} now)" if num_workers is not None else "")
            + ", set prefetch_factor (e.g. 4)" + (" and pin_memory=True" if gpu else ""))
    if cpu is not None and cpu >= INPUT_CPU_BUSY:
        step += ("; the CPUs are already saturated, so also make preprocessing cheaper (batched transforms, "
                 + ("decode on GPU, " if gpu else "") + "cache preprocessed data)")
    return step


def low_activity_advice(wait: float | None, cpu: float | None, num_workers=None) -> tuple[str, str]:
    """(finding id, next step) for a GPU often below 50 %: input-bound when the loop waits for
    data, else host-side work inside the step, else (no steps) the advice to report them."""
    if waits_for_input(wait, cpu):
        return "input-bound", input_advice(num_workers, cpu)
    return "gpu-underused", UNDERUSED_IN_STEP_ADVICE if wait is not None else NO_STEPS_ADVICE


def _serving_only(summary: dict) -> bool:
    """Requests and no steps: the serving checks (serving_findings.py) say what limits it."""
    return not (summary.get("steps") or {}).get("count") and bool((summary.get("requests") or {}).get("count"))


@uses("sm_util")
def input_bound(experiment) -> Finding | None:
    s = summary_of(experiment)
    overall, steps, host = s.get("overall", {}), s.get("steps", {}), s.get("host", {})
    if not gpu_measured(experiment.meta):
        return _input_bound_host(experiment, s)
    low = as_float(overall.get("sm_low_frac"))
    if low is None or low < INPUT_SM_LOW_FRAC or _serving_only(s):
        return None
    wait = as_float(steps.get("data_wait_frac")) if steps.get("count") else None
    cpu = as_float(host.get("cpu_util_mean"))
    if not waits_for_input(wait, cpu):
        return None
    evidence = f"{_sm_name(experiment)} < 50 % for {_fig(experiment, 'sm_low_frac', low, 'share')} of the time"
    if wait is not None:
        evidence += f" while the loop waited for data {_fig(experiment, 'data_wait_frac', wait, 'share')} of the time"
    if cpu is not None:
        evidence += f" and the process tree used {_fig(experiment, 'cpu_util_mean', cpu, '%')} of its CPUs"
    step = input_advice(experiment.meta.params.get("num_workers"), cpu)
    return Finding("input-bound", "Input-bound: the GPU waits for data", "high", evidence, step,
                   {"sm_low_frac": low, "data_wait_frac": wait, "cpu_util_mean": cpu})


def _input_bound_host(experiment, s: dict) -> Finding | None:
    """A run that read no GPU: the loop's own data wait is the evidence, said of the host only."""
    steps = s.get("steps", {})
    wait = as_float(steps.get("data_wait_frac")) if steps.get("count") else None
    if wait is None or wait < HOST_INPUT_WAIT_FRAC or _serving_only(s):
        return None
    cpu = as_float(s.get("host", {}).get("cpu_util_mean"))
    evidence = (f"the loop waited for data {_fig(experiment, 'data_wait_frac', wait, 'share')} of its step time over "
                f"{steps['count']} steps"
                + (f" while the process tree used {_fig(experiment, 'cpu_util_mean', cpu, '%')} of its CPUs"
                   if cpu is not None else "")
                + f"; no GPU was read in this run (source {experiment.meta.source or 'host'})")
    return Finding("input-bound", "Input-bound: the loop waits for data", "high" if wait >= 0.5 else "medium",
                   evidence, input_advice(experiment.meta.params.get("num_workers"), cpu, gpu=False),
                   {"data_wait_frac": wait, "cpu_util_mean": cpu, "gpu_measured": False})


@uses("sm_util")
def gpu_underused(experiment) -> Finding | None:
    """SM often below 50 % but nothing recorded says why (no steps, CPUs not busy)."""
    s = summary_of(experiment)
    low = as_float(s.get("overall", {}).get("sm_low_frac"))
    if low is None or low < INPUT_SM_LOW_FRAC or input_bound(experiment) is not None or _serving_only(s):
        return None
    steps = s.get("steps", {})
    if steps.get("count"):
        wait = as_float(steps.get("data_wait_frac")) or 0.0
        evidence = (f"{_sm_name(experiment)} < 50 % for {_fig(experiment, 'sm_low_frac', low, 'share')} of the time, "
                    f"but the loop waited for data only {_fig(experiment, 'data_wait_frac', wait, 'share')} of the time: "
                    "the GPU waits for something else in the step")
        step = UNDERUSED_IN_STEP_ADVICE
    else:
        cpu = as_float(s.get("host", {}).get("cpu_util_mean"))
        evidence = (f"{_sm_name(experiment)} < 50 % for {_fig(experiment, 'sm_low_frac', low, 'share')} of the time; "
                    "no steps were reported"
                    + (f" and the process tree used {_fig(experiment, 'cpu_util_mean', cpu, '%')} of its CPUs"
                       if cpu is not None else ""))
        step = no_steps_advice(experiment.meta.context)
    return Finding("gpu-underused", "GPU underused", "medium", evidence, step, {"sm_low_frac": low})


@uses("sm_util", "tensor_util")
def compute_bound(experiment) -> Finding | None:
    """High SM activity, and the tensor cores idle or mixed precision off. Where ``sm_util`` is
    NVML kernel-active time, the finding says only that a kernel was running (``gpu-busy*``):
    how many SMs were busy is not measurable there."""
    overall = summary_of(experiment).get("overall", {})
    sm, low = as_float(overall.get("sm_util_mean")), as_float(overall.get("sm_low_frac"))
    if sm is None or sm < COMPUTE_SM_MEAN or (low is not None and low >= COMPUTE_SM_LOW_FRAC):
        return None
    devices = summary_of(experiment).get("devices", {}).values()
    tensors = [as_float(d.get("tensor_util_mean")) for d in devices]
    tensors = [t for t in tensors if t is not None]
    tensor = sum(tensors) / len(tensors) if tensors else None
    amp = _amp_setting(experiment.meta.params)
    kernel_active = sm_is_kernel_active(experiment.meta)
    (mean, low_text), label = _together(experiment, ("sm_util_mean", sm, "%"), ("sm_low_frac", low, "share"))
    if kernel_active:
        evidence = (f"a kernel was running {mean} of the time (less than half the time for {low_text} of it){label}; "
                    f"{measured_as(experiment.meta, 'sm_util')}")
    else:
        evidence = f"sm_util averaged {mean} (below 50 % for {low_text} of the time){label}"
    if tensor is not None:
        if tensor >= TENSOR_IDLE:
            return None
        evidence += (f" while the tensor cores were active {_fig(experiment, 'tensor_util_mean', tensor, '%')} of the "
                     "time: the math runs in fp32")
    elif amp is False:
        evidence += " and the recorded settings say mixed precision is off"
    elif amp is True:
        return None
    else:
        return Finding("gpu-busy" if kernel_active else "compute-bound",
                       "GPU busy (precision unknown)" if kernel_active else "Compute-bound (precision unknown)", "info",
                       evidence + "; tensor_util was not measured and no amp/precision setting was recorded",
                       "if the model trains in fp32, try torch.autocast (bf16/fp16) with a GradScaler, then a larger "
                       "batch; record --param amp=... so the next diagnosis can tell" + _saturation_hint(kernel_active),
                       {"sm_util_mean": sm, "tensor_util_mean": None, "sm_is_kernel_active": kernel_active})
    return Finding("gpu-busy-fp32" if kernel_active else "compute-bound-fp32",
                   "GPU busy in fp32" if kernel_active else "Compute-bound in fp32", "medium", evidence,
                   "wrap the forward pass in torch.autocast(device_type='cuda', dtype=torch.bfloat16) "
                   "(or fp16 with torch.amp.GradScaler) to use the tensor cores, then raise the batch size "
                   "into the memory this frees" + _saturation_hint(kernel_active),
                   {"sm_util_mean": sm, "tensor_util_mean": tensor, "amp": amp, "sm_is_kernel_active": kernel_active})


def _saturation_hint(kernel_active: bool) -> str:
    return ("; whether the SMs are saturated needs GPM (Hopper and newer) or a --trace window (kernel sizes "
            "and launch gaps)") if kernel_active else ""


def memory_underused(experiment) -> Finding | None:
    """Every GPU's peak memory (torch's reserved pool, else NVML used) below the line."""
    meta, devices = experiment.meta, summary_of(experiment).get("devices", {})
    shares = []
    for dev in meta.gpu_devices:
        d = devices.get(dev["key"], {})
        total = as_float(d.get("gpu_mem_total_bytes")) or as_float(dev.get("memory_total_bytes"))
        torch_used = as_float(d.get("torch_mem_reserved_peak_bytes")) or as_float(d.get("torch_mem_allocated_peak_bytes"))
        used = torch_used if torch_used is not None else as_float(d.get("gpu_mem_peak_bytes"))
        if not total or used is None:
            return None  # a GPU we cannot judge: say nothing
        limit = MEM_UNUSED_TORCH if torch_used is not None else MEM_UNUSED_NVML
        what = "torch's allocator reserved at most" if torch_used is not None else "the GPU used at most"
        shares.append((used / total, limit, dev["key"], used, total, what))
    if not shares or any(share >= limit for share, limit, *_ in shares):
        return None
    share, _, key, used, total, what = max(shares)
    batch = meta.params.get("batch_size")
    (used_text, total_text, share_text), label = _together(
        experiment, ("gpu_mem_peak_bytes", used, "B"), ("device_total_bytes", total, "B"), ("gpu_mem_peak_bytes", share, "share"))
    return Finding("memory-underused", "GPU memory mostly unused", "medium",
                   f"{what} {used_text} of {total_text} ({share_text}){label} on {key}",
                   "raise the batch size" + (f" (batch_size={batch} now)" if batch is not None else "")
                   + " until memory is ~80 % full (scale the learning rate with it), or fit a larger model",
                   {"device": key, "share": share, "used_bytes": used, "total_bytes": total})


def memory_headroom(experiment) -> Finding | None:
    """The largest batch that fits (from the run's breakdown, core/analysis/headroom.py) and,
    when the run's batch does not fit with the margin, the gradient accumulation that keeps
    its effective batch and the activations' share that checkpointing or AMP would free."""
    memory = summary_of(experiment).get("memory") or {}
    batch = run_batch(experiment)
    if as_float(memory.get("headroom_frac")) is None or not memory.get("breakdown") or not batch:
        return None
    try:
        fit = largest_batch([experiment], margin=HEADROOM_MARGIN)
    except ValueError:
        return None
    if fit.batch is None:
        return None
    peak = memory["peak_bytes"]
    activations = memory["breakdown"].get("activations", 0.0) / peak if peak else 0.0
    numbers = {"batch": batch, "largest_batch": fit.batch, "headroom_frac": memory["headroom_frac"],
               "peak_bytes": peak, "device_bytes": fit.device_bytes, "activations_share": activations}
    fixed = estimated(fit.fixed_bytes, "B", fit.basis)  # the line fitted through the run: an estimate with its basis
    (peak_text, total_text, headroom), label = _together(
        experiment, ("peak_bytes", peak, "B"), ("device_total_bytes", fit.device_bytes, "B"),
        ("headroom_frac", memory["headroom_frac"], "share"))
    evidence = (f"peak {peak_text} of {total_text} (headroom {headroom}){label} at batch "
                f"{_steps(batch, 'count')}; activations {_fig(experiment, 'breakdown', activations, 'share')} of the peak; "
                f"memory ~ {fmt_figure(fixed, labelled=False)} + "
                f"{fmt_figure(estimated(fit.per_sample_bytes, 'B', fit.basis), labelled=False)} x batch"
                f"{provenance_label(fixed)}")
    if fit.batch < batch:
        micro, steps = fit.accumulation_for(int(batch)) or (0, 0)
        step = (f"batch {_steps(batch, 'count')} does not fit with a {100 * HEADROOM_MARGIN:.0f} % margin: "
                + (f"use batch {micro} with gradient accumulation over {steps} steps (effective batch "
                   f"{micro * steps}); " if micro else "not even one sample fits; ")
                + f"activation checkpointing (torch.utils.checkpoint) or AMP (bf16/fp16 halves activations) "
                  f"would free part of the {_fig(experiment, 'breakdown', activations, 'share')} held by activations")
        numbers.update(micro_batch=micro, accumulation_steps=steps)
        return Finding("memory-does-not-fit", "The batch does not fit in GPU memory", "high", evidence, step, numbers)
    if fit.batch <= batch:
        return None
    return Finding("largest-batch", f"A batch up to {fit.batch} fits", "info", evidence,
                   f"the largest batch that fits with a {100 * HEADROOM_MARGIN:.0f} % margin is about {fit.batch} "
                   "(an estimate from one run: gpuprof_jupyter.largest_batch(run_a, run_b) fits two or more batch "
                   "sizes); scale the learning rate with the batch", numbers)


@uses("throttle_reasons")
def throttled(experiment) -> Finding | None:
    devices = summary_of(experiment).get("devices", {})
    worst = None
    for key, d in devices.items():
        for reason, share in (d.get("throttle_shares") or {}).items():
            if reason in _THROTTLES and share >= THROTTLE_SHARE and (worst is None or share > worst[2]):
                worst = (key, reason, share, as_float(d.get("sm_clock_mean_mhz")))
    if worst is None:
        return None
    key, reason, share, clock = worst
    thermal = "thermal" in reason or reason == "hw_slowdown"
    evidence = (f"{key} clocks were held down by {_THROTTLES[reason]} ({reason}) for "
                f"{_fig(experiment, 'throttle_reasons', share, 'share')} of the measured time")
    if clock is not None:
        evidence += f" (mean SM clock {_fig(experiment, 'sm_clock_mean_mhz', clock, 'MHz')})"
    step = ("check cooling and airflow (nvidia-smi -q -d TEMPERATURE,PERFORMANCE), and spread heavy jobs across nodes"
            if thermal else
            "the GPU is at its power limit: check it with nvidia-smi -q -d POWER (an admin can raise it with "
            "nvidia-smi -pl), or lower the work per watt (mixed precision); per-step time will vary with it")
    return Finding("throttled", "Clocks throttled", "medium", evidence, step,
                   {"device": key, "reason": reason, "share": share, "sm_clock_mean_mhz": clock})


def _idle_stretches(experiment) -> tuple[list[tuple[float, float]], float]:
    from gpuprof_jupyter.core.analysis.series import across_devices

    meta = experiment.meta
    keys = [d["key"] for d in meta.gpu_devices]
    if "sm_util" not in experiment.sample_columns() or not keys:
        return [], 0.0
    t, sm = across_devices(experiment, keys, "sm_util", "max")  # idle: every GPU idle (one device read at a time)
    if not len(t):
        return [], 0.0
    w = sample_weights(t, meta.sampling_interval_s, meta.gaps or ())
    total = float(w[~np.isnan(sm)].sum())
    idle = (sm < IDLE_SM) & ~np.isnan(sm) & (w > 0)
    active = (sm >= IDLE_SM) & ~np.isnan(sm)
    if not active.any():
        return [], total
    first, last = np.argmax(active), len(active) - 1 - np.argmax(active[::-1])
    stretches, start = [], None
    for i in range(first, last + 1):
        if idle[i] and start is None:
            start = i
        elif not idle[i] and start is not None:
            stretches.append((float(t[start]), float(t[i])))
            start = None
    return [s for s in stretches if s[1] - s[0] >= IDLE_MIN_S], total


@uses("sm_util")
def idle_gaps(experiment) -> Finding | None:
    stretches, total = _idle_stretches(experiment)
    if not stretches or total <= 0:
        return None
    idle = sum(e - s for s, e in stretches)
    share = idle / total
    if share < IDLE_SHARE:
        return None
    longest = max(stretches, key=lambda s: s[1] - s[0])
    phases = experiment.meta.phases
    between = ""
    for p in phases:
        if p.get("end_s") is not None and longest[0] <= p["start_s"] <= longest[1] + 0.5:
            between = f", just before phase {p['name']!r}"
            break
        if p.get("end_s") is not None and longest[0] - 0.5 <= p["end_s"] <= longest[1]:
            between = f", just after phase {p['name']!r}"
    return Finding("idle-gaps", "GPU idle between phases", "medium",
                   f"the GPUs were idle ({_sm_name(experiment)} < {IDLE_SM:g} %) for "
                   f"{_fig(experiment, 'sm_util', share, 'share')} of the time in {len(stretches)} stretch(es); the "
                   f"longest lasted {_fig(experiment, 'sm_util', longest[1] - longest[0], 's')} from "
                   f"t={fmt_figure(measured(longest[0], 'offset', CLOCK))}{between}",
                   "overlap the CPU work with training: prefetch the next phase's data in a background "
                   "thread or DataLoader, checkpoint and evaluate asynchronously, and move preprocessing "
                   "into DataLoader workers",
                   {"idle_share": share, "stretches": len(stretches), "longest_s": longest[1] - longest[0]})


@uses("sm_util")
def lagging_gpu(experiment) -> Finding | None:
    devices = summary_of(experiment).get("devices", {})
    means = {k: as_float(d.get("sm_util_mean")) for k, d in devices.items()}
    means = {k: v for k, v in means.items() if v is not None}
    if len(means) < 2:
        return None
    slowest = min(means, key=means.get)
    others = [v for k, v in means.items() if k != slowest]
    median = float(np.median(others))
    if median < LAG_MIN_SM or means[slowest] >= LAG_RATIO * median:
        return None
    (slow_text, others_text, change), label = _together(
        experiment, ("sm_util_mean", means[slowest], "%"), ("sm_util_mean", median, "%"),
        ("sm_util_mean", means[slowest] / median - 1, "change"))
    return Finding("lagging-gpu", "One GPU lags the others", "high",
                   f"{slowest} averaged {_sm_name(experiment)} {slow_text} while the other {len(others)} GPU(s) "
                   f"averaged {others_text} ({change}){label}; in data-parallel "
                   "training the others wait for it at every synchronisation",
                   f"look at {slowest}: throttling and temperature (nvidia-smi -q -d PERFORMANCE), its PCIe/NVLink "
                   "link (nvidia-smi topo -m), other processes on it, and whether its data shard or batch is larger",
                   {"device": slowest, "sm_util_mean": means[slowest], "others_median": median})


def _ms(seconds: float) -> str:
    """A rank's time per step (its median), measured by its step hooks."""
    return _steps(seconds, "time")


def _rank_figures(experiment) -> dict[int, dict]:
    ranks = (summary_of(experiment).get("ranks") or {})
    return {int(r): f for r, f in ranks.items() if f.get("count") and "forked_from" not in f}  # forks: no peers


def straggler_rank(experiment) -> Finding | None:
    """The rank whose data wait, or (ranks not in step) step time, stands out, with the cause;
    in a job, a host whose every rank stands out so is a slow node (``job_findings.slow_node``)."""
    ranks = _rank_figures(experiment)
    if len(ranks) < 2:
        return None
    waits = {r: f["wait_p50_s"] for r, f in ranks.items()}
    slow = max(waits, key=waits.get)
    others = [w for r, w in waits.items() if r != slow]
    step = ranks[slow]["step_time_p50_s"]
    name = rank_name(experiment, slow)
    if waits[slow] - float(np.median(others)) >= STRAGGLER_SHARE * step:
        node = slow_node(experiment, ranks, slow, waits, lambda r, rest: waits[r] - median_of(waits, rest)
                         >= STRAGGLER_SHARE * ranks[r]["step_time_p50_s"], "data", "data wait per step",
                         gpu=gpu_measured(experiment.meta))
        if node is not None:
            return node
        workers = ranks_params(experiment, slow).get("num_workers")
        return Finding("straggler-rank", f"{name[0].upper()}{name[1:]} is the straggler: its data loading", "high",
                       f"{name} waited {_ms(waits[slow])} per step for data (median) while the other "
                       f"{len(others)} rank(s) waited {_ms(float(np.median(others)))}; its steps took {_ms(step)}, "
                       "and in synchronous training every other rank waits for it",
                       f"speed up {name}'s input: " + input_advice(workers, gpu=gpu_measured(experiment.meta))
                       + "; check its data shard (size, storage) and its host's CPUs",
                       {"rank": slow, "host": rank_host(experiment, slow), "cause": "data", "wait_p50_s": waits[slow],
                        "others_wait_p50_s": float(np.median(others))})
    times = {r: f["step_time_p50_s"] for r, f in ranks.items()}
    slow = max(times, key=times.get)
    name = rank_name(experiment, slow)
    median = float(np.median([t for r, t in times.items() if r != slow]))
    if times[slow] < STRAGGLER_RATIO * median:
        return None  # steps in lockstep (synchronous training) or alike: the waiting finding tells
    node = slow_node(experiment, ranks, slow, times, lambda r, rest: times[r] >= STRAGGLER_RATIO * median_of(times, rest),
                     "compute", "step time", gpu=gpu_measured(experiment.meta))
    if node is not None:
        return node
    gpu = ranks[slow].get("gpu") or ranks[slow].get("device") or "its device"
    where = (f"{name}'s GPU ({gpu}): throttling, other processes on it, its link" if gpu_measured(experiment.meta)
             else f"{name}'s CPUs (no GPU was read): other processes on them, its threads (torch.set_num_threads)")
    return Finding("straggler-rank", f"{name[0].upper()}{name[1:]} is the straggler: its compute", "high",
                   f"{name}'s steps took {_ms(times[slow])} (median) against {_ms(median)} on the other ranks, "
                   f"with no more data wait ({_ms(waits[slow])})",
                   f"look at {where}; and at whether its batch or shard is larger",
                   {"rank": slow, "host": rank_host(experiment, slow), "cause": "compute", "step_time_p50_s": times[slow]})


def ranks_waiting(experiment) -> Finding | None:
    """Ranks whose step time is well above their compute plus data wait: waiting for the others."""
    ranks = _rank_figures(experiment)
    waiting = {r: f for r, f in ranks.items()
               if f.get("sync_wait_p50_s", 0) >= RANK_WAIT_SHARE * f["step_time_p50_s"] > 0}
    if len(ranks) < 2 or not waiting:
        return None
    names = listed(waiting)
    first = next(iter(waiting.values()))
    slowest = [r for r in ranks if r not in waiting]
    return Finding("ranks-waiting", f"Ranks wait for each other (rank {names})", "medium",
                   f"rank {names}: steps of {_ms(first['step_time_p50_s'])} (median) of which compute is about "
                   f"{_ms(first['compute_p50_s'])} and data wait {_ms(first['wait_p50_s'])}; the remaining "
                   f"{_ms(first['sync_wait_p50_s'])} ({_steps(first['sync_wait_p50_s'] / first['step_time_p50_s'], 'share')}) "
                   "is spent waiting at the synchronisation"
                   + (f" for rank {listed(slowest)}" if slowest else ""),
                   "make the slowest rank faster (its finding, if any, says why it is slow); balance the shards and "
                   "the batch per rank", {"ranks": list(waiting), "sync_wait_p50_s": first["sync_wait_p50_s"]})


def rank_gpu_mismatch(experiment) -> Finding | None:
    """A rank on another GPU than its neighbours assume (device = LOCAL_RANK), or ranks sharing one."""
    from gpuprof_jupyter.core.analysis.ranks import cuda_index, physical_gpu

    info = experiment.meta.context.get("ranks") or {}
    on_gpu = {int(r): i for r, i in info.items() if cuda_index(i) is not None}
    if len(on_gpu) < 2:
        return None
    physical = {r: physical_gpu(i) for r, i in on_gpu.items()}
    shared = {}
    for r, gpu in physical.items():  # in a job, GPU 0 of one host is not GPU 0 of another
        if gpu is not None:
            shared.setdefault((on_gpu[r].get("host"), gpu), []).append(r)
    for (host, gpu), ranks in shared.items():
        if len(ranks) > 1:
            where = f"GPU {gpu}" + (f" on {host}" if host and len(job_hosts(experiment)) > 1 else "")
            return Finding("rank-gpu-mismatch", f"Ranks {listed(ranks)} share {where}", "high",
                           f"ranks {listed(ranks)} all put their parameters on {where} "
                           f"({listed(on_gpu[r]['device'] for r in ranks)})",
                           "call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before building the model, "
                           "and pass device_ids=[local_rank] to DistributedDataParallel", {"gpu": gpu, "ranks": ranks})
    follows = {r: cuda_index(i) == i.get("local_rank") for r, i in on_gpu.items() if i.get("local_rank") is not None}
    odd = [r for r, ok in follows.items() if not ok]
    if odd and len(odd) < len(follows):
        r = odd[0]
        return Finding("rank-gpu-mismatch", f"Rank {r} is not on the GPU its neighbours assume", "high",
                       f"rank {r} (LOCAL_RANK {on_gpu[r]['local_rank']}) trains on {on_gpu[r]['device']}, while the "
                       "other ranks train on cuda:LOCAL_RANK",
                       f"set rank {r}'s device from LOCAL_RANK (torch.cuda.set_device) and check its CUDA_VISIBLE_DEVICES "
                       f"({on_gpu[r].get('cuda_visible_devices')!r})", {"rank": r, "device": on_gpu[r]["device"]})
    return None


def ranks_params(experiment, rank: int) -> dict:
    return ((experiment.meta.context.get("ranks") or {}).get(str(rank)) or {}).get("params") or {}


def _trace(experiment) -> dict:
    return (summary_of(experiment).get("trace") or {}) if experiment.meta.trace else {}


def tiny_kernels(experiment) -> Finding | None:
    """Many short kernels with the GPU idle between them: launch overhead dominates."""
    t = _trace(experiment)
    idle, per_step, median = t.get("gpu_idle") or {}, as_float(t.get("kernels_per_step")), as_float(t.get("kernel_median_us"))
    share = as_float(idle.get("share"))
    if per_step is None or median is None or share is None:
        return None
    if per_step < TRACE_TINY_KERNELS_PER_STEP or median >= TRACE_TINY_KERNEL_US or share < TRACE_GPU_IDLE_SHARE:
        return None
    return Finding("trace-tiny-kernels", "Many tiny kernels: launch overhead", "high",
                   f"in the traced window ({t.get('spec')}) each step launched {_traced(per_step, 'count')} kernels, "
                   f"median {_traced(median / 1e6, 'time')} long, and the GPU sat idle between kernels "
                   f"{_traced(share, 'share')} of the window",
                   "capture the step in a CUDA graph (torch.compile(model, mode='reduce-overhead') or "
                   "torch.cuda.graphs) or fuse kernels with torch.compile; a larger batch makes each kernel longer",
                   {"kernels_per_step": per_step, "kernel_median_us": median, "gpu_idle_share": share})


def host_bound(experiment) -> Finding | None:
    """The GPU idle between kernels that are not tiny: the host does not launch work fast enough."""
    t = _trace(experiment)
    share = as_float((t.get("gpu_idle") or {}).get("share"))
    if share is None or share < TRACE_HOST_BOUND_IDLE or tiny_kernels(experiment) is not None:
        return None
    ops = t.get("operators") or []
    top = ", ".join(r["name"] for r in ops[:3]) or "no operator"
    return Finding("trace-host-bound", "Host-bound: the GPU waits for the CPU between kernels", "high",
                   f"in the traced window ({t.get('spec')}) the GPU ran no kernel {_traced(share, 'share')} of the time; the "
                   f"operators with most GPU time were {top}",
                   "open the merged trace (gpuprof trace NAME) and look at the CPU between kernels: .item()/.cpu() "
                   "syncs (aten::_local_scalar_dense), preprocessing inside the loop, Python overhead; move work "
                   "into DataLoader workers and torch.compile the model",
                   {"gpu_idle_share": share})


_OP_ADVICE = (
    (("addmm", "aten::mm", "bmm", "matmul", "linear", "conv", "gemm"),
     "the math itself: use mixed precision (torch.autocast) for tensor cores, channels_last for convolutions, "
     "and check the shapes are multiples of 8"),
    (("copy_", "aten::to", "_to_copy", "memcpy"),
     "data movement: pin_memory=True with .to(device, non_blocking=True), keep tensors on the GPU between steps"),
    (("_local_scalar_dense", "aten::item"),
     "a synchronisation (.item(), .cpu(), printing a tensor): read values every N steps, not every step"),
)


def dominant_operator(experiment) -> Finding | None:
    """One operator took most of the traced window."""
    t = _trace(experiment)
    ops = t.get("operators") or []
    share = as_float(ops[0].get("share")) if ops else None
    if share is None or share < TRACE_DOMINANT_SHARE:
        return None
    name = ops[0]["name"]
    advice = next((text for keys, text in _OP_ADVICE if any(k in name for k in keys)),
                  "find where it is called (record_function ranges in the merged trace) and whether it can run "
                  "less often, on smaller tensors or in a fused form (torch.compile)")
    basis = "GPU time of its kernels" if t.get("operator_time") == "cuda" else "CPU self time (CPU activities only)"
    return Finding("trace-dominant-op", f"One operator dominates: {name}", "medium",
                   f"{name} took {_traced(share, 'share')} of the traced window ({t.get('spec')}) by {basis}, "
                   f"{_traced(as_float(ops[0].get('calls_per_step')), 'count')} calls per step",
                   f"this is {advice}", {"operator": name, "share": share, "basis": t.get("operator_time")})


def window_waste(experiment) -> Finding | None:
    """Idle time or exposed communication dominating a traced window (analysis.breakdown_findings);
    the GPU's idle time only when ``host_bound`` has not said it."""
    return waste_finding(_trace(experiment), gpu_idle_said=host_bound(experiment) is not None)


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
