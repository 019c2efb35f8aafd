"""Bokeh documents serialised once per plot structure, kept in memory and on disk.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

Building the plots' ~1,000 Bokeh models and serialising them takes 0.3-0.6 s, and importing
Bokeh 0.5-1 s more: the first profiled cell of every kernel paid both, for the live view and
again for the static ending. The JSON depends only on the plot structure, Bokeh's version and
this package's figure code, so it is kept in the user's cache directory
(``$XDG_CACHE_HOME/gpuprof_jupyter/bokeh``, by default ``~/.cache/...``) under a hash of all
three, and a later kernel reads it without importing Bokeh. A cache directory that cannot be
read or written only means building in memory, as before.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path
from typing import Callable

_MEMORY: "OrderedDict[str, str]" = OrderedDict()
_MEMORY_MAX = 16
_CODE = ("figures.py", "bokeh_json.py", "static_plots.py", "bokeh_templates.py",  # what shapes the JSON,
         "../notebook/live/document.py", "../core/plots/spec.py")  # relative to this folder; spec.py: frame sizes and colours


@lru_cache(maxsize=1)
def _fingerprint() -> str:
    from importlib.metadata import version

    digest = hashlib.sha256(version("bokeh").encode())
    here = Path(__file__).parent
    for name in _CODE:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpuprof_jupyter" / "bokeh"


def cached_json(kind: str, key: str, build: Callable[[], str]) -> str:
    """The text ``build()`` returns for ``(kind, key)``: from memory, else from the cache
    directory, else built (and stored in both)."""
    name = f"{kind}-{hashlib.sha256(f'{_fingerprint()}|{key}'.encode()).hexdigest()[:24]}.json"
    text = _MEMORY.get(name)
    if text is not None:
        _MEMORY.move_to_end(name)
        return text
    path = cache_dir() / name
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        text = build()
        _store(path, text)
    _MEMORY[name] = text
    while len(_MEMORY) > _MEMORY_MAX:
        _MEMORY.popitem(last=False)
    return text


def _store(path: Path, text: str) -> None:
    from gpuprof_jupyter.core.store.atomic import write_text_atomic

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, text)
    except OSError:
        pass  # a read-only home: built again by the next kernel


__all__ = ["cached_json", "cache_dir"]
