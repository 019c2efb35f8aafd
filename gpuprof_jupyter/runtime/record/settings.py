"""Settings an experiment records: ``--param KEY=VALUE``, ``--capture VARS``, the DataLoaders the run iterated.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

Values are kept as JSON-friendly numbers, strings and bools; anything else as a short repr.
"""

from __future__ import annotations

import ast

from gpuprof_jupyter.runtime.record.flatten import MAX_DEPTH, MAX_KEYS, flatten
from gpuprof_jupyter.core.torch_defaults import LOADER_FIELDS
from gpuprof_jupyter.runtime.record.values import describe, jsonable



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


def capture(namespace: dict, names: list[str]) -> tuple[dict, list[str]]:
    """Values of ``names`` after the cell, and notes for names that were not defined or were
    cut short. Structured values (dataclasses, dicts, namespaces, config objects) become
    ``name.field`` keys (``runtime.record.flatten``); plain ones stay under ``name``."""
    values, notes = {}, []
    for name in names:
        if name in namespace:
            flat, truncated = flatten(name, namespace[name])
            values.update(flat)
            if truncated:
                notes.append(f"--capture {name}: kept the first {len(flat)} fields "
                             f"(at most {MAX_KEYS}, {MAX_DEPTH} levels deep)")
        else:
            notes.append(f"--capture {name}: no such variable after the cell")
    return values, notes


def loader_settings(loader) -> dict:
    """A DataLoader's settings: batch_size, num_workers, pin_memory, prefetch_factor,
    persistent_workers, the dataset's class and length (None where it has none). ``batch_size``
    comes from the loader's batch sampler when the loader itself holds None."""
    settings = {field: jsonable(getattr(loader, field, None)) for field in LOADER_FIELDS}
    if settings["batch_size"] is None:  # built on a batch sampler (accelerate, HF): torch stores None
        settings["batch_size"] = jsonable(getattr(getattr(loader, "batch_sampler", None), "batch_size", None))
    dataset = getattr(loader, "dataset", None)
    settings["dataset"] = type(dataset).__name__ if dataset is not None else None
    try:
        settings["dataset_len"] = len(dataset)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - an IterableDataset has no length
        settings["dataset_len"] = None
    return settings


def dataloader_settings(iterated, namespace: dict | None = None) -> dict:
    """Settings of the torch DataLoaders the run iterated, and only those: a loader that merely
    sits in the namespace was not used by this run and is not credited to it.

    ``iterated``: ``(loader reference, loader_settings(loader))`` pairs from the DataLoader hook
    (``torch_hooks.py``), the settings as they were when the run iterated the loader; the
    reference (a ``weakref.ref`` or None) lets a loader be named after the ``namespace``
    variable that holds it. One loader in all: plain keys (``batch_size``). Several:
    ``<variable>.batch_size`` for those a variable holds, ``loader<N>.batch_size`` for the
    others (N in iteration order). Unnamed loaders with the same settings count once (one
    rebuilt each epoch). A run that iterated none gets {}.
    """
    by_id = {}
    for name, value in list((namespace or {}).items()):
        if not name.startswith("_"):
            by_id.setdefault(id(value), (name, value))
    loaders: list[tuple[str | None, dict]] = []
    for ref, fields in iterated:
        loader = ref() if ref is not None else None
        held = by_id.get(id(loader)) if loader is not None else None
        name = held[0] if held is not None and held[1] is loader else None
        if (name, fields) not in loaders:
            loaders.append((name, fields))
    unnamed = 0
    settings = {}
    for name, fields in loaders:
        if name is None:
            unnamed += 1
            name = f"loader{unnamed}"
        prefix = "" if len(loaders) == 1 else f"{name}."
        settings.update({prefix + key: value for key, value in fields.items()})
    return settings


__all__ = ["capture", "dataloader_settings", "describe", "jsonable", "loader_settings", "parse_capture", "parse_params",
           "parse_value"]
