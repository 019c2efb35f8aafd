"""Who may read a store, and how files are made in one another user can write to (any process
that writes a store: the sampler process, the kernel, the CLI).

Runs in any process (core).

On a shared JupyterHub node other users must not read your runs (names, settings, devices).
A store directory the profiler creates is 0700 and its files 0600. In a directory that already
exists, what the profiler creates takes that directory's *group* bits: a team directory
shared on purpose (e.g. 2770: setgid, group-writable) stays shared, experiment directories
2770 and files 0660, so teammates read and add runs. Bits for "other" users are never given.
Modes are set explicitly (``fchmod`` after creating), so the umask, which would strip the
group's write bit, does not undo a team directory's sharing.

A teammate can write in a team store too, so nothing here trusts a name in it: files are
created relative to a handle on their directory, must not exist yet (``O_EXCL``) and are never
reached through a link (``O_NOFOLLOW``); an existing store is used only when it is ours or a
group store of one of our groups (``check_store_owner``). docs/store.md says what this
protects and what it does not.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from contextlib import contextmanager
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
NEW_FILE = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC  # fail if it exists, never follow a link
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class UnsafeStore(PermissionError):
    """The store, or a file in it, is not what the profiler made: refused, nothing written."""


def dir_mode(parent_mode: int) -> int:
    """Mode for a directory made in a directory of mode ``parent_mode``: owner rwx plus its
    group bits (and setgid)."""
    return PRIVATE_DIR | (parent_mode & (0o070 | stat.S_ISGID))


def file_mode(parent_mode: int) -> int:
    """Mode for a file made in a directory of mode ``parent_mode``: owner rw plus its group
    read/write bits."""
    return PRIVATE_FILE | (parent_mode & 0o060)


@contextmanager
def open_directory(path: Path, follow: bool = False):
    """A handle on directory ``path``. ``follow``: the last component may be a link (the store
    root the user named); an experiment directory never is (``O_NOFOLLOW``)."""
    fd = os.open(path, _DIRECTORY | (0 if follow else os.O_NOFOLLOW))
    try:
        yield fd
    finally:
        os.close(fd)


def handle_path(fd: int, fallback: Path) -> Path:
    """A path that reaches the directory held by ``fd`` whatever is renamed or linked meanwhile
    (``/proc/self/fd/N`` on Linux), for libraries that open files by name; ``fallback`` where
    there is no /proc."""
    path = Path(f"/proc/self/fd/{fd}")
    return path if path.is_dir() else fallback


def create_in(dir_fd: int, name: str, flags: int = os.O_WRONLY) -> int:
    """Create file ``name`` in the directory ``dir_fd`` (FileExistsError if anything, a link
    included, is there already), mode ``file_mode`` of that directory; returns the descriptor."""
    fd = os.open(name, flags | NEW_FILE, PRIVATE_FILE, dir_fd=dir_fd)
    try:
        os.fchmod(fd, file_mode(os.fstat(dir_fd).st_mode))
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_file(directory: Path, name: str, flags: int = os.O_WRONLY) -> int:
    """``create_in`` the experiment directory ``directory`` (itself not reached through a link)."""
    with open_directory(directory) as dir_fd:
        return create_in(dir_fd, name, flags)


def open_regular(dir_fd: int, name: str, flags: int = os.O_RDONLY) -> int:
    """Open an existing ``name`` in ``dir_fd`` without following a link and without blocking (a
    FIFO planted there returns at once); UnsafeStore unless it is a regular file."""
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeStore(f"{name} in the store is a link (someone else made it): refused") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeStore(f"{name} in the store is not a regular file (someone else made it): refused")
    return fd


def make_store_root(root: Path) -> None:
    """Create the store directory 0700 if it does not exist; an existing one must pass
    ``check_store_owner``."""
    if not os.path.lexists(root):
        root.parent.mkdir(parents=True, exist_ok=True)
        try:
            root.mkdir(mode=PRIVATE_DIR)
            os.chmod(root, PRIVATE_DIR)
        except FileExistsError:  # another kernel made it at the same moment: theirs stands
            pass
    check_store_owner(root)


def check_store_owner(root: Path) -> None:
    """Refuse (UnsafeStore) a store, or the directory a link leads to, that is not ours, unless
    it is a group store: setgid, group-writable, of a group we are in (docs/store.md)."""
    st = os.stat(root)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeStore(f"the store {root} is not a directory")
    if st.st_uid == os.geteuid():
        return
    group_store = st.st_mode & stat.S_ISGID and st.st_mode & 0o070 == 0o070
    if group_store and (st.st_gid == os.getegid() or st.st_gid in os.getgroups()):
        return
    raise UnsafeStore(
        f"the store {root} belongs to {_user_name(st.st_uid)}, not to you, and is not a group store of one "
        f"of your groups (setgid, group rwx: see docs/store.md); refused, nothing written. "
        f"Use a store of your own (--store DIR or GPUPROF_STORE).")


def _user_name(uid: int) -> str:
    try:
        return f"user {pwd.getpwuid(uid).pw_name!r}"
    except KeyError:
        return f"uid {uid}"


def make_dir(parent_fd: int, name: str) -> None:
    """Create directory ``name`` in ``parent_fd`` (FileExistsError if it exists) with
    ``dir_mode`` of its parent, the mode set on a handle (never through a link)."""
    os.mkdir(name, PRIVATE_DIR, dir_fd=parent_fd)
    fd = os.open(name, _DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
    try:
        os.fchmod(fd, dir_mode(os.fstat(parent_fd).st_mode))
    finally:
        os.close(fd)
