"""Atomic file writes: a reader sees the old file or the new one, never half of either.

Runs in any process (core).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable

from gpuprof_jupyter.core.store.permissions import file_mode


def write_atomic(path: Path, write: Callable[[Path], None], mode: int | None = None) -> None:
    """Call ``write(tmp_path)``, fsync it, then rename over ``path``. The file gets ``mode``,
    by default 0600 plus its directory's group bits (permissions.py: a store's files)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        write(tmp_path)
        os.chmod(tmp_path, file_mode(path.parent) if mode is None else mode)
        with open(tmp_path, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Atomic write of a file the user asked for (a report, pipeline.yaml): it keeps an existing
    file's permissions; a new one gets 0666 minus the umask, as any editor would make it."""
    path = Path(path)
    if path.exists():
        mode = path.stat().st_mode & 0o7777
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), mode)


def write_json_atomic(path: Path, data) -> None:
    """Atomic JSON write of a store file (its mode follows the directory: permissions.py)."""
    text = json.dumps(data, indent=1, default=_json_default, allow_nan=True)
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _json_default(value):
    """Numpy scalars and other odd values: numbers stay numbers, the rest becomes text."""
    if hasattr(value, "item"):
        return value.item()
    return repr(value)
