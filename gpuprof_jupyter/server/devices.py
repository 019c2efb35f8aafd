"""The server's own device poller: one per server, ~1 Hz, shared by every browser tab.

Runs in the Jupyter server.

It reads the GPUs through the very source the sampler uses (``sources.nvml.NvmlSource``) on a
background thread, so handlers only copy the latest snapshot and never block the event loop
on NVML. Where NVML cannot run, the snapshot says so (``state: "no_gpu"`` with a reason and a
message) instead of failing. The poller starts on the first request and stops by itself
after ``idle_stop_s`` without one, so a server nobody looks at holds no NVML handle.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from gpuprof_jupyter.core.format import as_float

# What the status bar and the sparklines show (metric names and units: docs/metrics.md).
LIVE_METRICS = ("sm_util", "gpu_busy", "mem_bw_util", "gpu_mem_used_bytes", "gpu_mem_total_bytes", "power_w",
                "gpu_temp_c")
THREAD_NAME = "gpuprof-server-devices"


class DevicePoller:
    """Reads every visible GPU each ``interval_s`` seconds; ``snapshot()`` is what ``devices`` answers.

    Args:
        interval_s: seconds between reads.
        history_s: seconds of history kept per device (sparklines).
        idle_stop_s: stop after this long without ``snapshot()`` (0: never).
        source_factory: builds the source (default ``NvmlSource``); tests pass their own.
        enabled: False answers the no-GPU state (reason ``disabled``) and never opens NVML.
    """

    def __init__(self, interval_s: float = 1.0, history_s: float = 120.0, idle_stop_s: float = 60.0,
                 source_factory=None, enabled: bool = True, clock=time.monotonic) -> None:
        self.interval_s = float(interval_s)
        self.idle_stop_s = float(idle_stop_s)
        self._history_len = max(1, int(round(history_s / self.interval_s)) if history_s else 1)
        self._factory = source_factory
        self._enabled = enabled
        self._clock = clock
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._last_asked = clock()
        self._state = "starting" if enabled else "no_gpu"
        self._reason = None if enabled else "disabled"
        self._message = "" if enabled else "device polling is turned off (GPUProfiler.devices_enabled = False)"
        self._devices: list[dict] = []
        self._history: dict[str, deque] = {}
        self._latest: dict[str, dict] = {}
        self._notes: list[str] = []
        self._updated: float | None = None

    # ------------------------------------------------------------------ lifecycle
    def _ensure_running(self) -> None:
        if not self._enabled:
            return
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, args=(self._stop,), name=THREAD_NAME, daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (joined) and let NVML go. Idempotent; the next snapshot starts it again."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _open(self):
        from gpuprof_jupyter.core.sources.base import SourceUnavailable

        factory = self._factory
        if factory is None:
            from gpuprof_jupyter.core.sources.nvml import NvmlSource

            factory = NvmlSource
        source = factory()
        try:
            infos = source.open()
        except SourceUnavailable as exc:
            self._set_state("no_gpu", "nvml_unavailable", str(exc))
            return None
        except Exception as exc:  # noqa: BLE001 - a broken driver must not break the server
            self._set_state("no_gpu", "nvml_error", f"NVML failed to open: {exc}")
            return None
        gpus = [d for d in infos if d.kind == "gpu"]
        with self._lock:
            self._devices = [{"key": d.key, "name": d.name, "index": d.index, "uuid": d.uuid,
                              "power_limit_w": as_float(d.power_limit_w),
                              "memory_total_bytes": as_float(d.memory_total_bytes),
                              "mig_parent_uuid": d.mig_parent_uuid} for d in gpus]
            self._history = {d.key: deque(maxlen=self._history_len) for d in gpus}
            self._latest = {}
        return source

    def _set_state(self, state: str, reason: str | None, message: str) -> None:
        with self._lock:
            self._state, self._reason, self._message = state, reason, message

    def _run(self, stop: threading.Event) -> None:
        source = self._open()
        if source is None:  # no GPU: said once; the next request after idle_stop_s tries again
            self._wait_idle(stop)
            return
        try:
            provenance = source.provenance()
            next_tick = self._clock()
            while not stop.is_set():
                self._read_once(source, provenance)
                if self._state != "ok":  # "starting" until the first read is in: no device without readings
                    self._set_state("ok", None, "")
                if self.idle_stop_s and self._clock() - self._last_asked > self.idle_stop_s:
                    break
                next_tick += self.interval_s
                stop.wait(max(0.0, next_tick - self._clock()))
        finally:
            source.close()
            with self._lock:
                if self._state == "ok":
                    self._state, self._reason, self._message = "starting", None, ""

    def _wait_idle(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if self.idle_stop_s and self._clock() - self._last_asked > self.idle_stop_s:
                return
            stop.wait(self.interval_s)

    def _read_once(self, source, provenance: dict) -> None:
        try:
            reading = source.read()
        except Exception as exc:  # noqa: BLE001 - one bad read is a note, not a dead poller
            with self._lock:
                self._notes = [f"last read failed: {exc}"]
            return
        now = time.time()
        try:
            provenance = source.provenance()
            notes = source.notes()
        except Exception:  # noqa: BLE001
            notes = []
        with self._lock:
            for key, history in self._history.items():
                values = reading.get(key, {})
                latest = {m: as_float(values.get(m)) for m in LIVE_METRICS}
                latest["t"] = now
                self._latest[key] = {**latest, "provenance": {m: provenance.get(key, {}).get(m)
                                                               for m in LIVE_METRICS if m in provenance.get(key, {})}}
                history.append(latest)
            self._notes = notes
            self._updated = now

    # ------------------------------------------------------------------ what handlers read
    def snapshot(self, history: bool = True) -> dict:
        """The ``devices`` payload (JSON-ready); starts the poller when it is not running.

        ``state``: ``ok`` (devices read), ``starting`` (first read not in yet) or ``no_gpu``
        (``reason``: ``nvml_unavailable``, ``nvml_error``, ``disabled``; ``message`` says why).
        Per device: ``latest`` (metric -> value, None when not measured, ``provenance``) and
        with ``history`` the last ``history_s`` seconds as columns ``t`` (UNIX s) and per metric.
        """
        self._last_asked = self._clock()
        self._ensure_running()
        with self._lock:
            devices = []
            for info in self._devices:
                entry = dict(info)
                entry["latest"] = self._latest.get(info["key"])
                if history:
                    rows = list(self._history.get(info["key"], ()))
                    entry["history"] = {name: [r[name] for r in rows] for name in ("t", *LIVE_METRICS)}
                devices.append(entry)
            return {"state": self._state, "reason": self._reason, "message": self._message,
                    "interval_s": self.interval_s, "updated": self._updated,
                    "devices": devices if self._state == "ok" else [], "notes": list(self._notes)}
