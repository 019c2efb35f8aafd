"""``%gpuprofile status``: the store, the running session and the GPUs NVML sees, as text.

Runs in the kernel.

A view: the GPUs come from the sampler process through ``runtime/link.py``; the kernel itself never
opens NVML (docs/architecture.md, "Layout").
"""

from __future__ import annotations

from gpuprof_jupyter.runtime.link import probe_gpus, sampler_link
from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.runtime.session import current_session


def status_text(store: Store) -> str:
    session = current_session()
    lines = [f"store: {store.root.resolve()} ({len(store.entries())} experiments)"]
    if session is not None and session.meta is not None:
        lines.append(f"profiling: {session.meta.name!r} ({session.meta.source}), {session.rows_seen} rows so far")
    else:
        lines.append("profiling: nothing running")
    devices, problem = probe_gpus()
    if devices:
        lines.append("NVML: " + ", ".join(f"{d['key']} {d['name']}" for d in devices))
    else:
        lines.append(f"NVML: unavailable ({problem})")
    link = sampler_link()
    lines.append(f"sampler process: pid {link.pid}" if link.alive else "sampler process: not running")
    return "\n".join(lines)


def warm_up() -> None:
    """Start the sampler process in the background (``%load_ext``), so the first profiled
    cell finds it ready. Returns at once."""
    sampler_link().ensure()
