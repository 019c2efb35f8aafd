"""The Prometheus exporter: current device values and recent experiments on ``/metrics``.

Runs in the sampler process.

It runs in the sampler process (docs/architecture.md), so a scrape is answered while the
kernel is busy. Metric names, labels, units and the cardinality bound are listed in
docs/prometheus.md; the names are the metric contract's with the ``gpuprof_`` prefix, in the
contract's units, so ``gpuprof_sm_util`` means what ``sm_util`` means in a notebook.

Everything lives in the exporter's own ``CollectorRegistry`` (never the process-global one),
so two exporters in one process, or a test, never see each other's series. No IPython here:
the Prometheus source's end-to-end test runs exporters as plain processes. The series are
built in ``metrics.py``.

With a ``token``, every request must carry ``Authorization: Bearer TOKEN`` (else 401), the
form Prometheus sends from a scrape config's ``authorization: {credentials_file: ...}``. The
HTTP server is bounded (``server.py``): a timeout per connection, a cap on waiting
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
from collections.abc import Callable, Iterable, Mapping
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from gpuprof_jupyter.core.config import DEFAULT_EXPORTER_ADDR, DEFAULT_EXPORTER_PORT
from gpuprof_jupyter.core.protocol import ExporterBindError  # raised here, re-raised as itself in the kernel
from gpuprof_jupyter.core.sources.base import DeviceInfo
from gpuprof_jupyter.sampler_process.exporter.server import BoundedWSGIServer
from gpuprof_jupyter.sampler_process.exporter.metrics import (
    KEEP_FINISHED, STALE_AFTER_S, STEP_BUCKETS, DeviceValues, ExperimentSeries)


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
        self._devices = DeviceValues(self.node, clock, stale_after_s)
        self.registry.register(self._devices)
        self._experiments = ExperimentSeries(self.registry, self.node, keep_finished, step_buckets, clock,
                                         self._devices.simulated_label)
        self._server = None
        self._thread: threading.Thread | None = None
        self.addr: str | None = None
        self.port: int | None = None
        self._auth = _Auth(None)
        self.notes: list[str] = []  # the HTTP server's own failures (server.py), for the running experiment

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
