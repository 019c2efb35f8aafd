"""``%gpuprofile status``: the store, the running session and the GPUs NVML sees (the text: ``render/status_text.py``).

Runs in the kernel.

A view: the GPUs come from the sampler process through ``runtime/link.py``; the kernel itself never
opens NVML (docs/architecture.md, "Layout").
"""

from __future__ import annotations

from gpuprof_jupyter.runtime.link import probe_gpus, sampler_link
from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.runtime.session import current_session
from gpuprof_jupyter.render.status_text import status_text as render_status


def status_text(store: Store) -> str:
    """The facts of ``%gpuprofile status``, asked here, as ``render/status_text.py`` writes them."""
    session = current_session()
    running = session.meta if session is not None and session.meta is not None else None
    devices, problem = probe_gpus()
    link = sampler_link()
    return render_status(store.root.resolve(), len(store.entries()), running, session.rows_seen if running else 0,
                         devices, problem, link.pid if link.alive else None)


def warm_up() -> None:
    """Start the sampler process in the background (``%load_ext``), so the first profiled
    cell finds it ready. Returns at once."""
    sampler_link().ensure()
