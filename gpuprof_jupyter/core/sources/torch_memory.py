"""torch's own memory statistics, read only when the user's code already initialised CUDA.

Runs in the kernel (it reads the kernel's allocator); its readings go to the sampler process.

NVML's used memory includes PyTorch's cache; ``torch_mem_allocated_bytes`` is what tensors
really hold. Importing torch or touching ``torch.cuda`` before the user did would create a
CUDA context (hundreds of MB on every GPU), so this source only looks at ``sys.modules``.
It runs in the kernel (whose allocator it reads) and its readings go to the sampler process
with the step events (``sampler_process.kernel_feed``).
"""

from __future__ import annotations

import sys

from gpuprof_jupyter.core.sources.base import DeviceInfo, Reading


def initialised_cuda():
    """``torch.cuda`` when the user's code already initialised CUDA, else None (never initialises it).

    The one check, shared by this source and the run's memory hooks (``runtime/hooks/memory_hooks.py``).
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch.cuda if torch.cuda.is_initialized() else None
    except Exception:  # noqa: BLE001 - a broken CUDA build, or torch without CUDA: no allocator to read
        return None


class TorchMemorySource:
    name = "torch"
    simulated = False

    def __init__(self, device_keys: dict[int, str] | None = None) -> None:
        self._fixed = device_keys  # torch device index (visible index) -> device key; None: every device

    def _keys_for(self, cuda) -> dict[int, str]:
        if self._fixed is not None:
            return self._fixed
        return {i: f"gpu{i}" for i in range(cuda.device_count())}  # the NVML source's keys

    def open(self) -> list[DeviceInfo]:
        return []  # adds metrics to the GPU source's devices

    def read(self, step_peaks: dict[int, float] | None = None) -> Reading:
        """``step_peaks``: device index -> the highest step peak since the last reading
        (``runtime.hooks.memory_hooks.StepMemory.take_peaks``), as ``step_peak_memory_bytes``."""
        cuda = initialised_cuda()
        if cuda is None:
            return {}
        reading = {}
        for i, key in self._keys_for(cuda).items():
            if i < cuda.device_count():
                reading[key] = {"torch_mem_allocated_bytes": float(cuda.memory_allocated(i)),
                                "torch_mem_reserved_bytes": float(cuda.memory_reserved(i))}
                if step_peaks and i in step_peaks:
                    reading[key]["step_peak_memory_bytes"] = float(step_peaks[i])
        return reading

    def final_context(self, step_peaks: dict[int, float] | None = None) -> dict:
        """torch_peaks: allocated/reserved peaks per device since process start or last reset;
        ``step_peaks`` (device index -> the run's highest step peak) count too, since the
        memory probe resets the peak at each step's end."""
        cuda = initialised_cuda()
        if cuda is None:
            return {}
        step_peaks = step_peaks or {}
        return {"torch_peaks": {
            key: {
                "max_allocated_bytes": max(float(cuda.max_memory_allocated(i)), step_peaks.get(i, 0.0)),
                "max_reserved_bytes": float(cuda.max_memory_reserved(i)),
            }
            for i, key in self._keys_for(cuda).items()
            if i < cuda.device_count()
        }}

    def provenance(self) -> dict[str, dict[str, str]]:
        tags = {"torch_mem_allocated_bytes": "torch.cuda", "torch_mem_reserved_bytes": "torch.cuda",
                "step_peak_memory_bytes": "torch.cuda.step_peak"}
        return {key: dict(tags) for key in (self._fixed or {}).values()}

    def notes(self) -> list[str]:
        return []

    def context(self) -> dict:
        return {}

    def close(self) -> None:
        pass
