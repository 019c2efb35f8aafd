"""``%gpuprofile status``'s text: the store, the running session, the GPUs NVML sees, the sampler process.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command (``notebook/status.py``
gathers the facts in the kernel and prints this text).
"""

from __future__ import annotations


def status_text(store_root, experiments: int, running, rows_seen: int, devices: list[dict], problem: str | None,
                sampler_pid: int | None) -> str:
    """One line each: the store (``store_root``, with its number of ``experiments``), the run
    going on (``running``: its metadata, None when nothing runs, with the ``rows_seen`` so far),
    the GPUs NVML sees (``devices``, else why not: ``problem``) and the sampler process's pid
    (None: not running)."""
    lines = [f"store: {store_root} ({experiments} experiments)"]
    if running is not None:
        lines.append(f"profiling: {running.name!r} ({running.source}), {rows_seen} rows so far")
    else:
        lines.append("profiling: nothing running")
    if devices:
        lines.append("NVML: " + ", ".join(f"{d['key']} {d['name']}" for d in devices))
    else:
        lines.append(f"NVML: unavailable ({problem})")
    lines.append(f"sampler process: pid {sampler_pid}" if sampler_pid is not None else "sampler process: not running")
    return "\n".join(lines)
