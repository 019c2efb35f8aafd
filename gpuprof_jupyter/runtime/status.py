"""``%gpuprofile status``: the store, the running session and the GPUs NVML sees, as text.

Here rather than in the view: views never talk to NVML (DESIGN, "Shape").
"""

from __future__ import annotations

from ..sources.select import probe_gpus
from ..store.directory import Store
from .session import current_session


def status_text(store: Store) -> str:
    session = current_session()
    lines = [f"store: {store.root.resolve()} ({len(store.list())} experiments)"]
    if session is not None and session.meta is not None:
        lines.append(f"profiling: {session.meta.name!r} ({session.meta.source}), {session.recorder.rows} rows so far")
    else:
        lines.append("profiling: nothing running")
    devices, problem = probe_gpus()
    if devices:
        lines.append("NVML: " + ", ".join(f"{d.key} {d.name}" for d in devices))
    else:
        lines.append(f"NVML: unavailable ({problem})")
    return "\n".join(lines)
