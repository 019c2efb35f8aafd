"""An out-of-memory error that explains itself: what torch said, what the run knew, what to do.

Runs in any process (core).

When a run dies of ``torch.OutOfMemoryError`` the process that trained stores
``context["oom"]`` (``runtime/hooks/oom_record.py``: torch's message, the optimizers' tensors
counted at the error, the largest batch fitted over earlier runs of the same cell, the saved
allocator history). ``oom_summary`` turns it, with the rest of the run's memory figures, into
``summary["memory"]["oom"]`` (docs/memory.md, "Out of memory"): the step, the bytes requested
(parsed from torch's message), the breakdown at the last step, the other processes' memory on
the same GPU, the largest batch that would fit, and the next steps in order.
"""

from __future__ import annotations

import math
import re

from gpuprof_jupyter.core.analysis.sharing import others_by_device
from gpuprof_jupyter.core.format import fmt_bytes, fmt_frac

_UNITS = {"bytes": 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}
_SIZE = r"([0-9][0-9.]*)\s*(bytes|B|KiB|MiB|GiB|TiB)"
# torch's allocator message (c10/cuda/CUDACachingAllocator.cpp), one figure per pattern
_FIELDS = {
    "requested_bytes": rf"Tried to allocate {_SIZE}",
    "device_total_bytes": rf"total capacity of {_SIZE}",
    "free_bytes": rf"of which {_SIZE} is free",
    "process_in_use_bytes": rf"this process has {_SIZE} memory in use",
    "allocated_by_pytorch_bytes": rf"{_SIZE} is allocated by PyTorch",
    "reserved_unallocated_bytes": rf"{_SIZE} is reserved by PyTorch but unallocated",
}
_DEVICE = re.compile(r"GPU (\d+) has a total capacity")
FRAGMENTED_SHARE = 0.05  # reserved-but-unallocated above this share of the device: fragmentation
ACTIVATIONS_SHARE = 0.3  # activations above this share of the peak: checkpointing or AMP pays
OPTIMIZER_SHARE = 0.2  # optimizer state above this share of the peak: a lighter or sharded optimizer pays
GROWTH_STEPS, GROWTH_SHARE = 3, 0.2  # step peaks rising this long and this much: memory kept across steps
MEMORY_VIEWER = "https://pytorch.org/memory_viz"


def parse_oom_message(message: str) -> dict:
    """The figures in torch's out-of-memory message (bytes; ``device``: the GPU's index).
    A figure the message does not carry (another allocator, another torch) is absent."""
    out: dict = {}
    for key, pattern in _FIELDS.items():
        match = re.search(pattern, message)
        if match:
            out[key] = float(match.group(1)) * _UNITS[match.group(2)]
    device = _DEVICE.search(message)
    if device:
        out["device"] = int(device.group(1))
    return out


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def oom_summary(record: dict, memory: dict, context: dict, steps_done: int | None, peaks, batch: float | None) -> dict:
    """``summary["memory"]["oom"]`` from the stored record and the run's other memory figures
    (``memory``: the rest of ``summary["memory"]``; ``peaks``: the finite step peaks in order)."""
    message = str(record.get("error") or "")
    out: dict = {"error": message, **parse_oom_message(message)}
    if steps_done is not None:  # None: a process that does not count its steps (a child of gpuprof run)
        out["step"] = steps_done + 1
    elif _finite(record.get("optimizer_steps")):  # what that process counted itself
        out["optimizer_steps"] = int(record["optimizer_steps"])
    if batch:
        out["batch"] = batch
    counted = record.get("counted") if isinstance(record.get("counted"), dict) else {}
    breakdown = {k: float(v) for k, v in counted.items() if _finite(v) and v >= 0}
    sampled = memory.get("breakdown") or {}
    if breakdown and _finite(sampled.get("activations")):
        breakdown["activations"] = float(sampled["activations"])  # from the sampled step
    if breakdown:
        out["breakdown"] = breakdown
    peaks = [float(p) for p in peaks]
    if peaks:
        out["last_step_peak_bytes"] = peaks[-1]
    if len(peaks) >= GROWTH_STEPS and all(b >= a for a, b in zip(peaks, peaks[1:])) \
            and peaks[-1] > (1 + GROWTH_SHARE) * peaks[0]:
        out["grew_bytes"] = [peaks[0], peaks[-1]]  # step after step: something keeps tensors across steps
    device_key = f"gpu{out['device']}" if "device" in out else None
    others = others_by_device(context)
    if device_key is not None:  # torch names the GPU (its visible index, as our device keys): that one only
        others = {k: v for k, v in others.items() if k == device_key}
    if others:
        out["other_processes"] = others
    fit = record.get("largest_batch")
    if isinstance(fit, dict) and (fit.get("batch") is None or _finite(fit.get("batch"))):
        out["largest_batch"] = fit
    if isinstance(record.get("memory_history"), dict):
        out["memory_history"] = record["memory_history"]
    out["next_steps"] = next_steps(out, memory)
    return out


def on_gpu(oom: dict) -> bool:
    """Whether the memory that ran out was a GPU's: torch's CUDA message names the device and its
    total; the CPU allocator's ("DefaultCPUAllocator: not enough memory") names neither."""
    return "device" in oom or "device_total_bytes" in oom


def next_steps(oom: dict, memory: dict) -> list[str]:
    """What to do, most likely to help first: someone else's memory, memory kept across steps,
    a batch that fits, the activations or optimizer state, fragmentation, earlier cells'
    tensors, then how to learn more. Out of the host's memory (a model on the CPU), no step
    speaks of a GPU or CUDA."""
    steps = []
    device = oom.get("device_total_bytes") or memory.get("device_total_bytes")
    others = oom.get("other_processes") or {}
    held = sum(d.get("used_memory_bytes") or 0.0 for d in others.values())
    if others:
        where = ", ".join(sorted(others))
        steps.append(f"Other processes hold {fmt_bytes(held) if held else 'memory'} on {where}: another "
                     "notebook's kernel or job on this node? Shut it down (or restart that kernel), or run on a "
                     "free GPU (CUDA_VISIBLE_DEVICES)")
    if oom.get("grew_bytes"):
        first, last = oom["grew_bytes"]
        steps.append(f"Memory grew step after step ({fmt_bytes(first)} -> {fmt_bytes(last)} at each step's peak): "
                     "something keeps tensors across steps (a loss appended without .item(), outputs or hidden "
                     "states kept in a list); keep numbers, or .detach() what you keep")
    fit, batch = oom.get("largest_batch") or {}, oom.get("batch")
    if fit.get("batch") and batch and fit["batch"] >= batch:
        steps.append(f"Earlier runs of this cell fit up to batch {fit['batch']} ({fit.get('basis', '')}), so batch "
                     f"{batch:g} should fit: memory was taken by something else than the batch (above)")
    elif fit.get("batch"):
        text = f"Run at batch {fit['batch']} or less (the largest that fits, {fmt_frac(fit.get('margin', 0.1))} margin"
        text += f"; {fit['basis']})" if fit.get("basis") else ")"
        if batch and fit["batch"] < batch:
            steps_needed = math.ceil(batch / fit["batch"])
            micro = math.ceil(batch / steps_needed)
            text += (f"; to keep the effective batch of {batch:g}, accumulate gradients over {steps_needed} steps "
                     f"of {micro}")
        steps.append(text)
    else:
        steps.append("Find the largest batch that fits: `%%gpuprofile --tune batch_size=...` goes on below a size "
                     "that does not fit, or run at two smaller batch sizes and call gpuprof_jupyter.largest_batch()")
    breakdown = oom.get("breakdown") or {}
    peak = oom.get("last_step_peak_bytes") or memory.get("peak_bytes")
    activations = breakdown.get("activations")
    if activations and peak and activations / peak >= ACTIVATIONS_SHARE:
        steps.append(f"Activations held {fmt_bytes(activations)} ({fmt_frac(activations / peak)} of the last peak): "
                     "activation checkpointing (torch.utils.checkpoint) or AMP (bf16/fp16 halves them)")
    elif breakdown.get("optimizer_state") and peak and breakdown["optimizer_state"] / peak >= OPTIMIZER_SHARE:
        steps.append(f"The optimizer's state holds {fmt_bytes(breakdown['optimizer_state'])}: a lighter optimizer "
                     "(SGD with momentum, 8-bit Adam) or sharding it (ZeRO, FSDP)")
    else:
        steps.append("AMP (bf16/fp16) or activation checkpointing (torch.utils.checkpoint) lower the activations' share")
    reserved = oom.get("reserved_unallocated_bytes")
    if reserved and device and reserved >= FRAGMENTED_SHARE * device:
        steps.append(f"{fmt_bytes(reserved)} is reserved by PyTorch but unallocated (fragmentation): set "
                     "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before CUDA starts")
    if on_gpu(oom):
        steps.append("Tensors from earlier cells count too: `del` them and call torch.cuda.empty_cache(), or restart "
                     "the kernel")
    else:  # the host's memory: a deleted CPU tensor is freed once nothing refers to it, no cache to empty
        steps.append("Tensors from earlier cells count too: `del` them (and what still refers to them: an output "
                     "kept in Out[...] or a list), or restart the kernel")
    if "memory_history" not in oom:
        steps.append("To see which allocations held the memory, run again with --memory-history")
    return steps


__all__ = ["MEMORY_VIEWER", "next_steps", "on_gpu", "oom_summary", "parse_oom_message"]
