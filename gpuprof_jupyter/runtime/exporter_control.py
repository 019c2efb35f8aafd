"""``%gpuprofile serve``: where the magic asks for the Prometheus exporter to listen.

The exporter belongs in the sampler process (docs/architecture.md), so scrapes are answered
while the kernel is busy and it stops with the kernel. Until the link carries a ``serve``
message, this module runs it in the current process: same messages, same errors, so the
magic and its tests do not change when the call moves behind the link.
"""

from __future__ import annotations

import threading

from ..config import DEFAULT_EXPORTER_ADDR, DEFAULT_EXPORTER_PORT, load_config
from ..sampler_process.exporter import Exporter, ExporterBindError, wide_listen_warning

_lock = threading.Lock()
_exporter: Exporter | None = None


def listen_settings(port: int | None = None, addr: str | None = None) -> tuple[int, str]:
    """Port and address to listen on: the argument, else GPUPROF_EXPORTER_* or the config
    file's ``[exporter]``, else 9464 on 127.0.0.1. ConfigError if the config is malformed."""
    configured = load_config().exporter
    return (port if port is not None else configured.get("port", DEFAULT_EXPORTER_PORT),
            addr if addr is not None else configured.get("addr", DEFAULT_EXPORTER_ADDR))


def serve(port: int, addr: str) -> str:
    """Serve ``/metrics`` on ``addr:port`` (port 0: a free one) and return what to print:
    the URL, and a warning when it listens beyond loopback. Serving again elsewhere moves
    the endpoint. Raises ExporterBindError naming the port when it is taken."""
    global _exporter
    with _lock:
        if _exporter is None:
            _exporter = Exporter()
        elif _exporter.url is not None:
            if _exporter.addr == addr and port in (0, _exporter.port):
                return f"Prometheus metrics already served on {_exporter.url}"
            _exporter.close()
        bound = _exporter.start(addr=addr, port=port)
        lines = [f"Prometheus metrics on {_exporter.url}"
                 + (f" (port 0 asked: port {bound} chosen)" if port == 0 else "")]
        warning = wide_listen_warning(addr, bound)
        if warning:
            lines.append(warning)
        return "\n".join(lines)


def stop() -> str:
    """Stop serving and free the port; what to print."""
    with _lock:
        if _exporter is None or _exporter.url is None:
            return "the Prometheus exporter is not running"
        url = _exporter.url
        _exporter.close()
        return f"stopped serving Prometheus metrics on {url}"


def current_exporter() -> Exporter | None:
    """The in-process exporter (None before the first ``serve``): what feeds it until the
    sampler process hosts it."""
    return _exporter


__all__ = ["ExporterBindError", "current_exporter", "listen_settings", "serve", "stop"]
