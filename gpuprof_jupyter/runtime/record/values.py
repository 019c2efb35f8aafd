"""Any value as JSON-friendly data for an experiment's metadata: numbers stay, the rest is described.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

Values are kept as JSON-friendly numbers, strings and bools; anything else as a short repr
(a tensor or array as its shape and dtype). Nothing here raises.
"""

from __future__ import annotations

_MAX_REPR = 200


def _short(text: str) -> str:
    return text if len(text) <= _MAX_REPR else text[:_MAX_REPR] + "..."


def _attribute(value, name: str):
    """``getattr(value, name, None)``, also when a user's ``__getattr__`` raises something else."""
    try:
        return getattr(value, name, None)
    except Exception:  # noqa: BLE001 - an odd object: as if it had no such attribute
        return None


def describe(value) -> str:
    """A short description of a value that is not a plain number, string or bool: shape and
    dtype for a tensor or array, else its repr; never raises (a repr may)."""
    shape, dtype = _attribute(value, "shape"), _attribute(value, "dtype")
    if shape is not None and dtype is not None:
        try:
            return f"{type(value).__name__}(shape={tuple(shape)}, dtype={dtype})"
        except Exception:  # noqa: BLE001 - an odd shape: fall through to repr
            pass
    try:
        return _short(repr(value))
    except Exception as exc:  # noqa: BLE001 - a user's __repr__ may raise anything
        return f"<{type(value).__name__} object: repr failed ({type(exc).__name__})>"


def jsonable(value):
    """``value`` as JSON-friendly data: one-element tensors and numpy scalars become numbers,
    other objects a short description (``describe``). Never raises."""
    item = _attribute(value, "item")
    if callable(item):
        try:
            value = item()
        except Exception:  # noqa: BLE001 - a tensor of several elements, or an odd .item()
            pass
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return _short(value)
    return describe(value)
