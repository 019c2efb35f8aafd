"""What the training process knows when a run dies of ``torch.OutOfMemoryError``.

Runs in any process that holds a run: the kernel, a script under ``gpuprof run``, or a child process of either.

``oom_context`` is stored as ``context["oom"]`` before the run is saved: torch's message, the
optimizers' tensors counted at the error (parameters, gradients, optimizer state, from the
tensors' own sizes as in ``memory_hooks``), and, with ``--memory-history``, where the
allocator's snapshot was saved. ``earlier_fit`` adds the largest batch fitted over the earlier
runs of the same cell in the store (``core/analysis/headroom.py``). ``core/analysis/oom.py``
turns it into ``summary["memory"]["oom"]`` (docs/memory.md, "Out of memory").

``MemoryHistory`` is ``--memory-history``: torch's allocator history
(``torch.cuda.memory._record_memory_history``) recorded while the run lasts, started only once
the user's code has initialised CUDA (at the run's start or at a step's end: the profiler never
creates a context), and on out-of-memory saved as ``memory_snapshot.pickle`` in the
experiment's folder, the file PyTorch's memory viewer (pytorch.org/memory_viz) opens. It is also
saved once, before any out-of-memory error, when the headroom falls under ``LOW_HEADROOM`` (5 %)
in a step (``MemoryHistory.watch``, at the step's end: the device's free memory less what the
step's peak reserved beyond the memory reserved now, over its total, from ``torch.cuda.mem_get_info``
and the allocator's statistics), as ``memory_snapshot-low-headroom.pickle``; its record (when,
how low, where) goes in ``context["memory_history"]`` and in the out-of-memory explanation.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

from gpuprof_jupyter.runtime.hooks.memory_hooks import initialised_cuda, optimizer_bytes

SNAPSHOT_FILE = "memory_snapshot.pickle"
LOW_HEADROOM_FILE = "memory_snapshot-low-headroom.pickle"
LOW_HEADROOM = 0.05  # a step that left less than this share of a device free saves the history once
HISTORY_ENTRIES = 100_000  # allocation events kept (torch's ring buffer): the last ones before the error
EARLIER_RUNS = 20  # the most recent runs of the same cell the largest batch is fitted over
LOOKED_AT = 200  # the most recent finished runs searched for them (a large store is not read whole)


def is_out_of_memory(exc: BaseException | None) -> bool:
    """torch's ``OutOfMemoryError`` (also ``torch.cuda.OutOfMemoryError``, the same class)."""
    torch = sys.modules.get("torch")
    oom = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    return exc is not None and oom is not None and isinstance(exc, oom)


class MemoryHistory:
    """torch's allocator history for one run (``--memory-history``)."""

    def __init__(self, max_entries: int = HISTORY_ENTRIES, low_headroom: float = LOW_HEADROOM) -> None:
        self.max_entries = max_entries
        self.low_headroom = low_headroom
        self.recording = False
        self.directory = None  # where the low-headroom snapshot goes (the experiment's folder), set by the run
        self.low_name = LOW_HEADROOM_FILE  # or a callable naming it when saved: one per rank under gpuprof run
        self.low: dict | None = None  # the low-headroom snapshot's record, once taken

    def watch(self, cuda, devices, step: int) -> dict | None:
        """At a step's end, while recording: the first time a device's headroom during the step fell
        under ``low_headroom``, save the snapshot; its record (else None). The peak is read before
        the step's peak statistics are reset."""
        if self.low is not None or not self.recording:
            return None
        for i in devices:
            free, total = cuda.mem_get_info(i)
            if not total:
                continue
            above_now = max(0, cuda.max_memory_reserved(i) - cuda.memory_reserved(i))  # freed before the step's end
            headroom = max(0.0, (free - above_now) / total)
            if headroom < self.low_headroom:
                saved = self.save(self.directory, self.low_name() if callable(self.low_name) else self.low_name)
                self.low = {**saved, "headroom_frac": headroom, "threshold": self.low_headroom, "device": int(i),
                            "step": int(step)}
                return self.low
        return None

    def begin(self) -> None:
        """Start recording if the user's code has initialised CUDA (else try again at the next step's end)."""
        if self.recording:
            return
        cuda = initialised_cuda()
        if cuda is not None:
            cuda.memory._record_memory_history(max_entries=self.max_entries)
            self.recording = True

    def save(self, directory, name: str = SNAPSHOT_FILE) -> dict:
        """The snapshot into ``directory``/``name``: {"snapshot": path} or {"snapshot": None, "why": ...}."""
        if not self.recording:
            return {"snapshot": None, "why": "CUDA was not initialised at the run's start nor at any step's end, "
                                             "so no allocator history was recorded"}
        if directory is None:
            return {"snapshot": None, "why": "the run has no experiment folder to save it in"}
        cuda = initialised_cuda()
        path = Path(directory) / name
        try:
            snapshot = cuda.memory._snapshot()
            with open(path, "wb") as f:
                pickle.dump(snapshot, f)
        except Exception as exc:  # noqa: BLE001 - a full disk, a torch without it: said, the run is saved
            path.unlink(missing_ok=True)
            return {"snapshot": None, "why": f"saving the snapshot failed ({type(exc).__name__}: {exc})"}
        return {"snapshot": str(path), "entries": self.max_entries}

    def end(self) -> None:
        """Stop recording (the run ended): torch's history costs nothing afterwards."""
        if self.recording:
            self.recording = False
            cuda = initialised_cuda()
            if cuda is not None:
                cuda.memory._record_memory_history(enabled=None)


def oom_context(exc: BaseException, memory, directory=None, snapshot_name: str = SNAPSHOT_FILE) -> dict:
    """``context["oom"]``: torch's message and what the optimizers held at the error (``memory``:
    the run's ``memory_hooks.StepMemory``); the allocator snapshot saved when history was on
    (``snapshot_name``: one per process where several may run out, gpuprof run's ranks)."""
    record: dict = {"error": str(exc), "optimizer_steps": memory.optimizer_steps}
    try:
        optimizers = memory._live_optimizers()
        if optimizers:  # none stepped yet (the first step failed): nothing counted, not zeros
            record["counted"] = optimizer_bytes(optimizers)
    except Exception as exc_counting:  # noqa: BLE001 - the rest of the explanation stands
        record["counted_failed"] = f"{type(exc_counting).__name__}: {exc_counting}"
    if memory.history is not None:
        record["memory_history"] = memory.history.save(directory, snapshot_name)
        if memory.history.low is not None:  # the headroom ran low earlier: that snapshot too
            record["memory_history"]["low_headroom"] = memory.history.low
    return record


def earlier_fit(store, meta) -> dict | None:
    """The largest batch over the earlier finished runs of the same cell (same name, or the same
    cell source), as ``LargestBatch.to_dict()`` less its points; None when they give none."""
    from gpuprof_jupyter.core.analysis.headroom import largest_batch

    source = meta.context.get("cell_source")
    finished = [e for e in store.entries() if e.id != meta.id and e.status == "ok"]  # the index: no meta.json read
    same = []
    for entry in reversed(finished[-LOOKED_AT:]):  # newest first; a cell's source is in its meta.json
        if len(same) == EARLIER_RUNS:
            break
        if entry.name != meta.name and not source:
            continue
        try:
            other = store.read_meta(entry.id)
        except KeyError:  # removed or damaged since the listing: not one of them
            continue
        if entry.name == meta.name or other.context.get("cell_source") == source:
            same.append(other)
    runs = [store.load_meta(m) for m in reversed(same)]
    if not runs:
        return None
    try:
        fit = largest_batch(runs)
    except ValueError:
        return None
    out = fit.to_dict()
    out.pop("points", None)
    return out


__all__ = ["LOW_HEADROOM", "LOW_HEADROOM_FILE", "MemoryHistory", "SNAPSHOT_FILE", "earlier_fit", "is_out_of_memory", "oom_context"]
