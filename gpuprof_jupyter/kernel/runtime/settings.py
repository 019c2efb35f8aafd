"""Settings an experiment records: ``--param KEY=VALUE``, ``--capture VARS``, DataLoaders found or iterated.

Runs in the kernel (or the profiled script).

Values are kept as JSON-friendly numbers, strings and bools; anything else as a short repr.
"""

from __future__ import annotations

import ast
import sys

from gpuprof_jupyter.kernel.runtime.flatten import MAX_DEPTH, MAX_KEYS, flatten
from gpuprof_jupyter.core.torch_defaults import LOADER_FIELDS
from gpuprof_jupyter.kernel.runtime.values import describe, jsonable



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
    ``name.field`` keys (``runtime.flatten``); plain ones stay under ``name``."""
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


def dataloader_settings(namespace: dict, iterated: list[tuple[int, dict]] = ()) -> dict:
    """Settings of the torch DataLoaders in ``namespace`` and of those the run iterated
    (``iterated``: ``(id(loader), loader_settings(loader))`` pairs, from the DataLoader hook).

    One loader in all: plain keys (``batch_size``). Several: ``<variable>.batch_size`` for
    those in the namespace, ``loader<N>.batch_size`` for the others (N in iteration order).
    A loader both in the namespace and iterated counts once, and so do iterated loaders with
    the same settings (one rebuilt each epoch). torch is never imported here.
    """
    torch = sys.modules.get("torch")
    loader_cls = getattr(getattr(getattr(torch, "utils", None), "data", None), "DataLoader", None)
    named = [] if loader_cls is None else [
        (id(v), n, loader_settings(v)) for n, v in list(namespace.items()) if not n.startswith("_") and isinstance(v, loader_cls)]
    named_ids = {i for i, _, _ in named}
    unnamed = []  # a loader rebuilt each epoch with the same settings counts once
    for i, fields in iterated:
        if i not in named_ids and fields not in unnamed:
            unnamed.append(fields)
    loaders = [(n, fields) for _, n, fields in named] + [(f"loader{i + 1}", s) for i, s in enumerate(unnamed)]
    settings = {}
    for name, fields in loaders:
        prefix = "" if len(loaders) == 1 else f"{name}."
        settings.update({prefix + key: value for key, value in fields.items()})
    return settings


__all__ = ["capture", "dataloader_settings", "describe", "jsonable", "loader_settings", "parse_capture", "parse_params",
           "parse_value"]
