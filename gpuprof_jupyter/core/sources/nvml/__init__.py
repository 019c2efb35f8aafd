"""Real GPUs through NVML (nvidia-ml-py): the source and what it is made of, one job a module.

Runs in the sampler process, and in the Jupyter server for its device list; never in the kernel.

``NvmlSource`` (source.py) plans and reads the metrics of the visible GPUs; beside it:
query.py, the one door to NVML (every call, its errors sorted by kind); visible_devices.py,
which GPUs and MIG slices CUDA_VISIBLE_DEVICES names; device.py, the per-device record;
readers.py, one function per NVML call and the table of what each feeds; fallbacks.py, what a
failing call turns into; pcie.py, the slow lane's thread for PCIe throughput.
"""

from gpuprof_jupyter.core.sources.nvml.source import NvmlSource

__all__ = ["NvmlSource"]
