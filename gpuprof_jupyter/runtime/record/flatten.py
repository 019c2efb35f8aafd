"""``--capture`` of structured objects: a config becomes ``name.field`` keys a comparison can diff.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

Flattened: dataclasses (HF ``TrainingArguments`` is one), dicts, ``argparse.Namespace``,
``SimpleNamespace`` and plain objects whose public attributes are plain values or such
objects themselves (the config-node style many trainers use). Kept as they are: numbers,
strings, bools, None and short lists of those. Anything else (a tensor, an array, a model)
is a short description (``values.describe``: shape and dtype for a tensor). Bounded: at most
``MAX_DEPTH`` levels and ``MAX_KEYS`` keys per variable; never raises.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import types
from argparse import Namespace
from collections.abc import Mapping

from gpuprof_jupyter.runtime.record.values import jsonable

MAX_DEPTH = 4
MAX_KEYS = 200
MAX_LIST = 16
_PLAIN = (bool, int, float, str, type(None))


def flatten(name: str, value, max_depth: int = MAX_DEPTH, max_keys: int = MAX_KEYS) -> tuple[dict, bool]:
    """``(keys, truncated)``: ``{"train_config.num_workers": 2, ...}`` for a structured
    ``value``, ``{name: value}`` for a plain one; ``truncated`` when ``max_keys`` cut it short."""
    out: dict = {}
    truncated = _walk(name, value, 0, out, max_depth, max_keys, set())
    return out, truncated


def _walk(key: str, value, depth: int, out: dict, max_depth: int, max_keys: int, seen: set) -> bool:
    """Add ``value`` under ``key`` to ``out``; True when ``max_keys`` was reached."""
    if len(out) >= max_keys:
        return True
    children = _children(value) if depth < max_depth and id(value) not in seen else None
    if not children:
        out[key] = _leaf(value)
        return False
    seen.add(id(value))
    for field, child in children:
        if _walk(f"{key}.{field}", child, depth + 1, out, max_depth, max_keys, seen):
            return True
    seen.discard(id(value))
    return False


def _leaf(value):
    if isinstance(value, enum.Enum):
        value = value.value if isinstance(value.value, _PLAIN) else value.name
    elif isinstance(value, os.PathLike):
        value = os.fspath(value)
    elif isinstance(value, (list, tuple)) and len(value) <= MAX_LIST and all(isinstance(v, _PLAIN) for v in value):
        return [jsonable(v) for v in value]
    return jsonable(value)


def _children(value) -> list[tuple[str, object]] | None:
    """The fields of a structured value, or None for a leaf. Never raises."""
    try:
        if isinstance(value, _PLAIN) or hasattr(value, "shape") and hasattr(value, "dtype"):  # may raise: caught
            return None  # a tensor or an array: described, never walked
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return [(f.name, getattr(value, f.name, None)) for f in dataclasses.fields(value) if not f.name.startswith("_")]
        if isinstance(value, Mapping):
            return [(str(k), v) for k, v in list(value.items())]
        if isinstance(value, (Namespace, types.SimpleNamespace)) or _config_like(value, 2):
            return [(k, v) for k, v in vars(value).items() if not k.startswith("_")]
    except Exception:  # noqa: BLE001 - an odd object (a raising __getattr__): described instead
        return None
    return None


def _config_like(value, levels: int) -> bool:
    """A plain object whose public attributes are plain values, short lists of them, or (up to
    ``levels`` deep) structured values themselves. A model or a loader is not."""
    if isinstance(value, (type, types.ModuleType, types.FunctionType, types.MethodType)) or callable(value):
        return False
    attributes = getattr(value, "__dict__", None)
    if not isinstance(attributes, dict):
        return False
    public = [v for k, v in attributes.items() if not k.startswith("_")]
    if not public:
        return False
    for v in public:
        if isinstance(v, _PLAIN) or isinstance(v, (enum.Enum, os.PathLike)):
            continue
        if isinstance(v, (list, tuple)) and len(v) <= MAX_LIST and all(isinstance(x, _PLAIN) for x in v):
            continue
        if isinstance(v, (Mapping, Namespace, types.SimpleNamespace)) or dataclasses.is_dataclass(v):
            continue
        if levels > 0 and _config_like(v, levels - 1):
            continue
        return False
    return True


__all__ = ["MAX_DEPTH", "MAX_KEYS", "flatten"]
