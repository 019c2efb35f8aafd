"""One node's gpuprof exporter, run as its own process by the Prometheus tests.

It serves fixed values for one simulated GPU and the host, derived from the node's number, so a
test knows what each node must read back; everything is simulated and labelled so. It is the
project's exporter (``sampler_process.exporter.Exporter``), fed as the sampler process feeds
it. Prints its port, then serves until killed.

    python tests/prom_node.py NODE_NAME NODE_NUMBER
"""

from __future__ import annotations

import sys
import time

from gpuprof_jupyter.sampler_process.exporter import Exporter
from gpuprof_jupyter.core.sources.base import DeviceInfo

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


def main() -> None:
    node, number = sys.argv[1], int(sys.argv[2])
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
