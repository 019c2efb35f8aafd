"""Store and output paths from a request, kept under the server's root directory.

Runs in the Jupyter server.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

_ABSOLUTE = re.compile(r"(?<![\w.~/-])/(?:[^\s'\"/:,;()]+/)*([^\s'\"/:,;()]+)")


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
    too_long = _too_long(real_root, pure.parts)
    if too_long:
        raise PathRefused(f"{text[:80]!r}{'...' if len(text) > 80 else ''}: {too_long}", 400)
    real = Path(os.path.realpath(real_root.joinpath(*pure.parts)))
    if real != real_root and real_root not in real.parents:
        raise PathRefused(f"{text!r} leaves the server's root (a symlink out?)", 403)
    return real


def _too_long(root: Path, parts) -> str:
    """Why a path cannot name a file on ``root``'s filesystem ("" when it can): a component over
    its name limit or a whole path over its path limit (the OS would answer ENAMETOOLONG later)."""
    try:
        name_max, path_max = os.pathconf(root, "PC_NAME_MAX"), os.pathconf(root, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    if any(len(os.fsencode(part)) > name_max for part in parts):
        return f"a path component is longer than this filesystem's {name_max} bytes"
    if len(os.fsencode(str(root.joinpath(*parts)))) >= path_max:
        return f"the path is longer than this filesystem's {path_max} bytes"
    return ""


def relative_to_root(root: str | os.PathLike, path: Path) -> str:
    """``path`` as the front end names it: ``/``-separated, relative to the root."""
    return Path(path).relative_to(os.path.realpath(root)).as_posix()


def scrub_paths(text: str, root: str | os.PathLike) -> str:
    """``text`` (an error, a store problem) as the browser may see it: paths under ``root``
    made relative to it, any other absolute path cut to its last component (``.../name``)."""
    real_root = os.path.realpath(root).rstrip("/")
    for prefix in {real_root, str(root).rstrip("/")}:
        if prefix:
            text = text.replace(prefix + "/", "").replace(prefix, ".")
    return _ABSOLUTE.sub(lambda m: f".../{m.group(1)}", text)
