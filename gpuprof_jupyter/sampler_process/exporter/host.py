"""The Prometheus exporter's life in the sampler process: listen, feed, finish, stop.

Runs in the sampler process.

``%gpuprofile serve`` asks the process (``runtime/exporter_control.py`` -> link ``serve``);
scrapes are then answered here while the kernel is busy, and the endpoint goes away with the
kernel. The running experiment's latest values reach it at the UI rate, its steps and final
record when it ends. Between runs a thread of its own reads the devices once a second (with
the last run's source, else the configured one), so a Prometheus scraping every 15 s sees a
continuous series rather than values that vanish when a run ends.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from gpuprof_jupyter.core.format import as_number
from gpuprof_jupyter.core.sources.base import DeviceInfo, close_all, merged_provenance

if TYPE_CHECKING:  # imported when asked to serve: prometheus_client is 40 ms of the process's start
    from gpuprof_jupyter.sampler_process.exporter.endpoint import Exporter

IDLE_PERIOD_S = 1.0  # between runs, the devices are read once a second
IDLE_RETRY_S = 30.0  # sources that failed to open or read are tried again after this long
PER_RUN_METRICS = {"energy_j"}  # "since the run started": nothing to say between runs


class ExporterHost:
    def __init__(self, kernel_pid: int | None = None) -> None:
        self.exporter: Exporter | None = None
        self._steps_seen = 0
        self._requests_seen = 0
        self._lock = threading.Lock()  # a run's feed and the between-runs readings take turns
        self._running = False
        self._idle_declared = False  # the between-runs devices are the exporter's declared ones
        self._idle_source: tuple[str | None, list | None] = (None, None)  # (spec, devices) between runs
        self._ran = False
        self.kernel_pid = kernel_pid if kernel_pid is not None else os.getppid()  # the kernel started us
        self._between_runs: _BetweenRuns | None = None

    # -- requests from the kernel -----------------------------------------------------------------
    def serve(self, port: int, addr: str, run=None, token: str | None = None, token_file: str | None = None,
              source: str | None = None) -> str:
        """Listen on ``addr:port`` (0: a free port), with ``token`` (None: none); what to print.
        Serving again elsewhere moves the endpoint, the new one bound before the old one
        closes: ExporterBindError names a taken port and the old endpoint keeps serving.
        ``source``: what the devices are read with between runs until a run says otherwise."""
        from gpuprof_jupyter.sampler_process.exporter.endpoint import Exporter, scrape_config, wide_listen_warning

        if self.exporter is None:
            self.exporter = Exporter()
            if run is not None and not run.finished:
                self.run_started(run)
        if not self._ran:
            self._idle_source = (source, None)
        exporter = self.exporter
        before = exporter.url
        if before is not None and exporter.addr == addr and port in (0, exporter.port):
            exporter.token = token
            lines = [f"Prometheus metrics already served on {exporter.url}"]
        else:
            bound = exporter.start(addr=addr, port=port, token=token)
            lines = [f"Prometheus metrics on {exporter.url} (served by the sampler process)"
                     + (f" (port 0 asked: port {bound} chosen)" if port == 0 else "")]
            if before is not None:
                lines.append(f"(moved: {before} is closed)")
        if token is not None:
            lines += [f"A scrape needs the bearer token kept in {token_file} (mode 0600, this user only). "
                      "Prometheus scrape config:", scrape_config(exporter.target, token_file)]
        else:
            lines.append("No authentication (--no-auth): every user of this machine can scrape it "
                         "(experiment names included).")
        warning = wide_listen_warning(addr, exporter.port, token=token is not None)
        if warning:
            lines.append(warning)
        if self._between_runs is None:
            self._between_runs = _BetweenRuns(self)
        return "\n".join(lines)

    def stop(self) -> str:
        if self.exporter is None or self.exporter.url is None:
            return "the Prometheus exporter is not running"
        url = self.exporter.url
        self._stop_between_runs()
        self.exporter.close()
        return f"stopped serving Prometheus metrics on {url}"

    # -- fed by the sampler process ----------------------------------------------------------------------
    def run_started(self, run) -> None:
        if self.exporter is None:
            return
        with self._lock:
            self._running, self._idle_declared = True, False
            self._steps_seen = 0
            self._requests_seen = 0
            self.exporter.set_devices([DeviceInfo.from_dict(d) for d in run.meta.devices], run.meta.provenance)
        if self._between_runs is not None:
            self._between_runs.wake()  # its sources close now

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
        if name is not None:  # its server's own failures (it went on): the running experiment's notes
            run.notes.extend(n for n in list(exporter.notes) if n not in run.notes)
        if name is not None:
            steps = run.feed.steps
            new = _durations(steps[self._steps_seen:])
            self._steps_seen = len(steps)
            if new:
                exporter.observe_steps(name, new)
            requests = run.feed.requests
            latencies = _latencies(requests[self._requests_seen:])
            self._requests_seen = len(requests)
            if latencies:
                exporter.observe_requests(name, latencies)

    def remember_source(self, run) -> None:
        """The devices are read between runs with the last run's source (and devices), whether
        or not anything serves yet: a later ``serve`` keeps it rather than the configured one."""
        with self._lock:
            self._ran = True
            self._idle_source = (run.begin.options.source, run.begin.options.devices)

    def run_finished(self, run) -> None:
        self.remember_source(run)
        exporter = self.exporter
        if exporter is None:
            return
        meta = run.meta
        devices = (meta.summary or {}).get("devices") or {}
        peaks = {device: float(stats["gpu_mem_peak_bytes"]) for device, stats in devices.items()
                 if as_number(stats.get("gpu_mem_peak_bytes")) is not None}
        with self._lock:
            exporter.experiment_finished(
                meta.name, duration_s=float(meta.duration_s or 0.0),
                step_durations=_durations(run.feed.steps), request_latencies=_latencies(run.feed.requests),
                gpu_mem_used_bytes=peaks or None)
            self._running = False
        if self._between_runs is not None:
            self._between_runs.wake()

    # -- between runs ---------------------------------------------------------------------------------
    def idle_source(self) -> tuple[str | None, list | None] | None:
        """(spec, devices) to read the devices with now, or None while a run reads them."""
        with self._lock:
            return None if self._running else self._idle_source

    def idle_update(self, source: tuple, devices: list[DeviceInfo], provenance: dict, latest: dict) -> None:
        """Readings taken between runs with ``source``; dropped if a run began meanwhile."""
        with self._lock:
            if self._running or source != self._idle_source or self.exporter is None:
                return
            if not self._idle_declared:
                self.exporter.set_devices(devices, provenance)
                self._idle_declared = True
            self.exporter.update({key: {m: v for m, v in values.items() if m not in PER_RUN_METRICS}
                                  for key, values in latest.items()})

    def _stop_between_runs(self) -> None:
        between, self._between_runs = self._between_runs, None
        if between is not None:
            between.stop()

    def close(self) -> None:
        self._stop_between_runs()
        if self.exporter is not None:
            self.exporter.close()


class _BetweenRuns:
    """The thread that reads the devices while no run does; it alone opens, reads and closes
    its sources (a hung NVML call holds this thread only)."""

    def __init__(self, host: ExporterHost) -> None:
        self._host = host
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpuprof-exporter-idle", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(2.0)  # not longer: a thread stuck in NVML is left, as a run's lane is

    def _loop(self) -> None:
        opened = None  # (source, sources, devices, provenance)
        while not self._stop.is_set():
            wanted = self._host.idle_source()
            if opened is not None and opened[0] != wanted:
                close_all(opened[1])
                opened = None
            pause = IDLE_PERIOD_S
            try:
                if wanted is not None and opened is None:
                    opened = (wanted, *_open_for_readings(*wanted, self._host.kernel_pid))
                if opened is not None:
                    latest: dict = {}
                    for source in opened[1]:
                        for key, values in source.read().items():
                            latest.setdefault(key, {}).update(values)
                    self._host.idle_update(opened[0], opened[2], opened[3], latest)
            except Exception:  # noqa: BLE001 - no readings between runs is not worth more; tried again later
                if opened is not None:
                    close_all(opened[1])
                opened, pause = None, IDLE_RETRY_S
            self._wake.wait(pause)
            self._wake.clear()
        if opened is not None:
            close_all(opened[1])


def _open_for_readings(spec: str | None, devices: list | None, kernel_pid: int):
    """The polled sources a run with ``spec`` would read its devices with (NVML and the host;
    a simulated or Prometheus source only gives the host: it has no current reading of its
    own), their devices and provenance."""
    from gpuprof_jupyter.core.sources.base import is_batched
    from gpuprof_jupyter.core.sources.select import open_sources

    if spec is not None and spec not in ("nvml", "host"):
        spec, devices = "host", None
    found = open_sources(spec, devices, host_pid=kernel_pid, host_exclude={os.getpid()})
    sources = [s for s in found.sources if not is_batched(s)]
    return sources, found.devices, merged_provenance(sources)


def _durations(steps) -> list[float]:
    """The measured durations of steps as the kernel sends them (``finish.STEP_FIELDS``)."""
    return [s[1] for s in steps if as_number(s[1]) is not None]


def _latencies(requests) -> list[float]:
    """The measured latencies of requests as the kernel sends them (``finish.REQUEST_FIELDS``)."""
    return [r[1] for r in requests if as_number(r[1]) is not None and r[1] >= 0]
