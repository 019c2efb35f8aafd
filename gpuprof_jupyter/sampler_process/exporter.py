"""The Prometheus exporter: current device values and recent experiments on ``/metrics``.

Runs in the sampler process.

It runs in the sampler process (docs/architecture.md), so a scrape is answered while the
kernel is busy. Metric names, labels, units and the cardinality bound are listed in
docs/prometheus.md; the names are the metric contract's with the ``gpuprof_`` prefix, in the
contract's units, so ``gpuprof_sm_util`` means what ``sm_util`` means in a notebook.

Everything lives in the exporter's own ``CollectorRegistry`` (never the process-global one),
so two exporters in one process, or a test, never see each other's series. No IPython here:
the Prometheus source's end-to-end test runs exporters as plain processes.

With a ``token``, every request must carry ``Authorization: Bearer TOKEN`` (else 401), the
form Prometheus sends from a scrape config's ``authorization: {credentials_file: ...}``. The
HTTP server is bounded (``exporter_server.py``): a timeout per connection, a cap on waiting
connections and on threads, the token checked before anything past the headers is read.
"""

from __future__ import annotations

import errno
import hmac
import ipaddress
import math
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily

from gpuprof_jupyter.core.config import DEFAULT_EXPORTER_ADDR, DEFAULT_EXPORTER_PORT
from gpuprof_jupyter.core.metrics import METRICS, PROMETHEUS_PREFIX
from gpuprof_jupyter.core.protocol import ExporterBindError  # raised here, re-raised as itself in the kernel
from gpuprof_jupyter.core.sources.base import DeviceInfo
from gpuprof_jupyter.sampler_process.exporter_server import BoundedWSGIServer

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


def is_loopback(addr: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, "localhost")."""
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def wide_listen_warning(addr: str, port: int, token: bool = False) -> str | None:
    """The warning to show when the exporter listens beyond loopback, else None."""
    if is_loopback(addr):
        return None
    who = ("anyone who can reach this host and holds the token reads its metrics (device names and UUIDs, "
           "experiment names), sent in clear text (no TLS)" if token else
           "anyone who can reach this host reads its metrics (device names and UUIDs, experiment names) "
           "without authentication")
    return (f"warning: the exporter listens on {addr}:{port}, beyond this machine's loopback: {who}. "
            f"Use --addr 127.0.0.1 unless a firewall or a network policy limits who reaches this port.")


def scrape_config(target: str, token_file: str | None, job: str = "gpuprof") -> str:
    """The ``scrape_configs`` entry (YAML) a Prometheus uses to scrape ``target`` (HOST:PORT),
    with the bearer token read from ``token_file`` when there is one."""
    lines = ["scrape_configs:", f"  - job_name: {job}", "    static_configs:", f'      - targets: ["{target}"]']
    if token_file is not None:
        lines += ["    authorization:", f'      credentials_file: "{token_file}"']
    return "\n".join(lines)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args) -> None:
        pass  # a scrape every few seconds is not news


class _Auth:
    """The token one endpoint asks for (None: none); changed in place for that endpoint only."""

    def __init__(self, token: str | None) -> None:
        self.token = token


def _guarded(app, auth: _Auth):
    """``app`` answering only requests that carry ``Authorization: Bearer TOKEN`` while
    ``auth.token`` is set (compared in constant time), 401 otherwise."""
    def guarded(environ, start_response):
        token = auth.token
        if token is not None:
            sent = environ.get("HTTP_AUTHORIZATION", "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(sent, f"Bearer {token}".encode()):
                start_response("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"),
                                                     ("WWW-Authenticate", 'Bearer realm="gpuprof"')])
                return [b"401: this exporter needs its bearer token (see docs/prometheus.md)\n"]
        return app(environ, start_response)

    return guarded


def _help(metric: str) -> str:
    spec = METRICS[metric]
    return f"{spec.label}, in {UNIT_WORDS.get(spec.unit, spec.unit)} (metric contract: {metric})"


def _simulated(device: DeviceInfo | None) -> str:
    return "true" if device is not None and device.simulated else "false"


class _DeviceValues:
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


class _Experiments:
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


def _checked_durations(durations: Iterable[float], what: str) -> list[float]:
    values = [float(d) for d in durations]
    bad = [d for d in values if not (math.isfinite(d) and d >= 0)]
    if bad:
        raise ValueError(f"exporter: {what} must be finite seconds >= 0, got {bad[:3]}")
    return values


def _checked_name(name: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"exporter: an experiment name must be a non-empty string, got {name!r}")
    return name


class Exporter:
    """One ``/metrics`` endpoint: the latest device values and recent experiments.

    The sampler process declares its devices (``set_devices``), passes the latest values at
    the UI rate (``update``), steps and CPU time while a run goes (optional), and the final
    record when it ends (``experiment_finished``). ``start`` listens; ``close`` frees the port.
    All methods are thread-safe; scrapes are answered on the server's own threads.
    """

    def __init__(self, *, node: str | None = None, keep_finished: int = KEEP_FINISHED,
                 step_buckets: Iterable[float] = STEP_BUCKETS, stale_after_s: float = STALE_AFTER_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if keep_finished < 0:
            raise ValueError(f"keep_finished must be >= 0, got {keep_finished}")
        self.node = node or socket.gethostname()
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._devices = _DeviceValues(self.node, clock, stale_after_s)
        self.registry.register(self._devices)
        self._experiments = _Experiments(self.registry, self.node, keep_finished, step_buckets, clock,
                                         self._devices.simulated_label)
        self._server = None
        self._thread: threading.Thread | None = None
        self.addr: str | None = None
        self.port: int | None = None
        self._auth = _Auth(None)
        self.notes: list[str] = []  # the HTTP server's own failures (exporter_server), for the running experiment

    # -- data ---------------------------------------------------------------------------------
    def set_devices(self, devices: Iterable[DeviceInfo],
                    provenance: Mapping[str, Mapping[str, str]] | None = None) -> None:
        """The devices the values will come from, and which API makes each metric."""
        self._devices.set_devices(devices, provenance or {})

    def update(self, latest: Mapping[str, Mapping[str, float]], experiment: str | None = None) -> None:
        """Latest values (device key -> metric -> value in the contract's unit; NaN or absent:
        not measured, so not exported) and the experiment running now (None: none)."""
        if experiment is not None:
            _checked_name(experiment)
        measured = self._devices.update(latest)
        gpu_mem = {key: values["gpu_mem_used_bytes"] for key, values in measured.items()
                   if "gpu_mem_used_bytes" in values}
        with self._lock:
            if experiment is None:
                self._experiments.end_running()
            else:
                self._experiments.begin(experiment)
                self._experiments.track(gpu_mem)

    def observe_steps(self, experiment: str, durations: Iterable[float]) -> None:
        """Step durations (s) of the running experiment, as they happen."""
        values = _checked_durations(durations, "step durations")
        with self._lock:
            self._experiments.observe_steps(experiment, values)

    def observe_requests(self, experiment: str, latencies: Iterable[float]) -> None:
        """Serving requests' latencies (s) of the running experiment, as they complete."""
        values = _checked_durations(latencies, "request latencies")
        with self._lock:
            self._experiments.observe_requests(experiment, values)

    def add_cpu_seconds(self, experiment: str, seconds: float) -> None:
        """CPU seconds the kernel's process tree used since the last call, for the running run."""
        (value,) = _checked_durations([seconds], "CPU seconds")
        with self._lock:
            self._experiments.add_cpu_seconds(experiment, value)

    def experiment_finished(self, name: str, *, duration_s: float, step_durations: Iterable[float] | None = None,
                            cpu_seconds: float | None = None,
                            gpu_mem_used_bytes: Mapping[str, float] | None = None,
                            request_latencies: Iterable[float] | None = None) -> None:
        """An experiment's final record: wall time (s), every step's duration (s), CPU time of
        the kernel's process tree (s), peak GPU memory per device (bytes) and every serving
        request's latency (s). A value given here replaces what was fed while it ran; None keeps it."""
        _checked_name(name)
        (duration,) = _checked_durations([duration_s], "duration_s")
        steps = None if step_durations is None else _checked_durations(step_durations, "step durations")
        requests = None if request_latencies is None else _checked_durations(request_latencies, "request latencies")
        cpu = None if cpu_seconds is None else _checked_durations([cpu_seconds], "CPU seconds")[0]
        gpu_mem = None
        if gpu_mem_used_bytes is not None:
            gpu_mem = dict(zip(gpu_mem_used_bytes, _checked_durations(gpu_mem_used_bytes.values(),
                                                                      "GPU memory bytes")))
        with self._lock:
            self._experiments.finish(name, duration, steps, cpu, gpu_mem, requests)

    def listed_experiments(self) -> list[str]:
        """The experiments that have series now: the finished ones kept, oldest first, then the
        running one."""
        with self._lock:
            running = [self._experiments.running] if self._experiments.running else []
            return list(self._experiments.finished) + running

    # -- serving ------------------------------------------------------------------------------
    @property
    def token(self) -> str | None:
        """While set, a scrape needs ``Authorization: Bearer TOKEN`` (else 401)."""
        return self._auth.token

    @token.setter
    def token(self, token: str | None) -> None:
        self._auth.token = token

    def start(self, addr: str = DEFAULT_EXPORTER_ADDR, port: int = DEFAULT_EXPORTER_PORT,
              token: str | None = None) -> int:
        """Listen on ``addr:port`` and return the port bound (``port=0`` picks a free one);
        with ``token``, a scrape needs it as a bearer token.

        Already listening: the endpoint moves, the new one bound before the old one closes, so
        a new address that cannot be bound leaves the old endpoint serving (the same port on
        another address, which the old endpoint holds, is bound right after it closes, and the
        old one reopened if that fails). Raises ExporterBindError naming the address and port
        when they are taken or not here. Listening beyond loopback is allowed;
        ``wide_listen_warning`` says what it means.
        """
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"exporter port must be an integer in 0..65535, got {port!r}")
        auth = _Auth(token)
        try:
            server = self._bind(addr, port, auth)
        except ExporterBindError as exc:
            if self._server is None or port != self.port or exc.errno != errno.EADDRINUSE:
                raise
            old = (self.addr, self.port, self._auth)
            self.close()
            try:
                server = self._bind(addr, port, auth)
            except ExporterBindError:
                self._listen(self._bind(*old), *old)
                raise
        self.close()
        return self._listen(server, addr, port, auth)

    def _listen(self, server: WSGIServer, addr: str, port: int, auth: _Auth) -> int:
        server.notes = self.notes  # one list whichever server serves
        thread = threading.Thread(target=server.serve_forever, name="gpuprof-exporter", daemon=True)
        thread.start()
        self._server, self._thread, self._auth = server, thread, auth
        self.addr, self.port = addr, server.server_port
        return self.port

    def _bind(self, addr: str, port: int, auth: _Auth) -> WSGIServer:
        class Server(BoundedWSGIServer):
            pass

        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM,
                                                           flags=socket.AI_PASSIVE)[0]
            Server.address_family = family
            app = _guarded(make_wsgi_app(self.registry), auth)
            return make_server(sockaddr[0], port, app, Server, handler_class=_QuietHandler)
        except socket.gaierror as exc:
            raise ExporterBindError(errno.EADDRNOTAVAIL, f"cannot listen on {addr}:{port}: {exc.strerror or exc}") from None
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ExporterBindError(exc.errno, f"port {port} on {addr} is already in use: choose another "
                                                   f"port, or port 0 for a free one") from None
            raise ExporterBindError(exc.errno, f"cannot listen on {addr}:{port}: {exc.strerror or exc}") from None

    @property
    def url(self) -> str | None:
        """``http://ADDR:PORT/metrics`` while listening, else None."""
        if self.port is None:
            return None
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    @property
    def target(self) -> str | None:
        """``HOST:PORT`` for a scrape config while listening (this host's name when it listens
        on every interface), else None."""
        if self.port is None:
            return None
        host = socket.gethostname() if self.addr in ("0.0.0.0", "::", "") else self.addr
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def close(self) -> None:
        """Stop listening and free the port (the series are kept; ``start`` may be called again)."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        self.addr = self.port = None
        if server is not None:
            server.shutdown()
            server.server_close()
            thread.join()

    def __enter__(self) -> "Exporter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
