"""The Prometheus exporter's life in the sampler process: listen, feed, finish, stop.

Runs in the sampler process.

``%gpuprofile serve`` asks the process (``kernel/runtime/exporter_control.py`` -> link ``serve``);
scrapes are then answered here while the kernel is busy, and the endpoint goes away with the
kernel. The running experiment's latest values reach it at the UI rate, its steps and final
record when it ends.
"""

from __future__ import annotations

import math

from gpuprof_jupyter.core.sources.base import DeviceInfo
from gpuprof_jupyter.sampler_process.exporter import Exporter, wide_listen_warning


class ExporterHost:
    def __init__(self) -> None:
        self.exporter: Exporter | None = None
        self._steps_seen = 0

    # -- requests from the kernel -----------------------------------------------------------------
    def serve(self, port: int, addr: str, run=None) -> str:
        """Listen on ``addr:port`` (0: a free port); what to print. Serving again elsewhere
        moves the endpoint. ExporterBindError names a taken port."""
        if self.exporter is None:
            self.exporter = Exporter()
            if run is not None:
                self.run_started(run)
        elif self.exporter.url is not None:
            if self.exporter.addr == addr and port in (0, self.exporter.port):
                return f"Prometheus metrics already served on {self.exporter.url}"
            self.exporter.close()
        bound = self.exporter.start(addr=addr, port=port)
        lines = [f"Prometheus metrics on {self.exporter.url} (served by the sampler process)"
                 + (f" (port 0 asked: port {bound} chosen)" if port == 0 else "")]
        warning = wide_listen_warning(addr, bound)
        if warning:
            lines.append(warning)
        return "\n".join(lines)

    def stop(self) -> str:
        if self.exporter is None or self.exporter.url is None:
            return "the Prometheus exporter is not running"
        url = self.exporter.url
        self.exporter.close()
        return f"stopped serving Prometheus metrics on {url}"

    # -- fed by the sampler process ----------------------------------------------------------------------
    def run_started(self, run) -> None:
        if self.exporter is None:
            return
        self._steps_seen = 0
        self.exporter.set_devices([DeviceInfo.from_dict(d) for d in run.meta.devices], run.meta.provenance)

    def update(self, run, rows: list) -> None:
        """Twice a second: the latest values (of the live ``rows``) and the steps that ended
        since the last call. Nothing to do while nobody serves."""
        exporter = self.exporter
        if exporter is None:
            return
        latest: dict = {}
        for _, device, values in rows:
            latest.setdefault(device, {}).update(values)
        name = run.meta.name if run is not None and not run.finished else None
        exporter.update(latest, experiment=name)
        if name is not None:
            steps = run.feed.steps
            new = _durations(steps[self._steps_seen:])
            self._steps_seen = len(steps)
            if new:
                exporter.observe_steps(name, new)

    def run_finished(self, run) -> None:
        exporter = self.exporter
        if exporter is None:
            return
        meta = run.meta
        devices = (meta.summary or {}).get("devices") or {}
        peaks = {device: float(stats["gpu_mem_peak_bytes"]) for device, stats in devices.items()
                 if _finite(stats.get("gpu_mem_peak_bytes"))}
        exporter.experiment_finished(
            meta.name, duration_s=float(meta.duration_s or 0.0),
            step_durations=_durations(run.feed.steps),
            gpu_mem_used_bytes=peaks or None)

    def close(self) -> None:
        if self.exporter is not None:
            self.exporter.close()


def _durations(steps) -> list[float]:
    """The measured durations of steps as the kernel sends them (``finish.STEP_FIELDS``)."""
    return [s[1] for s in steps if _finite(s[1])]


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
