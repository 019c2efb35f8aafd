"""Atomic file writes: a reader sees the old file or the new one, never half of either (any
process that writes a store or a report).

Runs in any process (core).

The temporary file is created beside the target relative to a handle on their directory,
exclusively and never through a link (permissions.py), and written through its descriptor: a
name planted in a shared store cannot redirect the write. The final rename replaces whatever
is at the target's name (a planted link included) without following it.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import BinaryIO, Callable

from gpuprof_jupyter.core.store.permissions import create_in, open_directory


def write_atomic(path: Path, write: Callable[[BinaryIO], None], mode: int | None = None,
                 follow_directory: bool = False) -> None:
    """Call ``write(binary_file)``, fsync it, then rename it over ``path``. The file gets
    ``mode``, by default 0600 plus its directory's group bits (permissions.py: a store's
    files). ``follow_directory``: ``path``'s directory may be reached through a link (a
    user's folder; an experiment directory never is)."""
    path = Path(path)
    with open_directory(path.parent, follow=follow_directory) as dir_fd:
        tmp = f".{path.name}.{secrets.token_hex(6)}.tmp"
        fd = create_in(dir_fd, tmp)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                if mode is not None:
                    os.fchmod(f.fileno(), mode)
                os.fsync(f.fileno())
            os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except OSError:
                pass
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
    write_atomic(path, lambda f: f.write(text.encode("utf-8")), mode, follow_directory=True)


def write_json_atomic(path: Path, data) -> None:
    """Atomic JSON write of a store file (its mode follows the directory: permissions.py)."""
    text = json.dumps(data, indent=1, default=_json_default, allow_nan=True)
    write_atomic(path, lambda f: f.write(text.encode("utf-8")))


def _json_default(value):
    """Numpy scalars and other odd values: numbers stay numbers, the rest becomes text."""
    if hasattr(value, "item"):
        return value.item()
    return repr(value)
