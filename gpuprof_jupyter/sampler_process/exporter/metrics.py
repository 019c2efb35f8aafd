"""The exporter's series: the latest device values and recent experiments, bounded in number.

Runs in the sampler process.

Names, labels and units are the metric contract's with the ``gpuprof_`` prefix
(docs/prometheus.md). The endpoint (``endpoint.py``) registers these collectors in its own
registry and answers scrapes with them.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from gpuprof_jupyter.core.metrics import METRICS, PROMETHEUS_PREFIX
from gpuprof_jupyter.core.sources.base import DeviceInfo

KEEP_FINISHED = 5  # finished experiments kept as label sets beside the running one
STALE_AFTER_S = 15.0  # device values older than this are not exported (the sampler stopped)
# Step durations span milliseconds (a small model) to minutes (a large batch on a big model).
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                math.inf)

# Serving requests (runtime/hooks/requests.py) span a millisecond (a small model on a GPU) to
# tens of seconds (a long generate()).
REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, math.inf)

UNIT_WORDS = {
    "%": "percent (0-100)",
    "W": "watts",
    "J": "joules",
    "B": "bytes",
    "B/s": "bytes per second",
    "degC": "degrees Celsius",
    "MHz": "megahertz",
    "bitmask": "bitmask of NVML clock event reasons",
}

DEVICE_LABELS = ("node", "device", "simulated")


def _help(metric: str) -> str:
    spec = METRICS[metric]
    return f"{spec.label}, in {UNIT_WORDS.get(spec.unit, spec.unit)} (metric contract: {metric})"


def _simulated(device: DeviceInfo | None) -> str:
    return "true" if device is not None and device.simulated else "false"


class DeviceValues:
    """The latest device values as gauges, built at scrape time from one snapshot.

    A custom collector rather than labelled ``Gauge`` objects, so that a device or metric that
    stops being measured, or values the sampler stopped refreshing, simply disappear from
    ``/metrics`` (absent means "not measured" in PromQL) instead of lingering."""

    def __init__(self, node: str, clock: Callable[[], float], stale_after_s: float) -> None:
        self._node, self._clock, self._stale_after_s = node, clock, stale_after_s
        self._lock = threading.Lock()
        self._devices: dict[str, DeviceInfo] = {}
        self._provenance: dict[str, dict[str, str]] = {}
        self._latest: dict[str, dict[str, float]] = {}
        self._updated: float | None = None

    def set_devices(self, devices: Iterable[DeviceInfo], provenance: Mapping[str, Mapping[str, str]]) -> None:
        with self._lock:
            self._devices = {d.key: d for d in devices}
            self._provenance = {k: dict(v) for k, v in provenance.items()}
            self._latest = {k: v for k, v in self._latest.items() if k in self._devices}

    def update(self, latest: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
        """Keep the measured values (finite, named in the metric contract: others are not
        exported) and return them."""
        unknown = sorted(set(latest) - set(self._devices))
        if unknown:
            raise ValueError(f"exporter: device(s) {', '.join(unknown)} not declared with set_devices "
                             f"(declared: {', '.join(sorted(self._devices)) or 'none'})")
        values = {key: {m: float(v) for m, v in metrics.items() if m in METRICS and v is not None and math.isfinite(v)}
                  for key, metrics in latest.items()}
        with self._lock:
            self._latest, self._updated = values, self._clock()
        return values

    def simulated_label(self, key: str) -> str:
        """``"true"`` for a simulated device: simulated data is labelled wherever it goes."""
        return _simulated(self._devices.get(key))

    def collect(self):
        with self._lock:
            fresh = self._updated is not None and self._clock() - self._updated <= self._stale_after_s
            latest = self._latest if fresh else {}
            devices, provenance = dict(self._devices), dict(self._provenance)
        info = GaugeMetricFamily(f"{PROMETHEUS_PREFIX}device_info",
                                 "Devices this exporter reads (value 1); simulated=\"true\" marks simulated devices",
                                 labels=["node", "device", "kind", "name", "uuid", "simulated"])
        for key, device in devices.items():
            info.add_metric([self._node, key, device.kind, device.name, device.uuid or "", _simulated(device)], 1)
        yield info
        origin = GaugeMetricFamily(f"{PROMETHEUS_PREFIX}metric_provenance_info",
                                   "Which API produced each device metric (value 1); see docs/metrics.md",
                                   labels=["node", "device", "metric", "provenance"])
        for key, tags in provenance.items():
            for metric, tag in sorted(tags.items()):
                origin.add_metric([self._node, key, metric, tag], 1)
        yield origin
        for metric in METRICS:
            family = GaugeMetricFamily(PROMETHEUS_PREFIX + metric, _help(metric), labels=list(DEVICE_LABELS))
            for key, values in latest.items():
                if metric in values:
                    family.add_metric([self._node, key, _simulated(devices.get(key))], values[metric])
            if family.samples:
                yield family


class ExperimentSeries:
    """Series per experiment, for the running one and the last ``keep`` finished ones.

    Older label sets are removed from the registry, so the number of series stays bounded
    however many experiments a kernel runs (docs/prometheus.md). Not thread-safe on its own:
    the Exporter calls it under its lock."""

    def __init__(self, registry: CollectorRegistry, node: str, keep: int, buckets: Iterable[float],
                 clock: Callable[[], float], simulated_label: Callable[[str], str]) -> None:
        by_experiment = ["node", "experiment"]
        self._steps = Histogram(
            f"{PROMETHEUS_PREFIX}duration_seconds",
            "Duration of each step (training iteration) of the experiment, in seconds",
            by_experiment, buckets=tuple(buckets), registry=registry)
        self._requests = Histogram(
            f"{PROMETHEUS_PREFIX}request_duration_seconds",
            "Latency of each serving request of the experiment (a model called with gradients off, "
            "generate(), a pipeline, gpuprof_jupyter.request()): until its GPU work was done where CUDA "
            "events timed it, else its wall time; in seconds",
            by_experiment, buckets=REQUEST_BUCKETS, registry=registry)
        self._cpu = Counter(
            f"{PROMETHEUS_PREFIX}cpu_seconds",
            "CPU time of the kernel's process tree (DataLoader workers included) during the experiment, in seconds",
            by_experiment, registry=registry)
        self._gpu_mem = Gauge(
            f"{PROMETHEUS_PREFIX}gpu_memory_used_bytes",
            "Peak GPU memory used on the device during the experiment (NVML memory info, "
            "PyTorch's cache included), in bytes",
            ["node", "experiment", "device", "simulated"], registry=registry)
        self._elapsed = Gauge(
            f"{PROMETHEUS_PREFIX}experiment_elapsed_seconds",
            "Wall time of the experiment: so far while it runs, in all once finished; in seconds",
            by_experiment, registry=registry)
        self._running = Gauge(
            f"{PROMETHEUS_PREFIX}experiment_running",
            "1 for the experiment running now, 0 for the finished ones still listed",
            by_experiment, registry=registry)
        self._node, self._keep, self._clock, self._simulated_label = node, keep, clock, simulated_label
        self.running: str | None = None
        self._started = 0.0
        self.finished: deque[str] = deque()
        self._peaks: dict[str, dict[str, float]] = {}  # experiment -> device -> peak bytes

    def begin(self, name: str) -> None:
        if name == self.running:
            return
        if self.running is not None:
            self._retire(self.running)
        if name in self.finished:  # a name used again starts afresh
            self._drop(name)
        self.running, self._started = name, self._clock()
        self._peaks[name] = {}
        self._running.labels(self._node, name).set(1)
        self._steps.labels(self._node, name)  # listed at once, with no steps yet
        self._cpu.labels(self._node, name)
        self._elapsed.labels(self._node, name).set(0)

    def end_running(self) -> None:
        """The running experiment ended without ``finish`` (the kernel finalised it itself)."""
        if self.running is not None:
            self._retire(self.running)

    def track(self, gpu_mem_used: Mapping[str, float]) -> None:
        name = self.running
        if name is None:
            return
        self._elapsed.labels(self._node, name).set(self._clock() - self._started)
        peaks = self._peaks[name]
        for device, used in gpu_mem_used.items():
            if used > peaks.get(device, -1.0):
                peaks[device] = used
                self._gpu_mem.labels(self._node, name, device, self._simulated_label(device)).set(used)

    def observe_steps(self, name: str, durations: list[float]) -> None:
        self._require_running(name)
        steps = self._steps.labels(self._node, name)
        for duration in durations:
            steps.observe(duration)

    def observe_requests(self, name: str, latencies: list[float]) -> None:
        """Listed from the first request on: a training run has no request series."""
        self._require_running(name)
        requests = self._requests.labels(self._node, name)
        for latency in latencies:
            requests.observe(latency)

    def add_cpu_seconds(self, name: str, seconds: float) -> None:
        self._require_running(name)
        self._cpu.labels(self._node, name).inc(seconds)

    def finish(self, name: str, duration_s: float, steps: list[float] | None, cpu_seconds: float | None,
               gpu_mem_used: Mapping[str, float] | None, requests: list[float] | None = None) -> None:
        """Final values replace what was fed while it ran (they are the complete record)."""
        if name == self.running:
            self.running = None
        else:
            if name in self.finished:
                self._drop(name)
            self._peaks[name] = {}
        self._running.labels(self._node, name).set(0)
        self._elapsed.labels(self._node, name).set(duration_s)
        if steps is not None:
            self._steps.remove(self._node, name)
        histogram = self._steps.labels(self._node, name)
        for duration in steps or ():
            histogram.observe(duration)
        if requests is not None:
            self._requests.remove(self._node, name)
            if requests:
                latencies = self._requests.labels(self._node, name)
                for latency in requests:
                    latencies.observe(latency)
        if cpu_seconds is not None:
            self._cpu.remove(self._node, name)
            self._cpu.labels(self._node, name).inc(cpu_seconds)
        if gpu_mem_used is not None:
            self._remove_peaks(name)
            self._peaks[name] = {}
            for device, used in gpu_mem_used.items():
                self._peaks[name][device] = used
                self._gpu_mem.labels(self._node, name, device, self._simulated_label(device)).set(used)
        self._listed(name)

    def _require_running(self, name: str) -> None:
        if name != self.running:
            raise ValueError(f"exporter: experiment {name!r} is not the running one ({self.running!r})")

    def _retire(self, name: str) -> None:
        self.running = None
        self._running.labels(self._node, name).set(0)
        self._listed(name)

    def _listed(self, name: str) -> None:
        if name in self.finished:
            self.finished.remove(name)
        self.finished.append(name)
        while len(self.finished) > self._keep:
            self._drop(self.finished.popleft())

    def _remove_peaks(self, name: str) -> None:
        for device in self._peaks.pop(name, {}):
            self._gpu_mem.remove(self._node, name, device, self._simulated_label(device))

    def _drop(self, name: str) -> None:
        if name in self.finished:
            self.finished.remove(name)
        for metric in (self._steps, self._requests, self._cpu, self._elapsed, self._running):
            metric.remove(self._node, name)
        self._remove_peaks(name)



__all__ = ["DEVICE_LABELS", "KEEP_FINISHED", "REQUEST_BUCKETS", "STALE_AFTER_S", "STEP_BUCKETS", "UNIT_WORDS",
           "DeviceValues", "ExperimentSeries"]
