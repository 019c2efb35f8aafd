"""The store's listing index: one entry per experiment directory, a cache of its ``meta.json``.

Runs in whichever process lists a store (the kernel's ``experiments()``, ``gpuprof list``, the
Jupyter server). Listing 10,000 experiments by parsing every ``meta.json`` takes seconds; the
index keeps what a listing needs (name, start, status, the listing row) in ``.index.sqlite``
in the store, SQLite in WAL mode, so readers never wait for a writer and two processes
refreshing it at once both succeed (an entry is written whole, in one transaction).

An entry is only a cache, never trusted over ``meta.json``: it is used while its ``meta.json``
has the identity it was read at (inode, size, modification and change times: a rewrite, which
is a rename, changes them). Each refresh lists the store's directories and stats each
``meta.json``; a changed or new one is read again, an entry whose directory is gone is dropped.
A missing index is rebuilt; one that cannot be opened or written (a read-only store, a link, a
network file system that refuses its locks) is left alone and the listing works from
``meta.json`` and this process's memory. The file gets the store's modes (permissions.py).
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path

from gpuprof_jupyter.core.store.experiment import ExperimentMeta
from gpuprof_jupyter.core.store.permissions import check_store_owner, create_in, open_directory

INDEX_NAME = ".index.sqlite"
META_NAME = "meta.json"
_VERSION = 2  # 2: the job a part belongs to
_FIELDS = ("name", "started_at", "status", "pid", "host", "problem", "job", "row")
# store root -> (the index file's identity, its entries), as last refreshed in this process
_CACHE: dict[str, tuple[tuple | None, dict[str, "Entry"]]] = {}
_CACHE_LOCK = threading.Lock()


@dataclass
class Entry:
    """One experiment directory as the index knows it. ``row``: the listing's row (JSON text,
    filled by ``core/listing.py``; None until then). ``problem``: why its ``meta.json`` could
    not be read (then the other fields are empty)."""

    id: str
    key: str
    name: str = ""
    started_at: str = ""
    status: str = ""
    pid: int | None = None
    host: str | None = None
    problem: str | None = None
    job: str | None = None  # the key of the multi-node job it is a part of (core/job_identity.job_key)
    row: str | None = None
    parsed: dict | None = field(default=None, compare=False, repr=False)  # ``row`` parsed, in memory only

    @classmethod
    def of_meta(cls, directory_name: str, key: str, meta: ExperimentMeta) -> "Entry":
        job = meta.context.get("job")
        return cls(directory_name, key, meta.name, meta.started_at or "", meta.status, meta.pid, meta.host,
                   job=job.get("key") if isinstance(job, dict) and isinstance(job.get("key"), str) else None)

    def values(self) -> tuple:
        return (self.id, self.key, *(getattr(self, f) for f in _FIELDS))


def read_meta(path: Path) -> ExperimentMeta:
    """A ``meta.json`` parsed (ValueError, TypeError or OSError when it is not one)."""
    with open(path, encoding="utf-8") as f:
        return ExperimentMeta.from_json(json.load(f))


class StoreIndex:
    """The index of one store root. ``refresh()`` checks it against the directories;
    ``save()`` writes the entries a caller changed (rows it filled)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.path = self.root / INDEX_NAME
        self._cache_key = os.path.realpath(self.root)
        self.usable = True  # False once the file proved unusable: memory only from then on

    # -- refreshing ---------------------------------------------------------------------------
    def refresh(self, check=None) -> tuple[list[Entry], list[str]]:
        """Every experiment directory's entry, checked against its ``meta.json`` now (rows not
        loaded from the file: ``stored_rows``), and the problems met: an unreadable
        ``meta.json``, or what ``check(directory, meta)`` finds wrong with one (the store's
        rule: ``directory.experiment_problem``). Changes are saved to the index."""
        known, unsaved = self._known()
        entries, problems, changed = [], [], []
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return [], []
        try:
            for item in os.scandir(fd):
                name = item.name
                if name[0] == ".":
                    continue
                try:
                    st = os.stat(f"{name}/{META_NAME}", dir_fd=fd)
                except OSError:
                    continue  # not an experiment directory (or one being created)
                key = f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"  # this version's identity
                entry = known.get(name)
                if entry is None or entry.key != key:
                    entry = self._read(name, key, check)
                    changed.append(entry)
                elif name in unsaved:
                    changed.append(entry)
                entries.append(entry)
                if entry.problem:
                    problems.append(entry.problem)
        finally:
            os.close(fd)
        gone = [name for name in known.keys() - {e.id for e in entries}]
        if changed or gone:
            self._write(changed, gone)
        self._remember(entries)
        return entries, problems

    def stored_rows(self, fields: tuple[str, ...] | None = None) -> dict[str, tuple[str, object]]:
        """id -> (key, row text) of the rows in the index file (read only when this process
        lacks rows: a fresh process); with ``fields``, (key, tuple of those fields' values)
        instead, extracted by SQLite without parsing the rest."""
        db = self._connect(create=False)
        if db is None:
            return {}
        try:
            if fields is None:
                return {r[0]: (r[1], r[2]) for r in db.execute("SELECT id, key, row FROM entries WHERE row IS NOT NULL")}
            picks = ", ".join(f"json_extract(row, '$.\"{f}\"')" for f in fields)
            return {r[0]: (r[1], r[2:]) for r in db.execute(f"SELECT id, key, {picks} FROM entries WHERE row IS NOT NULL")}
        except sqlite3.Error:
            return {}
        finally:
            db.close()

    def _read(self, name: str, key: str, check) -> Entry:
        path = self.root / name / META_NAME
        try:
            meta = read_meta(path)
        except (ValueError, TypeError, OSError) as exc:
            return Entry(name, key, problem=f"skipped {name}/{META_NAME}: not a readable experiment ({_short(exc)})")
        problem = check(self.root / name, meta) if check is not None else None
        if problem:
            return Entry(name, key, problem=f"skipped {name}: {problem}")
        return Entry.of_meta(name, key, meta)

    def save(self, entries: list[Entry]) -> None:
        """Write entries whose rows the caller filled (kept in memory too)."""
        if entries:
            self._write(entries, [])
            with _CACHE_LOCK:
                _, cached = _CACHE.get(self._cache_key, (None, {}))
                _CACHE[self._cache_key] = (self._identity(), {**cached, **{e.id: e for e in entries}})

    # -- memory and file ----------------------------------------------------------------------
    def _known(self) -> tuple[dict[str, Entry], set[str]]:
        """The entries known before this refresh, and those of them the file lacks: this
        process's memory while the file is the one it last saw, else the file's entries (plus
        the memory's, to be written back: the file was deleted or replaced)."""
        with _CACHE_LOCK:
            identity, cached = _CACHE.get(self._cache_key, (None, None))
        if cached is not None and identity == self._identity():
            return dict(cached), set()
        stored = self._load()
        unsaved = set(cached or {}) - set(stored)
        return {**(cached or {}), **stored}, unsaved

    def _remember(self, entries: list[Entry]) -> None:
        with _CACHE_LOCK:
            _CACHE[self._cache_key] = (self._identity(), {e.id: e for e in entries})

    def _identity(self) -> tuple | None:
        try:
            st = os.lstat(self.path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _load(self) -> dict[str, Entry]:
        db = self._connect(create=False)
        if db is None:
            return {}
        try:
            fields = ", ".join(f for f in _FIELDS if f != "row")  # rows: read when needed (stored_rows)
            return {r[0]: Entry(*r) for r in db.execute(f"SELECT id, key, {fields} FROM entries")}
        except sqlite3.Error:
            return {}
        finally:
            db.close()

    def _write(self, changed: list[Entry], gone: list[str]) -> None:
        db = self._connect(create=True)
        if db is None:
            return
        try:
            with db:
                db.executemany(f"INSERT OR REPLACE INTO entries (id, key, {', '.join(_FIELDS)}) "
                               f"VALUES ({', '.join('?' * (2 + len(_FIELDS)))})", [e.values() for e in changed])
                db.executemany("DELETE FROM entries WHERE id = ?", [(name,) for name in gone])
        except sqlite3.OperationalError:
            pass  # busy past the timeout, or read-only: the next refresh writes it
        except sqlite3.DatabaseError:
            self._discard()
        finally:
            db.close()

    def _connect(self, create: bool) -> sqlite3.Connection | None:
        """The index open (created with the store's modes when ``create``), or None when it is
        missing and not to be created, not a plain file, or unusable."""
        if not self.usable:
            return None
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            if not create or not self.root.is_dir():
                return None
            try:
                check_store_owner(self.root)  # ours, or a group store of ours: else never written
                with open_directory(self.root, follow=True) as root_fd:
                    os.close(create_in(root_fd, INDEX_NAME, os.O_RDWR))  # never through a link
            except FileExistsError:
                pass  # another process made it at the same moment
            except OSError:  # UnsafeStore included
                self.usable = False
                return None
            return self._connect(create=False)
        if not stat.S_ISREG(st.st_mode) or any(os.path.islink(f"{self.path}{s}") for s in ("-wal", "-shm")):
            self.usable = False  # a link or a FIFO where the index should be: never opened
            return None
        db = None
        try:
            db = sqlite3.connect(self.path, timeout=2.0, check_same_thread=False)  # writes: ``with db:`` transactions
            db.execute("PRAGMA synchronous=NORMAL")  # WAL: no fsync per commit; a crash loses at most the last rows of a cache
            if db.execute("PRAGMA user_version").fetchone()[0] != _VERSION:
                self._create_schema(db)
            return db
        except sqlite3.Error as exc:
            if db is not None:
                db.close()
            if isinstance(exc, sqlite3.OperationalError):
                self.usable = False  # busy past the timeout, read-only, no locks: not this time
            else:
                self._discard()  # not a database (damaged): made again next time
            return None

    @staticmethod
    def _create_schema(db: sqlite3.Connection) -> None:
        """Create the table (again, after a version change), once: two processes creating the
        index at the same moment check the version again under the write lock."""
        db.execute("PRAGMA journal_mode=WAL")
        db.isolation_level = None  # explicit transaction below
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                if db.execute("PRAGMA user_version").fetchone()[0] != _VERSION:
                    db.execute("DROP TABLE IF EXISTS entries")
                    db.execute(f"CREATE TABLE entries (id TEXT PRIMARY KEY, key TEXT NOT NULL, "
                               f"{', '.join(f + ' TEXT' for f in _FIELDS if f != 'pid')}, pid INTEGER)")
                    db.execute(f"PRAGMA user_version = {_VERSION}")
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        finally:
            db.isolation_level = ""

    def _discard(self) -> None:
        """A damaged index file is removed (it is rebuilt from the directories next time)."""
        for suffix in ("", "-wal", "-shm"):
            try:
                os.unlink(f"{self.path}{suffix}")
            except OSError:
                pass


def forget(root: Path) -> None:
    """Drop this process's memory of a store's index (tests; a store deleted and made again)."""
    with _CACHE_LOCK:
        _CACHE.pop(os.path.realpath(root), None)


def _short(exc: BaseException) -> str:
    """An error's text without the file path an OSError carries (answers name no absolute path)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)
