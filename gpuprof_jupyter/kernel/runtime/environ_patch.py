"""Variables set in ``os.environ`` while a run lasts, then put back as they were.

Runs in the kernel (or the profiled script).

Only the keys set here are put back: what the user's code changed in ``os.environ`` meanwhile
stays (``unittest.mock.patch.dict`` would restore the whole mapping, undoing it).
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

    def set(self, values: Mapping[str, str]) -> None:
        for key in values:
            self._before.setdefault(key, self.environ.get(key))
        self.environ.update(values)

    def restore(self) -> None:
        before, self._before = self._before, {}
        for key, value in before.items():
            if value is None:
                self.environ.pop(key, None)
            else:
                self.environ[key] = value


__all__ = ["EnvironPatch"]
