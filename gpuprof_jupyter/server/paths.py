"""Store and output paths from a request, kept under the server's root directory.

Runs in the Jupyter server.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath


class PathRefused(ValueError):
    """A path from a request that is not allowed; ``status`` is the HTTP status to answer."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def resolve_under_root(root: str | os.PathLike, relpath: str | None, default: str) -> Path:
    """``relpath`` (``/``-separated, relative to ``root``; empty: ``default``) as a real path under ``root``.

    Refused: an absolute path or a drive (400), a ``..`` component or a path whose real
    location (symlinks followed) leaves ``root`` (403). The path need not exist.
    """
    text = (relpath if relpath not in (None, "") else default).strip()
    if "\x00" in text:
        raise PathRefused("path contains a NUL byte", 400)
    pure = PurePosixPath(text.replace("\\", "/"))
    if pure.is_absolute() or (pure.parts and ":" in pure.parts[0]):
        raise PathRefused(f"{text!r}: give a path relative to the server's root, not an absolute one", 400)
    if ".." in pure.parts:
        raise PathRefused(f"{text!r}: '..' is not allowed (paths stay under the server's root)", 403)
    real_root = Path(os.path.realpath(root))
    real = Path(os.path.realpath(real_root.joinpath(*pure.parts)))
    if real != real_root and real_root not in real.parents:
        raise PathRefused(f"{text!r} leaves the server's root (a symlink out?)", 403)
    return real


def relative_to_root(root: str | os.PathLike, path: Path) -> str:
    """``path`` as the front end names it: ``/``-separated, relative to the root."""
    return Path(path).relative_to(os.path.realpath(root)).as_posix()
