"""How many samples a batch holds, read from what a loader yielded (``track()``, the DataLoader hook).

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

A tensor or array: its first dimension. A list or tuple (``(inputs, labels)``) or a dict
(``{"input_ids": ...}``, HF style): the first dimension of its first tensor-like item. Anything
else (a generator's ints, strings): unknown (None). Never raises: an object whose shape cannot be
read (a nested tensor's ``shape`` raises) is unknown too, and ``failed(what, exc)``, when given,
is told (the hooks make it one note per run). Costs well under 1 us.
"""

from __future__ import annotations

UNREADABLE = "reading a batch size (recorded as unknown)"  # what ``failed`` is told


def _first_dim(value) -> int | None:
    shape = getattr(value, "shape", None)
    if shape is None or type(value) is type:
        return None
    try:
        return int(shape[0]) if len(shape) else None
    except (TypeError, IndexError, ValueError):
        return None


def batch_size(batch, failed=None) -> int | None:
    """Samples in ``batch``, or None when it cannot be told. The common containers (a tuple,
    list or dict of tensors) are told by their exact type first: this runs once per batch on
    the training thread (``benchmarks/bench_hooks.py``). ``failed(what, exc)``: told when reading
    the user's object raised."""
    try:
        kind = type(batch)
        if kind is tuple or kind is list:
            items = batch
        elif kind is dict:
            items = batch.values()
        else:
            n = _first_dim(batch)
            if n is not None:
                return n
            if isinstance(batch, (list, tuple)):
                items = batch
            elif isinstance(batch, dict):
                items = batch.values()
            else:
                return None
        for item in items:
            n = _first_dim(item)
            if n is not None:
                return n
    except Exception as exc:  # noqa: BLE001 - an odd object or container: unknown, never the user's error
        if failed is not None:
            failed(UNREADABLE, exc)
    return None


__all__ = ["UNREADABLE", "batch_size"]
