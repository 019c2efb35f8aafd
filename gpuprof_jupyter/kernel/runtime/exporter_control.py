"""``%gpuprofile serve``: ask the sampler process to serve Prometheus metrics.

Runs in the kernel (or the profiled script).

The exporter lives in the sampler process (docs/architecture.md), so scrapes are answered
while the kernel is busy and the endpoint stops with the kernel.
"""

from __future__ import annotations

from gpuprof_jupyter.core.config import DEFAULT_EXPORTER_ADDR, DEFAULT_EXPORTER_PORT, load_config
from gpuprof_jupyter.sampler_process.exporter import ExporterBindError
from gpuprof_jupyter.kernel.link import SamplerError, sampler_link


def listen_settings(port: int | None = None, addr: str | None = None) -> tuple[int, str]:
    """Port and address to listen on: the argument, else GPUPROF_EXPORTER_* or the config
    file's ``[exporter]``, else 9464 on 127.0.0.1. ConfigError if the config is malformed."""
    configured = load_config().exporter
    return (port if port is not None else configured.get("port", DEFAULT_EXPORTER_PORT),
            addr if addr is not None else configured.get("addr", DEFAULT_EXPORTER_ADDR))


def serve(port: int, addr: str) -> str:
    """Serve ``/metrics`` on ``addr:port`` (port 0: a free one) from the sampler process and
    return what to print: the URL, and a warning when it listens beyond loopback. Serving
    again elsewhere moves the endpoint. Raises ExporterBindError naming a taken port."""
    return _ask({"port": port, "addr": addr})


def stop() -> str:
    """Stop serving and free the port; what to print."""
    return _ask({"stop": True})


def _ask(payload: dict) -> str:
    try:
        return sampler_link().request("serve", payload)["message"]
    except SamplerError as exc:
        raise exc.as_local(ExporterBindError, ValueError) from None


__all__ = ["ExporterBindError", "listen_settings", "serve", "stop"]
