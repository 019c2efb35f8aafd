"""Memory per step and where it goes, read at step boundaries on the training thread.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

``StepMemory.boundary()`` is called by the training hooks (``torch_hooks``) at the end of
each optimizer step and by ``step()`` (``activity.ActivityLog.step``), on the thread that
trains, before the step's own event. Two jobs (docs/memory.md):

* **Per-step peak.** When the user's code has initialised CUDA (``torch.cuda.is_initialized``:
  the profiler never creates a context), it reads ``max_memory_allocated`` of each device,
  resets the peak (``reset_peak_memory_stats``) and appends one ``MEM`` event, which the
  ActivityLog folds into the step's ``peak_memory_bytes``. The per-device peaks since the last
  hand-over also go to the sampler process as the ``step_peak_memory_bytes`` metric.
* **Breakdown, one sampled step.** After the first step (optimizer state exists by then) it
  opens a window of one step with ``torch.autograd.graph.saved_tensors_hooks`` that counts the
  bytes saved for backward (each storage once, the optimizers' parameters not at all); at the
  window's closing boundary it sums the parameters, gradients and optimizer state of the
  optimizers that stepped, from the tensors' own sizes (``numel() * element_size()``), so it
  works on any device, CPU included. ``other`` is the rest of the allocator's peak.

With ``--memory-history`` the same boundaries start torch's allocator history once CUDA is
initialised, save its snapshot once when a step left under 5 % of a device free, and ``close()``
stops it (``oom_record.MemoryHistory``).

Everything is guarded by the caller (``torch_hooks``): a failure is a counted note and the
user's step goes on.
"""

from __future__ import annotations

import math
import sys
import threading
import weakref

from gpuprof_jupyter.core.sources.torch_memory import initialised_cuda
from gpuprof_jupyter.runtime.hooks.fork_locks import hook_lock
from gpuprof_jupyter.runtime.record.events import MEM

OPTIMIZER, STEP_CALL = "optimizer", "step()"


def _torch_cuda():
    """``torch.cuda``, looked up once per run, or None (no torch yet, a build without it). In a
    training loop the step's own data has pushed the profiler's out of the caches: the lookups
    ``initialised_cuda()`` makes cost 2.7 us a step, ``cuda.is_initialized()`` on the module
    found here 1.3 us (benchmarks/README.md, "Gaps")."""
    try:
        return sys.modules["torch"].cuda
    except Exception:  # noqa: BLE001 - no torch, or a build without torch.cuda: no allocator to read
        return None


def _cuda_indices(optimizer) -> set[int]:
    """The CUDA device indices of ``optimizer``'s parameters (empty on CPU)."""
    return {p.device.index or 0 for group in optimizer.param_groups for p in group["params"]
            if p.device.type == "cuda"}


def tensor_bytes(tensor) -> int:
    return int(tensor.numel()) * int(tensor.element_size())


class _SavedTensorCounter:
    """Bytes saved for backward while it is active: each storage once, parameters excluded."""

    def __init__(self, torch, exclude: set[int]) -> None:
        self.exclude = exclude  # storage addresses of parameters
        self.storages: dict[int, int] = {}
        self.uncounted = 0  # saved tensors without a storage to count
        self.active = True
        self._context = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._context.__enter__()
        self._thread = threading.get_ident()

    def _pack(self, tensor):
        if self.active:
            try:
                storage = tensor.untyped_storage()
                key = storage.data_ptr()
                if key not in self.exclude and key not in self.storages:
                    self.storages[key] = int(storage.nbytes())
            except Exception:  # noqa: BLE001 - no storage to count (sparse, subclass): counted apart, never raised
                self.uncounted += 1
        return tensor

    @staticmethod
    def _unpack(tensor):
        return tensor

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())

    def close(self) -> None:
        """Stop counting; the hooks leave torch's stack only from the thread that pushed them
        (elsewhere they stay, inert, until that thread's stack goes)."""
        if not self.active:
            return
        self.active = False
        if threading.get_ident() == self._thread:
            self._context.__exit__(None, None, None)


def optimizer_bytes(optimizers) -> dict[str, int]:
    """Parameters, gradients and optimizer state of ``optimizers``, each tensor once (bytes)."""
    params: dict[int, object] = {}
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for p in group["params"]:
                params[id(p)] = p
    state: dict[int, object] = {}
    for optimizer in optimizers:
        for values in optimizer.state.values():
            for value in (values.values() if isinstance(values, dict) else ()):
                if hasattr(value, "element_size") and id(value) not in params:
                    state[id(value)] = value
    return {
        "parameters": sum(tensor_bytes(p) for p in params.values()),
        "gradients": sum(tensor_bytes(p.grad) for p in params.values() if p.grad is not None),
        "optimizer_state": sum(tensor_bytes(v) for v in state.values()),
    }


def breakdown_record(categories: dict[str, int], activations: int, allocator_peak: float | None) -> dict:
    """The stored record (``context["memory"]``): bytes per counted category and the sampled
    step's allocator peak (None: no CUDA allocator in use). ``other`` is computed in the
    summary (``core.analysis.memory``) against the run's peak."""
    sampled = float(allocator_peak) if allocator_peak is not None and math.isfinite(allocator_peak) else None
    return {"counted": {**categories, "activations": activations}, "sampled_peak_bytes": sampled}


class StepMemory:
    """The memory side of one session's training hooks (``torch_hooks.TrainingHooks.memory``)."""

    def __init__(self, activity, sample_after: int = 1) -> None:
        self.activity = activity  # emit and clock are read at each boundary (the hooks may hold None)
        self.sample_after = sample_after  # boundaries of the window's kind before it opens
        self.record: dict | None = None  # the breakdown, once its window closed
        self._optimizers: dict[int, weakref.ref] = {}  # id -> the optimizers that stepped
        self._seen = {OPTIMIZER: 0, STEP_CALL: 0}
        self._window: _SavedTensorCounter | None = None
        self._window_kind: str | None = None
        self._peaks: dict[int, float] = {}  # device index -> highest step peak since the last take
        self.run_peaks: dict[int, float] = {}  # device index -> the run's highest step peak
        self._devices: set[int] = set()  # CUDA devices the optimizers' parameters live on
        self._lock = hook_lock(self, "_lock")  # the optimizer hook takes it: new in a fork
        self.history = None  # --memory-history: oom_record.MemoryHistory, begun once CUDA is initialised
        self._cuda = _torch_cuda()  # found again at start(), when the hooks are installed

    # -- the training thread ---------------------------------------------------------------
    def start(self) -> None:
        """The run starts: the first step's peak counts from here, not from before the run."""
        self._cuda = _torch_cuda()
        cuda = initialised_cuda()
        if cuda is not None:
            for i in range(cuda.device_count()):
                cuda.reset_peak_memory_stats(i)
        if self.history is not None:
            self.history.begin()

    def boundary(self, optimizer=None) -> None:
        """End of a step (``optimizer`` given: its ``step()`` just returned). Once the breakdown
        is done and without CUDA this is a dict lookup and one ``is_initialized()`` call
        (``benchmarks/bench_hooks.py``)."""
        if optimizer is None:
            kind = STEP_CALL
        else:
            kind = OPTIMIZER
            if id(optimizer) not in self._optimizers:
                self._optimizers[id(optimizer)] = weakref.ref(optimizer)
                self._devices.update(_cuda_indices(optimizer))
        cuda = self._cuda
        try:
            if cuda is not None and not cuda.is_initialized():
                cuda = None
        except Exception:  # noqa: BLE001 - a torch without CUDA support: no allocator to read
            cuda = None
        if cuda is not None and self.history is not None and self.history.recording and self.history.low is None:
            self.history.watch(cuda, sorted(self._devices) or range(cuda.device_count()),
                               max(self._seen.values()) + 1)  # under 5 % free: the snapshot, once (the
            # step counted from 1, as the out-of-memory explanation counts)
        peak = self._step_peak(cuda) if cuda is not None else None
        if cuda is not None and self.history is not None and not self.history.recording:
            self.history.begin()  # the user's code initialised CUDA during the run
        self._seen[kind] += 1  # also read after the breakdown: the steps before an out-of-memory error
        if self.record is not None:
            return
        if self._window is not None:
            if kind == self._window_kind:
                self._close_window(peak)
        elif self._seen[kind] == self.sample_after:
            self._open_window(kind)

    @property
    def optimizer_steps(self) -> int:
        """``optimizer.step()`` calls seen in the run (each sibling optimizer's counts)."""
        return self._seen[OPTIMIZER]

    def _live_optimizers(self) -> list:
        return [o for o in (ref() for ref in self._optimizers.values()) if o is not None]

    def _step_peak(self, cuda) -> float | None:
        """Read and reset the peak of the devices the optimizers' parameters live on (every
        visible device when none is known: ``step()`` without an optimizer): one
        ``memory_stats`` call each, so an 8-GPU node's idle devices cost nothing per step."""
        peaks = {}
        for i in sorted(self._devices) or range(cuda.device_count()):
            peaks[i] = float(cuda.max_memory_allocated(i))
            cuda.reset_peak_memory_stats(i)
        if not peaks:
            return None
        with self._lock:
            for i, value in peaks.items():
                self._peaks[i] = max(self._peaks.get(i, 0.0), value)
                self.run_peaks[i] = max(self.run_peaks.get(i, 0.0), value)
        peak = max(peaks.values())
        activity = self.activity
        activity.emit((MEM, activity.clock(), peak))
        return peak

    def _open_window(self, kind: str) -> None:
        torch = sys.modules["torch"]
        exclude = set()
        for optimizer in self._live_optimizers():
            for group in optimizer.param_groups:
                exclude.update(p.untyped_storage().data_ptr() for p in group["params"])
        self._window, self._window_kind = _SavedTensorCounter(torch, exclude), kind

    def _close_window(self, peak: float | None) -> None:
        window, self._window = self._window, None
        window.close()
        self.record = breakdown_record(optimizer_bytes(self._live_optimizers()), window.bytes, peak)
        if window.uncounted:
            self.record["uncounted_saved_tensors"] = window.uncounted

    # -- other threads ---------------------------------------------------------------------
    def take_peaks(self) -> dict[int, float]:
        """Device index -> the highest step peak since the last call (the hand-over, once a second)."""
        with self._lock:
            taken, self._peaks = self._peaks, {}
        return taken

    def close(self) -> None:
        """End of the run: a window still open is closed (no breakdown from a partial step)."""
        window, self._window = self._window, None
        if window is not None:
            window.close()
        if self.history is not None:
            self.history.end()


__all__ = ["StepMemory", "breakdown_record", "initialised_cuda", "optimizer_bytes", "tensor_bytes"]
