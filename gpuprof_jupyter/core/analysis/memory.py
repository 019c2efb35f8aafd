"""A run's memory figures: per-step peaks, where the peak went, what lies outside PyTorch.

Runs in any process (core).

``memory_summary`` builds ``summary["memory"]`` (docs/memory.md) from what the run stored:
the steps' ``peak_memory_bytes`` (torch's allocator peak per step, reset at each step's end
by ``runtime/hooks/memory_hooks.py``), the sampled step's counted categories
(``meta.context["memory"]``) and the per-device figures of ``analysis.summary`` (NVML's
memory of this kernel's processes, torch's reserved peak, the device's total). All bytes;
a figure nobody measured is absent, never a zero.
"""

from __future__ import annotations

import math

import numpy as np

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other")
ALLOCATOR_BASIS = "torch.cuda.max_memory_allocated (per step, reset at each step's end)"
TENSOR_BASIS = ("CPU tensor sizes counted in one sampled step: the sum of the parameters, gradients, optimizer "
                "state and saved activations, not an allocator's peak (no CUDA allocator in use: host memory, "
                "not a GPU's)")


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def step_peaks(steps) -> np.ndarray:
    """The finite per-step peaks (bytes) of a step table (empty for runs without them)."""
    if steps is None or len(steps) == 0 or "peak_memory_bytes" not in steps:
        return np.zeros(0)
    peaks = np.asarray(steps["peak_memory_bytes"], dtype="float64")
    return peaks[np.isfinite(peaks)]


def memory_summary(context: dict, steps, per_device: dict) -> dict:
    """``summary["memory"]``: ``peak_bytes`` and ``basis``; ``breakdown`` (bytes per category of
    ``CATEGORIES``; ``other`` only beside an allocator's peak: counted CPU tensors leave it
    unknown, absent, never 0) when a step was sampled; ``step_peak_p50_bytes``/``step_peak_max_bytes``;
    ``counts``: what the peak counts, ``"cuda_allocator"`` or ``"cpu_tensors"``;
    ``device_total_bytes``, ``headroom_frac`` (only for the allocator's peak: CPU tensors are
    never set against a GPU's total, real or simulated); ``outside_torch_bytes`` (NVML's memory of this
    kernel minus torch's reserved peak: CUDA context, NCCL, cuBLAS workspaces); ``low_headroom``:
    the allocator snapshots ``--memory-history`` saved when a step's headroom ran low, per rank."""
    out: dict = {}
    peaks = step_peaks(steps)
    if len(peaks):
        out["step_peak_p50_bytes"] = float(np.median(peaks))
        out["step_peak_max_bytes"] = float(peaks.max())
    record = context.get("memory") if isinstance(context.get("memory"), dict) else None
    counted = record.get("counted") if record else None
    if not (isinstance(counted, dict) and counted and all(_finite(v) and v >= 0 for v in counted.values())):
        counted = None  # a record written by hand or damaged: no breakdown rather than a wrong one
    candidates = [float(peaks.max())] if len(peaks) else []
    if record and _finite(record.get("sampled_peak_bytes")):
        candidates.append(float(record["sampled_peak_bytes"]))
    if candidates:
        out["peak_bytes"], out["basis"] = max(candidates), ALLOCATOR_BASIS
        out["counts"] = "cuda_allocator"
    elif counted:
        out["peak_bytes"] = float(sum(counted.values()))
        out["basis"] = TENSOR_BASIS
        out["counts"] = "cpu_tensors"
    if counted:
        total = float(sum(counted.values()))
        breakdown = {name: float(counted.get(name, 0)) for name in CATEGORIES[:-1]}
        if out.get("counts") == "cuda_allocator":  # the rest of the allocator's peak; unknown (absent) otherwise
            breakdown["other"] = max(0.0, out["peak_bytes"] - total)
        out["breakdown"] = breakdown
        if _finite(record.get("uncounted_saved_tensors")):  # saved tensors with no storage to count
            out["uncounted_saved_tensors"] = int(record["uncounted_saved_tensors"])
    totals = [d.get("gpu_mem_total_bytes") for d in per_device.values() if _finite(d.get("gpu_mem_total_bytes"))]
    if totals and out.get("counts") != "cpu_tensors":  # CPU tensors are never set against a GPU's total
        out["device_total_bytes"] = float(min(totals))  # the smallest device is the wall
        if "peak_bytes" in out:
            out["headroom_frac"] = max(0.0, 1.0 - out["peak_bytes"] / out["device_total_bytes"])
    outside = [d["own_gpu_mem_peak_bytes"] - d["torch_mem_reserved_peak_bytes"] for d in per_device.values()
               if _finite(d.get("own_gpu_mem_peak_bytes")) and _finite(d.get("torch_mem_reserved_peak_bytes"))]
    if outside:
        out["outside_torch_bytes"] = max(0.0, max(outside))
    history = context.get("memory_history")
    if isinstance(history, dict) and isinstance(history.get("low_headroom"), list):  # --memory-history ran low
        out["low_headroom"] = [r for r in history["low_headroom"] if isinstance(r, dict)]
    return out if set(out) - {"device_total_bytes"} else {}  # the device's size alone says nothing of the run


__all__ = ["ALLOCATOR_BASIS", "CATEGORIES", "TENSOR_BASIS", "memory_summary", "step_peaks"]
