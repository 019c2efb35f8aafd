"""The Prometheus exporter (``%gpuprofile serve``): one folder, three jobs.

Runs in the sampler process.

``endpoint.py``: the ``/metrics`` endpoint (``Exporter``), its token and its listen warnings;
``metrics.py``: the series it serves (device values, recent experiments); ``server.py``: its
bounded HTTP server; ``host.py``: its life in the sampler process (listen, feed, stop).

The endpoint's names are re-exported here when first asked for (PEP 562), not at import:
the sampler process imports ``host`` at its start, and prometheus_client is 40 ms of that
start, paid only when a kernel asks to serve.
"""

from __future__ import annotations

import importlib

_ENDPOINT_NAMES = {"Exporter", "ExporterBindError", "KEEP_FINISHED", "is_loopback", "scrape_config",
                   "wide_listen_warning"}


def __getattr__(name: str):
    if name in _ENDPOINT_NAMES:
        return getattr(importlib.import_module("gpuprof_jupyter.sampler_process.exporter.endpoint"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_ENDPOINT_NAMES)
