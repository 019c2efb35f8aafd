"""Opted-in fields of a captured config, set for one trial and put back after it.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

Only fields the user named with ``--tune VARIABLE.FIELD=V1,V2`` are ever changed: batch size,
AMP and the like can change results, so the profiler never touches them on its own.
"""

from __future__ import annotations

from collections.abc import MutableMapping

_MISSING = object()


def _get(obj, name):
    return obj.get(name, _MISSING) if isinstance(obj, MutableMapping) else getattr(obj, name, _MISSING)


def _set(obj, name, value) -> None:
    if isinstance(obj, MutableMapping):
        obj[name] = value
    else:
        setattr(obj, name, value)


def resolve(namespace: dict, key: str):
    """``(owner, field name, current value)`` for ``train_config.batch_size``; LookupError if absent."""
    variable, *path = key.split(".")
    if variable not in namespace:
        raise LookupError(f"--tune {key}: no variable {variable!r} in the notebook's namespace")
    owner = namespace[variable]
    for name in path[:-1]:
        owner = _get(owner, name)
        if owner is _MISSING:
            raise LookupError(f"--tune {key}: {variable} has no field {name!r}")
    value = _get(owner, path[-1])
    if value is _MISSING:
        raise LookupError(f"--tune {key}: {'.'.join([variable, *path[:-1]])} has no field {path[-1]!r}")
    return owner, path[-1], value


class OptInValues:
    """Context manager: ``{"train_config.amp": True}`` set on entry, the old values put back on exit."""

    def __init__(self, namespace: dict, values: dict) -> None:
        self.namespace, self.values = namespace, values
        self._restore: list[tuple] = []

    def __enter__(self) -> "OptInValues":
        for key, value in self.values.items():
            owner, name, old = resolve(self.namespace, key)
            self._restore.append((owner, name, old))
            _set(owner, name, value)
        return self

    def __exit__(self, *exc) -> None:
        while self._restore:
            owner, name, old = self._restore.pop()
            _set(owner, name, old)


__all__ = ["OptInValues", "resolve"]
