"""GPU-aware culling, opt-in: shut down a kernel whose GPUs sat idle too long while it held their memory.

Runs in the Jupyter server.

Off unless ``c.GPUProfiler.cull_idle_gpu_s`` is set. Every ``cull_check_s`` the server reads its
kernels' session states (``sessions.session_states``). A kernel that has held GPU memory with its
GPUs idle for ``cull_idle_gpu_s - cull_warning_s`` is warned: a marker beside its state
(``<kernel>.cull.json``, with the time it will be shut down) that the sessions endpoint passes on,
so its notebook shows a notification and the status bar counts down. A cell that runs, or memory
freed, withdraws the warning. At ``cull_idle_gpu_s`` the marker records the shutdown and the
kernel manager shuts the kernel down; the kernel's sampler process, which ends with it, adds what
happened to the kernel's session record. A stale state (its writer gone) is never acted on.
jupyter_server's own ``cull_idle_timeout`` goes on as before: this culls by GPU memory held, that
by kernel activity.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from gpuprof_jupyter.core.format import fmt_bytes, fmt_unit
from gpuprof_jupyter.core.protocol import SESSION_RECORD_FOLDER

CULL_SUFFIX = ".cull.json"


def cull_marker(runtime_dir, kernel: str) -> Path:
    """Where the culling decision about ``kernel`` is written (read by the sessions endpoint and
    by the kernel's sampler process at its end)."""
    return Path(runtime_dir) / SESSION_RECORD_FOLDER / f"{kernel}{CULL_SUFFIX}"


class GpuCuller:
    """``check()`` once per ``cull_check_s``: warn, withdraw, or shut down (see the module docstring)."""

    def __init__(self, config, states, runtime_dir, shutdown, log=None) -> None:
        self.config = config
        self.states = states  # () -> session_states rows of this server's kernels
        self.runtime_dir = runtime_dir
        self.shutdown = shutdown  # async (kernel id) -> None: the kernel manager's shutdown_kernel
        self.log = log
        self.warned: dict[str, float] = {}  # kernel -> when it will be shut down
        self.culled: list[dict] = []  # what it did (tests, the log)

    async def check(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        limit, ahead = self.config.cull_idle_gpu_s, self.config.cull_warning_s
        if limit <= 0:
            return
        for row in self.states():
            kernel = row["kernel"]
            held = row["memory_held_bytes"] or 0
            if row["stale"]:
                continue
            if row["cell_running"] or not held or row["idle_s"] < limit - ahead:
                if kernel in self.warned:
                    self._withdraw(kernel)
                continue
            cull_at = now + max(0.0, limit - row["idle_s"])
            if kernel not in self.warned:
                self.warned[kernel] = cull_at
                self._write(kernel, {"warned_at": now, "cull_at": cull_at, "idle_s": row["idle_s"],
                                     "memory_held_bytes": held, "limit_s": limit})
            if row["idle_s"] >= limit:
                record = {"warned_at": now, "cull_at": now, "culled_at": now, "idle_s": row["idle_s"],
                          "memory_held_bytes": held, "limit_s": limit, "user": row["user"]}
                self._write(kernel, record)
                self.warned.pop(kernel, None)
                self.culled.append({"kernel": kernel, **record})
                if self.log is not None:
                    self.log.warning("gpuprof: shutting down kernel %s: its GPUs sat idle %s while it held "
                                     "%s (c.GPUProfiler.cull_idle_gpu_s = %g)", kernel, fmt_unit(row["idle_s"], "s", 0),
                                     fmt_bytes(held), limit)
                await self.shutdown(kernel)

    def _withdraw(self, kernel: str) -> None:
        self.warned.pop(kernel, None)
        try:
            cull_marker(self.runtime_dir, kernel).unlink()
        except OSError:
            pass

    def _write(self, kernel: str, body: dict) -> None:
        from gpuprof_jupyter.core.store.atomic import write_json_atomic

        path = cull_marker(self.runtime_dir, kernel)
        if path.parent.is_dir():  # the kernel's sampler process made it; never made here
            write_json_atomic(path, body)


def read_marker(runtime_dir, kernel: str) -> dict | None:
    """The culling decision about ``kernel``, if any."""
    try:
        with open(cull_marker(runtime_dir, kernel), encoding="utf-8") as f:
            body = json.load(f)
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def start_culling(server_app, config, states):
    """The periodic check, when ``cull_idle_gpu_s`` is set; returns it (None when off)."""
    if config.cull_idle_gpu_s <= 0:
        return None
    from jupyter_core.utils import ensure_async
    from tornado.ioloop import PeriodicCallback

    async def shutdown(kernel: str) -> None:
        await ensure_async(server_app.kernel_manager.shutdown_kernel(kernel))

    culler = GpuCuller(config, states, server_app.runtime_dir, shutdown, server_app.log)
    periodic = PeriodicCallback(culler.check, config.cull_check_s * 1000)
    periodic.start()
    culler.periodic = periodic
    server_app.log.info("gpuprof_jupyter: GPU-aware culling on: idle GPUs held %s (warned %s ahead)",
                        fmt_unit(config.cull_idle_gpu_s, "s"), fmt_unit(config.cull_warning_s, "s"))
    return culler
