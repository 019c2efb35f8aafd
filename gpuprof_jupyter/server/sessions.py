"""Each kernel's session state: how long its GPUs have sat idle while it held their memory (docs/session.md).

Runs in the Jupyter server.

Every kernel's sampler process writes a small state file beside the kernels' connection files
(``<runtime dir>/gpuprof-sessions/<kernel id>.state.json``: whether a cell runs, since when the
GPUs are idle while memory is held, how much). This server reads the files of its own kernels
only (``kernel_ids``: its kernel manager's), so what it answers is this user's: on JupyterHub each
user's server runs as that user with a runtime folder of their own. The same states become
Prometheus gauges on the server's ``/metrics`` (``SessionCollector``), labelled by user and kernel.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable, Iterable

from gpuprof_jupyter.core.protocol import SESSION_RECORD_FOLDER as RECORD_FOLDER
from gpuprof_jupyter.server.culling import read_marker

MAX_STATE_BYTES = 64 * 1024  # a state file is a few hundred bytes; anything larger is not ours
STALE_AFTER_S = 120.0  # a state not rewritten for this long (its writer is every 30 s) is said stale


def session_states(runtime_dir: str | os.PathLike, kernel_ids: Iterable[str] | None,
                   now: float | None = None) -> list[dict]:
    """One dict per kernel of ``kernel_ids`` (None: every file) with a state file: ``kernel``,
    ``user``, ``on``, ``cell_running``, ``idle_s`` (seconds the GPUs have sat idle while it held
    memory, as of ``now``; 0 while a cell runs or nothing is held), ``memory_held_bytes``
    (None: unknown), ``updated`` (when its state was written), ``stale`` and ``cull_at`` (when
    GPU-aware culling will shut it down, culling.py; None: not warned)."""
    folder = Path(runtime_dir) / RECORD_FOLDER
    wanted = None if kernel_ids is None else set(kernel_ids)
    now = time.time() if now is None else now
    out = []
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return []
    for entry in entries:
        if not entry.name.endswith(".state.json") or not entry.is_file(follow_symlinks=False):
            continue
        state = _read(entry.path)
        kernel = state.get("kernel") if isinstance(state, dict) else None
        if not isinstance(kernel, dict) or (wanted is not None and kernel.get("id") not in wanted):
            continue
        row = _row(state, kernel, now)
        marker = read_marker(runtime_dir, row["kernel"])
        row["cull_at"] = _number(marker.get("cull_at")) if marker else None
        out.append(row)
    return out


def _read(path: str):
    try:
        if os.stat(path, follow_symlinks=False).st_size > MAX_STATE_BYTES:
            return None
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None  # being replaced, or not ours: the next poll reads it


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _row(state: dict, kernel: dict, now: float) -> dict:
    held = _number(state.get("memory_held_bytes"))
    since = _number(state.get("idle_since"))
    running = bool(state.get("cell_running"))
    idle = max(0.0, now - since) if since is not None and not running and held else 0.0
    written = _number(state.get("written"))
    return {"kernel": str(kernel.get("id")), "user": str(kernel.get("user", "")), "on": bool(state.get("on")),
            "cell_running": running, "idle_s": idle, "memory_held_bytes": held,
            "memory_provenance": state.get("memory_provenance"), "updated": written,
            "stale": written is None or now - written > STALE_AFTER_S}


class SessionCollector:
    """Prometheus gauges of every kernel's session state, labelled ``user`` and ``kernel``:
    ``gpuprof_session_gpu_idle_held_seconds``, ``gpuprof_session_gpu_memory_held_bytes`` and
    ``gpuprof_session_cell_running``. ``states``: a function returning ``session_states`` rows."""

    def __init__(self, states: Callable[[], list[dict]]) -> None:
        self.states = states

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        idle = GaugeMetricFamily("gpuprof_session_gpu_idle_held_seconds",
                                 "Seconds the GPUs have sat idle while this kernel held GPU memory",
                                 labels=["user", "kernel"])
        memory = GaugeMetricFamily("gpuprof_session_gpu_memory_held_bytes",
                                   "GPU memory this kernel holds (its process tree, per NVML)", labels=["user", "kernel"])
        running = GaugeMetricFamily("gpuprof_session_cell_running", "1 while a cell of this kernel runs",
                                    labels=["user", "kernel"])
        try:
            rows = self.states()
        except Exception:  # noqa: BLE001 - a scrape never fails for our part
            rows = []
        for row in rows:
            labels = [row["user"], row["kernel"]]
            idle.add_metric(labels, row["idle_s"])
            if row["memory_held_bytes"] is not None:
                memory.add_metric(labels, row["memory_held_bytes"])
            running.add_metric(labels, 1.0 if row["cell_running"] else 0.0)
        yield idle
        yield memory
        yield running


_registered: SessionCollector | None = None


def register_metrics(states: Callable[[], list[dict]], registry=None) -> SessionCollector:
    """Put the gauges on ``registry`` (the server's ``/metrics`` serves prometheus_client's
    default one). Once a process: a later server in the same process takes the collector over."""
    global _registered
    if registry is not None:
        collector = SessionCollector(states)
        registry.register(collector)
        return collector
    if _registered is None:
        from prometheus_client import REGISTRY

        _registered = SessionCollector(states)
        REGISTRY.register(_registered)
    else:
        _registered.states = states
    return _registered
