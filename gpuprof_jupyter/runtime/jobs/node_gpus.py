"""Each node's GPU readings for ``watch(JOB_ID, source="prometheus=URL")``: the newest reading
of every GPU that Prometheus holds (dcgm-exporter's series, or this project's exporter's),
shown beside the job's ranks.

Runs in any process that holds a run or watches one: the kernel, for ``watch(JOB_ID)``'s loop.

The readings come through the Prometheus source a profiled cell uses
(``core/sources/prometheus.py``): range queries for the time since the last poll, at most one a
scrape interval, mapped onto the metric contract's names and units with their provenance. Only
each GPU's newest values are kept. A GPU belongs to a rank's node when the node its series name
(dcgm-exporter's ``Hostname`` label, our exporter's ``node``) is the host the rank's part
records (the machine's name, or ``GPUPROF_HOST``).
"""

from __future__ import annotations

import time

from gpuprof_jupyter.core.sources.base import SourceUnavailable
from gpuprof_jupyter.core.sources.prometheus import PrometheusSource, parse_prometheus_spec

SHOWN = ("sm_util", "power_w", "gpu_mem_used_bytes")  # what the watch shows of each GPU


class NodeGPUs:
    """The GPUs Prometheus reports, by node. ``open`` raises ValueError naming why it cannot
    read them (not a Prometheus spec, the server unreachable, no GPU series)."""

    def __init__(self, spec: str, match: str | None = None, wall=time.time) -> None:
        try:
            parsed = parse_prometheus_spec(spec, match)
        except ValueError as exc:
            raise ValueError(f"watch reads GPUs through Prometheus only (source='prometheus=URL'): {exc}") from None
        self.url = parsed.url
        self._source = PrometheusSource(parsed, wall=wall)
        self._wall = wall
        self._gpus: dict[str, dict] = {}  # device key -> its node, device, newest values, their time

    def open(self) -> None:
        try:
            devices = self._source.open()
        except SourceUnavailable as exc:
            raise ValueError(str(exc)) from None
        for info in devices:
            if info.kind == "gpu":
                self._gpus[info.key] = {"node": info.extra.get("node"), "device": info.extra.get("device"),
                                        "values": {}, "wall": None}

    def poll(self) -> None:
        """Take what Prometheus scraped since the last poll (nothing before a scrape interval passed)."""
        for tick in self._source.read_batch():
            for key, values in tick.reading.items():
                gpu = self._gpus.get(key)
                if gpu is not None:
                    gpu["values"].update({m: v for m, v in values.items() if m in SHOWN})
                    gpu["wall"] = tick.wall

    def by_node(self) -> dict[str, list[dict]]:
        """node -> its GPUs, each ``{"device", "values", "tags", "age_s"}`` (``tags``: each
        metric's provenance; ``age_s``: how old its newest reading is, None before one came)."""
        tags, now, out = self._source.provenance(), self._wall(), {}
        for key, gpu in self._gpus.items():
            out.setdefault(gpu["node"], []).append({
                "device": gpu["device"], "values": dict(gpu["values"]), "tags": tags.get(key, {}),
                "age_s": None if gpu["wall"] is None else max(0.0, now - gpu["wall"])})
        return out

    def notes(self) -> list[str]:
        return self._source.notes()

    def close(self) -> None:
        self._source.close()


__all__ = ["NodeGPUs", "SHOWN"]
