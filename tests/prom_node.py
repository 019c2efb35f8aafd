"""One node's gpuprof exporter, run as its own process by the Prometheus tests.

It serves fixed values for one simulated GPU and the host, derived from the node's number, so a
test knows what each node must read back; everything is simulated and labelled so. It uses the
project's exporter (``sampler_process.exporter.Exporter``) where the package has it, and
otherwise a stand-in serving the same series with prometheus_client (``gpuprof_<metric>``
labelled node/device/simulated, ``gpuprof_device_info``, ``gpuprof_metric_provenance_info``).
Prints its port, then serves until killed.

    python tests/prom_node.py NODE_NAME NODE_NUMBER
"""

from __future__ import annotations

import sys
import time

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily

from gpuprof_jupyter.sources.base import DeviceInfo

ENERGY_W = 7.0  # the simulated GPU's energy grows 7 J a second


def node_values(number: int) -> dict[str, dict[str, float]]:
    """What node ``number`` (1, 2, ...) reports: device key -> metric -> value (contract units)."""
    return {
        "gpu0": {"sm_util": 30.0 + 20.0 * number, "power_w": 100.0 * number + 0.5,
                 "gpu_mem_used_bytes": number * 2.0**30, "gpu_busy": 99.0},
        "host": {"cpu_util": 10.0 * number},
    }


def node_devices(number: int) -> list[DeviceInfo]:
    return [DeviceInfo("gpu0", "gpu", "Simulated A100-SXM4-40GB (simulated)", 0, f"GPU-simulated-node{number}-0000",
                       simulated=True),
            DeviceInfo("host", "host", "host (simulated)", simulated=True)]


def latest(number: int, t0: float) -> dict[str, dict[str, float]]:
    values = node_values(number)
    values["gpu0"]["energy_j"] = ENERGY_W * (time.time() - t0)
    return values


class StandIn:
    """The exporter's device series, for a package without sampler_process.exporter."""

    def __init__(self, node: str, number: int) -> None:
        self.node, self.number, self.t0 = node, number, time.time()
        self.devices = node_devices(number)

    def collect(self):
        info = GaugeMetricFamily("gpuprof_device_info", "devices", labels=["node", "device", "kind", "name", "uuid", "simulated"])
        origin = GaugeMetricFamily("gpuprof_metric_provenance_info", "provenance",
                                   labels=["node", "device", "metric", "provenance"])
        values = latest(self.number, self.t0)
        for d in self.devices:
            info.add_metric([self.node, d.key, d.kind, d.name, d.uuid or "", "true"], 1)
            for metric in values[d.key]:
                origin.add_metric([self.node, d.key, metric, "simulated"], 1)
        yield info
        yield origin
        for metric in sorted({m for v in values.values() for m in v}):
            family = GaugeMetricFamily(f"gpuprof_{metric}", metric, labels=["node", "device", "simulated"])
            for device, v in values.items():
                if metric in v:
                    family.add_metric([self.node, device, "true"], v[metric])
            yield family


def main() -> None:
    node, number = sys.argv[1], int(sys.argv[2])
    try:
        from gpuprof_jupyter.sampler_process.exporter import Exporter
    except ImportError:
        registry = CollectorRegistry()
        registry.register(StandIn(node, number))
        server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
        print(server.server_port, flush=True)
        while True:
            time.sleep(3600)
    exporter = Exporter(node=node)
    devices = node_devices(number)
    t0 = time.time()
    exporter.set_devices(devices, {key: {m: "simulated" for m in values} for key, values in latest(number, t0).items()})
    exporter.update(latest(number, t0))
    print(exporter.start("127.0.0.1", 0), flush=True)
    while True:  # values are refreshed as the sampler process does (else they go stale)
        time.sleep(0.25)
        exporter.update(latest(number, t0))


if __name__ == "__main__":
    main()
