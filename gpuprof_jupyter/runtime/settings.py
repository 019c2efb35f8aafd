"""Settings an experiment records: ``--param KEY=VALUE``, ``--capture VARS``, DataLoaders found.

Values are kept as JSON-friendly numbers, strings and bools; anything else as a short repr.
"""

from __future__ import annotations

import ast
import sys

_LOADER_FIELDS = ("batch_size", "num_workers", "pin_memory", "prefetch_factor")
_MAX_REPR = 200


def parse_value(text: str):
    """``"64"`` -> 64, ``"1e-3"`` -> 0.001, ``"true"`` -> True, anything else stays a string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
    return value if isinstance(value, (int, float, str)) else text


def parse_params(items: list[str]) -> dict:
    """``["batch_size=64", "amp=true"]`` -> dict. ValueError names the malformed item."""
    params: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--param {item!r} is not KEY=VALUE")
        params[key.strip()] = parse_value(value)
    return params


def parse_capture(text: str | None) -> list[str]:
    if not text:
        return []
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise ValueError(f"--capture takes variable names separated by commas; not names: {', '.join(bad)}")
    return names


def _short(text: str) -> str:
    return text if len(text) <= _MAX_REPR else text[:_MAX_REPR] + "..."


def describe(value) -> str:
    """A short description of a value that is not a plain number, string or bool: shape and
    dtype for a tensor or array, else its repr; never raises (a repr may)."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
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
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except Exception:  # noqa: BLE001 - a tensor of several elements, or an odd .item()
            pass
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return _short(value)
    return describe(value)


def capture(namespace: dict, names: list[str]) -> tuple[dict, list[str]]:
    """Values of ``names`` after the cell, and notes for names that were not defined."""
    values, notes = {}, []
    for name in names:
        if name in namespace:
            values[name] = jsonable(namespace[name])
        else:
            notes.append(f"--capture {name}: no such variable after the cell")
    return values, notes


def dataloader_settings(namespace: dict) -> dict:
    """batch_size, num_workers, pin_memory, prefetch_factor of torch DataLoaders in ``namespace``.

    One loader: plain keys. Several: ``<variable>.batch_size``. torch is never imported here.
    """
    torch = sys.modules.get("torch")
    loader_cls = getattr(getattr(getattr(torch, "utils", None), "data", None), "DataLoader", None)
    if loader_cls is None:
        return {}
    loaders = [(n, v) for n, v in list(namespace.items()) if not n.startswith("_") and isinstance(v, loader_cls)]
    settings = {}
    for name, loader in loaders:
        prefix = "" if len(loaders) == 1 else f"{name}."
        for field in _LOADER_FIELDS:
            settings[prefix + field] = jsonable(getattr(loader, field, None))
    return settings
