"""Who may read a store: its owner, unless the directory is shared on purpose.

Runs in any process (core).

On a shared JupyterHub node other users must not read your runs (names, settings, devices).
A store directory the profiler creates is 0700 and its files 0600. In a directory that already
exists, what the profiler creates takes that directory's *group* bits: a team directory
shared on purpose (e.g. 2770: setgid, group-writable) stays shared, experiment directories
2770 and files 0660, so teammates read and add runs. Bits for "other" users are never given.
Modes are set explicitly (``chmod`` after creating), so the umask, which would strip the
group's write bit, does not undo a team directory's sharing.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def dir_mode(parent: Path) -> int:
    """Mode for a directory made in ``parent``: owner rwx plus ``parent``'s group bits (and setgid)."""
    st = os.stat(parent)
    return PRIVATE_DIR | (st.st_mode & (0o070 | stat.S_ISGID))


def file_mode(parent: Path) -> int:
    """Mode for a file made in ``parent``: owner rw plus ``parent``'s group read/write bits."""
    return PRIVATE_FILE | (os.stat(parent).st_mode & 0o060)


def make_store_root(root: Path) -> None:
    """Create the store directory 0700 if it does not exist; an existing one is left as it is."""
    if root.is_dir():
        return
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        root.mkdir(mode=PRIVATE_DIR)
    except FileExistsError:  # another kernel made it at the same moment: theirs stands
        return
    os.chmod(root, PRIVATE_DIR)


def make_dir(path: Path) -> None:
    """Create ``path`` (FileExistsError if it exists) with ``dir_mode`` of its parent."""
    mode = dir_mode(path.parent)
    path.mkdir(mode=PRIVATE_DIR)
    os.chmod(path, mode)


def open_new_file(path: Path, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> int:
    """``os.open`` a file for writing with ``file_mode`` of its directory; returns the descriptor."""
    mode = file_mode(path.parent)
    fd = os.open(path, flags, PRIVATE_FILE)
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd
