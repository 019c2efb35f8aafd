"""Atomic file writes: a reader sees the old file or the new one, never half of either."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp_path)``, fsync it, then rename over ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        write(tmp_path)
        with open(tmp_path, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Atomic text write that keeps an existing file's permissions (new files: 0666 minus umask)."""
    path = Path(path)
    if path.exists():
        mode = path.stat().st_mode & 0o7777
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask

    def write(tmp: Path) -> None:
        tmp.write_text(text, encoding="utf-8")
        os.chmod(tmp, mode)

    write_atomic(path, write)


def write_json_atomic(path: Path, data) -> None:
    write_text_atomic(path, json.dumps(data, indent=1, default=_json_default, allow_nan=True))


def _json_default(value):
    """Numpy scalars and other odd values: numbers stay numbers, the rest becomes text."""
    if hasattr(value, "item"):
        return value.item()
    return repr(value)
