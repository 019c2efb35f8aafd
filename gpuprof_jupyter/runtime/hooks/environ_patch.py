"""Variables set in ``os.environ`` while a run lasts, then put back as they were.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

Only the keys set here are put back, and only where the user's code left them as set: a key the
cell changed or removed meanwhile keeps the cell's value, less the path entries added here
(``PYTHONPATH`` with the children's startup directory: the cell's own entries stay).
``unittest.mock.patch.dict`` would restore the whole mapping, undoing the cell's changes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping


class EnvironPatch:
    """``set(values)`` remembers each key's value before (once) and sets it; ``restore()`` puts
    every such key back (removed where it was absent). Restoring twice does nothing."""

    def __init__(self, environ: MutableMapping[str, str] = os.environ) -> None:
        self.environ = environ
        self._before: dict[str, str | None] = {}
        self._set: dict[str, str] = {}

    def set(self, values: Mapping[str, str]) -> None:
        for key in values:
            self._before.setdefault(key, self.environ.get(key))
        self._set.update(values)
        self.environ.update(values)

    def restore(self) -> None:
        before, ours, self._before, self._set = self._before, self._set, {}, {}
        for key, value in before.items():
            now = self.environ.get(key)
            if now != ours.get(key):  # changed by the cell meanwhile: its value stays
                if now is None:
                    continue
                added = set(ours.get(key, "").split(os.pathsep)) - set((value or "").split(os.pathsep))
                value = os.pathsep.join(p for p in now.split(os.pathsep) if p not in added) or None
            if value is None:
                self.environ.pop(key, None)
            else:
                self.environ[key] = value


__all__ = ["EnvironPatch"]
