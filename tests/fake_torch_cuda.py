"""torch.cuda's memory functions faked below their public names, driven by CPU tensors.

Tests only. As ``fake_nvml.py`` fakes NVML, this fakes the caching allocator's statistics
(``is_initialized``, ``device_count``, ``memory_allocated``, ``max_memory_allocated``,
``memory_reserved``, ``max_memory_reserved``, ``reset_peak_memory_stats``, ``mem_get_info``,
``empty_cache``, and ``torch.cuda.memory``'s ``_record_memory_history`` and ``_snapshot``):
the code under test calls ``torch.cuda.*`` as on a GPU. A test's training
loop ``hold()``s the CPU tensors a GPU would allocate; each counts ``numel() * element_size()``
bytes until it is garbage-collected. Past ``limit`` bytes, ``hold`` raises a real
``torch.OutOfMemoryError`` with torch's message format.
"""

from __future__ import annotations

import weakref

import torch

MIB, GIB = 1024**2, 1024**3
SEGMENT = 2 * MIB  # reserved memory grows by whole segments, as the caching allocator's does


class FakeCuda:
    def __init__(self, total: int = 16 * GIB, limit: int | None = None, context_bytes: int = 300 * MIB,
                 scale: float = 1.0) -> None:
        self.total = total
        self.scale = scale  # bytes counted per byte held: GPU-sized figures from small CPU tensors
        self.limit = total - context_bytes if limit is None else limit
        self.context_bytes = context_bytes  # outside PyTorch: the CUDA context
        self.allocated = self.peak = self.reserved = self.max_reserved = 0
        self.resets = self.emptied = 0
        self.initialised = True

    def hold(self, tensor: torch.Tensor) -> torch.Tensor:
        n = int(tensor.numel() * tensor.element_size() * self.scale)
        if self.allocated + n > self.limit:
            free = self.limit - self.allocated
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {n / MIB:.2f} MiB. GPU 0 has a total capacity of "
                f"{self.total / GIB:.2f} GiB of which {free / MIB:.2f} MiB is free. Including non-PyTorch memory, "
                f"this process has {(self.allocated + self.context_bytes) / GIB:.2f} GiB memory in use. Of the "
                f"allocated memory {self.allocated / GIB:.2f} GiB is allocated by PyTorch, and "
                f"{(self.reserved - self.allocated) / MIB:.2f} MiB is reserved by PyTorch but unallocated.")
        self.allocated += n
        if self.history is not None:
            self.history.append({"action": "alloc", "size": n})
        self.peak = max(self.peak, self.allocated)
        self.reserved = max(self.reserved, -(-self.allocated // SEGMENT) * SEGMENT)
        self.max_reserved = max(self.max_reserved, self.reserved)
        weakref.finalize(tensor, self._free, n)
        return tensor

    def _free(self, n: int) -> None:
        self.allocated -= n

    # torch.cuda's public names
    def is_initialized(self) -> bool:
        return self.initialised

    def device_count(self) -> int:
        return 1

    def memory_allocated(self, device=None) -> int:
        return self.allocated

    def max_memory_allocated(self, device=None) -> int:
        return self.peak

    def memory_reserved(self, device=None) -> int:
        return self.reserved

    def max_memory_reserved(self, device=None) -> int:
        return self.max_reserved

    def reset_peak_memory_stats(self, device=None) -> None:
        self.resets += 1
        self.peak, self.max_reserved = self.allocated, self.reserved

    def mem_get_info(self, device=None) -> tuple[int, int]:
        return self.total - self.reserved - self.context_bytes, self.total

    def get_rng_state_all(self) -> list:
        return []

    def set_rng_state_all(self, states) -> None:
        pass

    # torch.cuda.memory's history functions (--memory-history), below their names
    history: list | None = None  # the recorded allocations while recording, else None
    history_calls: list = []

    def _record_memory_history(self, enabled="all", context="all", stacks="all", max_entries=None, **kw) -> None:
        self.history_calls = [*self.history_calls, (enabled, max_entries)]
        self.history = None if enabled is None else []

    def _snapshot(self) -> dict:
        if self.history is None:
            raise RuntimeError("no memory history is being recorded")
        return {"segments": [{"device": 0, "total_size": self.reserved}], "device_traces": [list(self.history)]}

    def empty_cache(self) -> None:
        self.emptied += 1
        self.reserved = -(-self.allocated // SEGMENT) * SEGMENT

    NAMES = ("is_initialized", "device_count", "memory_allocated", "max_memory_allocated", "memory_reserved",
             "max_memory_reserved", "reset_peak_memory_stats", "mem_get_info", "empty_cache", "get_rng_state_all",
             "set_rng_state_all")

    HISTORY_NAMES = ("_record_memory_history", "_snapshot")

    def install(self, monkeypatch) -> FakeCuda:
        for name in self.NAMES:
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        for name in self.HISTORY_NAMES:
            monkeypatch.setattr(torch.cuda.memory, name, getattr(self, name))
        return self
