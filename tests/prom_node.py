"""A stand-in for one node's gpuprof exporter, run as its own process by the Prometheus tests.

It serves, with prometheus_client and its own registry, the series
sampler_process/exporter.py exposes (``gpuprof_<metric>{node,device,simulated}``,
``gpuprof_device_info``, ``gpuprof_metric_provenance_info``) for one simulated GPU and the
host, with fixed values derived from the node's number, so a test knows what each node must
read back. Simulated, and labelled so. Prints its port, then serves until killed.

    python tests/prom_node.py NODE_NAME NODE_NUMBER
"""

from __future__ import annotations

import sys
import time

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily


def node_values(number: int) -> dict[str, dict[str, float]]:
    """What node ``number`` (1, 2, ...) reports: device key -> metric -> value (contract units)."""
    return {
        "gpu0": {"sm_util": 30.0 + 20.0 * number, "power_w": 100.0 * number + 0.5,
                 "gpu_mem_used_bytes": number * 2.0**30, "gpu_busy": 99.0},
        "host": {"cpu_util": 10.0 * number},
    }


class NodeCollector:
    def __init__(self, node: str, number: int) -> None:
        self.node, self.values = node, node_values(number)
        self.uuid = f"GPU-simulated-node{number}-0000"
        self.t0 = time.time()

    def collect(self):
        info = GaugeMetricFamily("gpuprof_device_info", "devices", labels=["node", "device", "kind", "name", "uuid", "simulated"])
        info.add_metric([self.node, "gpu0", "gpu", "Simulated A100-SXM4-40GB (simulated)", self.uuid, "true"], 1)
        info.add_metric([self.node, "host", "host", "host", "", "true"], 1)
        yield info
        origin = GaugeMetricFamily("gpuprof_metric_provenance_info", "provenance", labels=["node", "device", "metric", "provenance"])
        for device, metrics in self.values.items():
            for metric in metrics:
                origin.add_metric([self.node, device, metric, "simulated"], 1)
        yield origin
        energy = GaugeMetricFamily("gpuprof_energy_j", "energy", labels=["node", "device", "simulated"])
        energy.add_metric([self.node, "gpu0", "true"], 7.0 * (time.time() - self.t0))  # grows 7 J/s
        yield energy
        metrics = sorted({m for values in self.values.values() for m in values})
        for metric in metrics:
            family = GaugeMetricFamily(f"gpuprof_{metric}", metric, labels=["node", "device", "simulated"])
            for device, values in self.values.items():
                if metric in values:
                    family.add_metric([self.node, device, "true"], values[metric])
            yield family


def main() -> None:
    node, number = sys.argv[1], int(sys.argv[2])
    registry = CollectorRegistry()
    registry.register(NodeCollector(node, number))
    server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
    print(server.server_port, flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
