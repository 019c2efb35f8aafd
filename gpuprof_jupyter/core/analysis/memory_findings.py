"""Findings of the GPU's memory: much of it unused, and the largest batch that would fit.

Runs in any process (core).

Thresholds are module constants so tests and users can see them.
"""

from __future__ import annotations

from gpuprof_jupyter.core.analysis.finding import Finding
from gpuprof_jupyter.core.figure import estimated
from gpuprof_jupyter.core.format import as_float, fmt_figure, fmt_frac, provenance_label
from gpuprof_jupyter.core.analysis.headroom import DEFAULT_MARGIN, largest_batch
from gpuprof_jupyter.core.analysis.run_batch import run_batch
from gpuprof_jupyter.core.analysis.summary import summary_of
from gpuprof_jupyter.core.analysis.finding_text import fig, step_fig, together


MEM_UNUSED_TORCH = 0.35  # torch's allocator reserved less than this share of GPU memory
MEM_UNUSED_NVML = 0.25  # without torch statistics: used memory below this share
HEADROOM_MARGIN = DEFAULT_MARGIN  # the largest batch keeps this share of the device's memory free


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
    (used_text, total_text, share_text), label = together(
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
    (peak_text, total_text, headroom), label = together(
        experiment, ("peak_bytes", peak, "B"), ("device_total_bytes", fit.device_bytes, "B"),
        ("headroom_frac", memory["headroom_frac"], "share"))
    evidence = (f"peak {peak_text} of {total_text} (headroom {headroom}){label} at batch "
                f"{step_fig(batch, 'count')}; activations {fig(experiment, 'breakdown', activations, 'share')} of the peak; "
                f"memory ~ {fmt_figure(fixed, labelled=False)} + "
                f"{fmt_figure(estimated(fit.per_sample_bytes, 'B', fit.basis), labelled=False)} x batch"
                f"{provenance_label(fixed)}")
    if fit.batch < batch:
        micro, steps = fit.accumulation_for(int(batch)) or (0, 0)
        step = (f"batch {step_fig(batch, 'count')} does not fit with a {fmt_frac(HEADROOM_MARGIN)} margin: "
                + (f"use batch {micro} with gradient accumulation over {steps} steps (effective batch "
                   f"{micro * steps}); " if micro else "not even one sample fits; ")
                + f"activation checkpointing (torch.utils.checkpoint) or AMP (bf16/fp16 halves activations) "
                  f"would free part of the {fig(experiment, 'breakdown', activations, 'share')} held by activations")
        numbers.update(micro_batch=micro, accumulation_steps=steps)
        return Finding("memory-does-not-fit", "The batch does not fit in GPU memory", "high", evidence, step, numbers)
    if fit.batch <= batch:
        return None
    return Finding("largest-batch", f"A batch up to {fit.batch} fits", "info", evidence,
                   f"the largest batch that fits with a {fmt_frac(HEADROOM_MARGIN)} margin is about {fit.batch} "
                   "(an estimate from one run: gpuprof_jupyter.largest_batch(run_a, run_b) fits two or more batch "
                   "sizes); scale the learning rate with the batch", numbers)
