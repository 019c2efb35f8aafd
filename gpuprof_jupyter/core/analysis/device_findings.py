"""Findings of the GPU's own time: compute-bound, throttled clocks, idle stretches, one GPU lagging the others.

Runs in any process (core).

Where ``sm_util`` is NVML kernel-active time the evidence says so (analysis.provenance).
Thresholds are module constants so tests and users can see them.
"""

from __future__ import annotations

import numpy as np

from gpuprof_jupyter.core.analysis.finding import Finding
from gpuprof_jupyter.core.figure import measured
from gpuprof_jupyter.core.format import as_float, fmt_figure, fmt_unit
from gpuprof_jupyter.core.analysis.run_figures import CLOCK
from gpuprof_jupyter.core.analysis.provenance import measured_as, sm_is_kernel_active
from gpuprof_jupyter.core.analysis.stats import sample_weights
from gpuprof_jupyter.core.analysis.summary import summary_of
from gpuprof_jupyter.core.analysis.finding_text import fig, sm_name, together, uses


COMPUTE_SM_MEAN = 80.0  # compute-bound: mean sm_util at least this...
COMPUTE_SM_LOW_FRAC = 0.20  # ...and below 50 % for less than this share
TENSOR_IDLE = 10.0  # tensor_util mean below this: no tensor cores, i.e. fp32
THROTTLE_SHARE = 0.10  # a throttle reason active for at least this share of the time
IDLE_SM = 5.0  # sm_util below this is "idle"
IDLE_SHARE = 0.10  # interior idle stretches adding up to this share of the run...
IDLE_MIN_S = 1.0  # ...each at least this long
LAG_RATIO = 0.80  # a GPU whose mean sm_util is below this ratio of the others' median
LAG_MIN_SM = 30.0  # and the others are busy at least this much
_THROTTLES = {
    "sw_power_cap": "the software power cap",
    "hw_slowdown": "hardware slowdown (power brake or overheating)",
    "sw_thermal_slowdown": "software thermal slowdown",
    "hw_thermal_slowdown": "hardware thermal slowdown",
    "hw_power_brake_slowdown": "the external power brake",
}


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
    (mean, low_text), label = together(experiment, ("sm_util_mean", sm, "%"), ("sm_low_frac", low, "share"))
    if kernel_active:
        evidence = (f"a kernel was running {mean} of the time (less than half the time for {low_text} of it){label}; "
                    f"{measured_as(experiment.meta, 'sm_util')}")
    else:
        evidence = f"sm_util averaged {mean} (below 50 % for {low_text} of the time){label}"
    if tensor is not None:
        if tensor >= TENSOR_IDLE:
            return None
        evidence += (f" while the tensor cores were active {fig(experiment, 'tensor_util_mean', tensor, '%')} of the "
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
                f"{fig(experiment, 'throttle_reasons', share, 'share')} of the measured time")
    if clock is not None:
        evidence += f" (mean SM clock {fig(experiment, 'sm_clock_mean_mhz', clock, 'MHz')})"
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
                   f"the GPUs were idle ({sm_name(experiment)} < {fmt_unit(IDLE_SM, '%')}) for "
                   f"{fig(experiment, 'sm_util', share, 'share')} of the time in {len(stretches)} stretch(es); the "
                   f"longest lasted {fig(experiment, 'sm_util', longest[1] - longest[0], 's')} from "
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
    (slow_text, others_text, change), label = together(
        experiment, ("sm_util_mean", means[slowest], "%"), ("sm_util_mean", median, "%"),
        ("sm_util_mean", means[slowest] / median - 1, "change"))
    return Finding("lagging-gpu", "One GPU lags the others", "high",
                   f"{slowest} averaged {sm_name(experiment)} {slow_text} while the other {len(others)} GPU(s) "
                   f"averaged {others_text} ({change}){label}; in data-parallel "
                   "training the others wait for it at every synchronisation",
                   f"look at {slowest}: throttling and temperature (nvidia-smi -q -d PERFORMANCE), its PCIe/NVLink "
                   "link (nvidia-smi topo -m), other processes on it, and whether its data shard or batch is larger",
                   {"device": slowest, "sm_util_mean": means[slowest], "others_median": median})
