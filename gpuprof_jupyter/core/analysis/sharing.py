"""Who else used the GPUs during a run, from the experiment's context: aggregates only.

Runs in any process (core).

The per-process attribution source stores ``context["gpu_sharing"]`` (counts, peaks and means
per GPU; core/sources/gpu_processes.py). Older experiments (and the NVML source's end-of-run
check) stored ``context["other_gpu_processes"]``, a list with one entry per device (or, in the
oldest, per foreign process, with its PID): it is read as counts per device, and no PID or
name ever leaves this module.
"""

from __future__ import annotations

from gpuprof_jupyter.core.format import fmt_bytes, fmt_pct


def others_by_device(context: dict) -> dict[str, dict]:
    """device key -> {"processes": int, "used_memory_bytes": float | None, "sm_util_mean": float | None}
    for every GPU on which processes that were certainly not the kernel's were seen."""
    sharing = (context.get("gpu_sharing") or {}).get("devices")
    if sharing is not None:
        return {key: {"processes": int(d.get("other_processes_max") or 0),
                      "used_memory_bytes": d.get("other_gpu_mem_peak_bytes"),
                      "sm_util_mean": d.get("other_sm_util_mean")}
                for key, d in sharing.items() if d.get("other_processes_max")}
    out: dict[str, dict] = {}
    for entry in context.get("other_gpu_processes") or []:
        d = out.setdefault(entry.get("device", "?"), {"processes": 0, "used_memory_bytes": None, "sm_util_mean": None})
        d["processes"] += int(entry.get("processes", 1))
        used = entry.get("used_memory_bytes")
        if isinstance(used, (int, float)):
            d["used_memory_bytes"] = (d["used_memory_bytes"] or 0.0) + used
    return out


def unmatched_devices(context: dict) -> list[str]:
    """GPUs on which the kernel's processes could not be told from the others at some read
    (another PID namespace and no sound evidence): own/other figures are partial or missing."""
    devices = (context.get("gpu_sharing") or {}).get("devices") or {}
    return sorted(key for key, d in devices.items() if "unmatched" in (d.get("attribution") or ()))


def describe_others(others: dict[str, dict]) -> str:
    """'2 other processes on gpu0 (5.0 GiB, SM 25 %)' for a warning or a summary line."""
    parts = []
    for key, d in sorted(others.items()):
        n = d["processes"]
        extra = []
        if d.get("used_memory_bytes"):
            extra.append(fmt_bytes(d['used_memory_bytes']))
        if d.get("sm_util_mean") is not None:
            extra.append(f"SM {fmt_pct(d['sm_util_mean'])}")
        parts.append(f"{n} other process{'es' if n != 1 else ''} on {key}" + (f" ({', '.join(extra)})" if extra else ""))
    return ", ".join(parts)
