"""The PCIe slow lane: ``nvmlDeviceGetPcieThroughput`` on a daemon thread of its own.

Runs in the sampler process.

Each call blocks ~20 ms (NVML samples the counter over a window), so it never runs in the
sampling lane. The lane reads TX and RX of each device that needs it (no GPM PCIe metrics)
once per ``interval_s`` (native interval: 1 s by default) and caches them; the source's
``read()`` only merges cached values no older than ``max_age_s``, so a stalled lane shows as
missing PCIe values, never as old ones repeated. A pass that starts more than two intervals
after the previous one is recorded as a gap of source ``nvml.pcie`` (:meth:`take_gaps`).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterable

import pynvml

from gpuprof_jupyter.core.sources.nvml import query as q
from gpuprof_jupyter.core.protocol import Gap, is_gap
from gpuprof_jupyter.core.sources.nvml.device import NvmlDevice

THREAD_NAME = "gpuprof-nvml-slow-lane"
GAP_SOURCE = "nvml.pcie"
_KIB = 1024.0
_TX = pynvml.NVML_PCIE_UTIL_TX_BYTES
_RX = pynvml.NVML_PCIE_UTIL_RX_BYTES


class PcieSlowLane:
    """Reads PCIe throughput of the devices with ``pcie_slow`` set, off the sampling lane.

    Args:
        interval_s: seconds between two passes (the lane's native interval).
        clock: monotonic clock (seconds) that stamps cached values.
        unsupported: called with ``(device, failure)`` when a device's PCIe call fails for
            good (the source drops the metrics with a note); the lane stops reading it.
    """

    def __init__(
        self,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        unsupported: Callable[[NvmlDevice, q.NvmlFailure], None] = lambda dev, failure: None,
    ) -> None:
        self.interval_s = float(interval_s)
        self.max_age_s = max(5.0 * self.interval_s, self.interval_s + 2.0)
        self._clock = clock
        self._unsupported = unsupported
        self._devices: tuple[NvmlDevice, ...] = ()
        self._cache: dict[str, tuple[float, float, float]] = {}  # key -> (tx B/s, rx B/s, time)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._passes_cond = threading.Condition()
        self.passes = 0
        self._last_pass: float | None = None  # start of the previous pass (clock)
        self._gaps: list[Gap] = []

    def start_if_needed(self, devices: Iterable[NvmlDevice]) -> None:
        """Start the thread once some device needs it (never after :meth:`close`)."""
        self._devices = tuple(devices)
        if self._thread is not None or self._stop.is_set():
            return
        if not any(d.pcie_slow for d in self._devices):
            return
        self._thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def cached(self, key: str, now: float) -> tuple[float, float] | None:
        """(tx, rx) B/s of device ``key`` if read within ``max_age_s`` of ``now``."""
        value = self._cache.get(key)
        if value is None or now - value[2] > self.max_age_s:
            return None
        return value[0], value[1]

    def forget(self, key: str) -> None:
        self._cache.pop(key, None)

    def take_gaps(self) -> list[Gap]:
        """The lane's gaps recorded since the last call (oldest first)."""
        with self._passes_cond:
            gaps, self._gaps = self._gaps, []
        return gaps

    def wait(self, passes: int = 1, timeout: float = 5.0) -> bool:
        """Block until the lane has made ``passes`` passes in all (tests, benchmarks)."""
        with self._passes_cond:
            return self._passes_cond.wait_for(lambda: self.passes >= passes, timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (joined). The lane cannot start again."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._pass()
            self._stop.wait(self.interval_s)

    def _pass(self) -> None:
        start = self._clock()
        if self._last_pass is not None and is_gap(self._last_pass, start, self.interval_s):
            with self._passes_cond:
                self._gaps.append(Gap(self._last_pass, start, GAP_SOURCE))
        self._last_pass = start
        for dev in self._devices:
            if not dev.pcie_slow or dev.lost or self._stop.is_set():
                continue
            try:
                tx = q.query(pynvml.nvmlDeviceGetPcieThroughput, dev.handle, _TX)
                rx = q.query(pynvml.nvmlDeviceGetPcieThroughput, dev.handle, _RX)
            except q.NvmlFailure as failure:
                if failure.kind in q.PERMANENT:
                    dev.pcie_slow = False
                    self._unsupported(dev, failure)
                continue  # lost / transient: the source's read() deals with the device
            self._cache[dev.key] = (tx * _KIB, rx * _KIB, self._clock())
        with self._passes_cond:
            self.passes += 1
            self._passes_cond.notify_all()
