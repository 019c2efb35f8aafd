"""The experiment store: one directory per experiment under a store root.

Runs in any process (core).

Layout::

    .gpuprof/                      (default; --store DIR or GPUPROF_STORE)
      .lock                        fcntl lock taken while allocating names
      .index.sqlite                the listing's index: a cache of each meta.json (index.py)
      20261129T150312-3fa9c1/
        meta.json                  ExperimentMeta, rewritten atomically
        samples.arrows             while recording (crash-safe stream)
        samples.parquet            once finished: one device per row group (samples_file.py)
        steps.parquet
        trace.json.gz              torch.profiler's trace of a --trace window (if any), capped

Each kernel writes only its own experiment directories, so two kernels sharing a store never
write the same file; default names are allocated under the lock so they stay unique. Who may
read it: a store the profiler creates is private (0700, files 0600); a directory that existed
already passes its group bits on (permissions.py). An existing store is written only when it
is ours or a group store of one of our groups, and files are created without following links
(docs/store.md). A corrupt file is reported (``Store.problems`` and a warning) and skipped,
never fatal; so is an experiment whose ``meta.json`` id is not its directory's name.
Used by every process that reads or writes a store.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import shutil
import socket
import stat
import time
import warnings
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from gpuprof_jupyter.core.store.atomic import write_atomic, write_json_atomic
from gpuprof_jupyter.core.store.experiment import Experiment, ExperimentMeta, RunStatus
from gpuprof_jupyter.core.store.index import META_NAME, Entry, StoreIndex, read_meta
from gpuprof_jupyter.core.store.keep_more import refuse_fewer_rows
from gpuprof_jupyter.core.store.permissions import (check_store_owner, create_in, make_dir, make_store_root,
                                                    open_directory, open_regular)
from gpuprof_jupyter.core.format import fmt_unit

STEPS_NAME = "steps.parquet"
REQUESTS_NAME = "requests.parquet"  # serving requests (core/finish.py REQUEST_FIELDS); absent: none
TRACE_NAME = "trace.json.gz"
DEFAULT_DIR = ".gpuprof"
LOCK_NAME = ".lock"
LOCK_TIMEOUT_S = 30.0
_DEFAULT_NAME = re.compile(r"^run-(\d+)$")


class StoreProblem(UserWarning):
    """A file in the store could not be read; it was skipped."""


def default_store_path() -> Path:
    """GPUPROF_STORE, else the config file's ``store``, else ``.gpuprof`` in the working directory."""
    from gpuprof_jupyter.core.config import load_config

    return Path(load_config().store or DEFAULT_DIR)


class Store:
    def __init__(self, root: str | os.PathLike | None = None) -> None:
        self.root = Path(root) if root is not None else default_store_path()
        self.problems: list[str] = []

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    # -- writing ----------------------------------------------------------------------------
    @contextmanager
    def _locked(self, timeout_s: float = LOCK_TIMEOUT_S):
        """A handle on the store root (ours, or a group store of ours: permissions.py) and an
        exclusive ``flock`` on its ``.lock`` (kernels on this host and, on most network file
        systems, others). ``.lock`` is never followed through a link, never blocks on open (a
        FIFO planted there is refused) and must be a regular file; it is opened read-only
        (``flock`` needs no write access to a teammate's). A lock held longer than
        ``timeout_s`` raises TimeoutError rather than hanging the cell."""
        make_store_root(self.root)
        with open_directory(self.root, follow=True) as root_fd:
            try:
                fd = create_in(root_fd, LOCK_NAME, os.O_RDONLY)
            except FileExistsError:
                fd = open_regular(root_fd, LOCK_NAME)
            try:
                deadline = time.monotonic() + timeout_s
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"the store's {LOCK_NAME} in {self.root} was held by another "
                                               f"process for {fmt_unit(timeout_s, 's')}") from None
                        time.sleep(0.01)
                yield root_fd
            finally:
                os.close(fd)  # releases the lock

    locked = _locked

    def create(self, meta: ExperimentMeta) -> Path:
        """Give ``meta`` an id (and a default name if empty), make its directory, save it.

        Under the store's lock, so two kernels creating at once get distinct default names; the
        id's directory is made exclusively (``mkdir`` fails if it exists), so an id is never
        shared either: a clash of the random part draws again.

        A named part of a multi-node job (``context["job"]``) takes no lock and reads no index:
        its agents may share the store over a network file system that has no working ``flock``
        (Lustre without ``-o flock``), and its exclusive ``mkdir`` alone keeps its id its own."""
        if meta.name and meta.context.get("job"):
            make_store_root(self.root)
            with open_directory(self.root, follow=True) as root_fd:
                return self._make(meta, root_fd)
        with self._locked() as root_fd:
            if not meta.name:
                meta.name = self._next_default_name()
            return self._make(meta, root_fd)

    def _make(self, meta: ExperimentMeta, root_fd: int) -> Path:
        """The experiment's directory, made exclusively under a fresh id, and its ``meta.json``."""
        now = datetime.now(timezone.utc)
        meta.pid, meta.host = os.getpid(), socket.gethostname()
        while True:
            meta.id = f"{now:%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"
            directory = self.root / meta.id
            try:
                make_dir(root_fd, meta.id)
                break
            except FileExistsError:
                continue
        self.save_meta(meta)
        return directory

    def _next_default_name(self) -> str:
        highest = 0
        for entry in StoreIndex(self.root).refresh(experiment_problem)[0]:
            match = _DEFAULT_NAME.match(entry.name)
            if match:
                highest = max(highest, int(match.group(1)))
        return f"run-{highest + 1}"

    def directory(self, meta: ExperimentMeta) -> Path:
        """The experiment's directory: a direct child of the store named by its id (ValueError
        for an id that is not a plain name: a path, '..', a hidden name)."""
        if not _plain_name(meta.id):
            raise ValueError(f"experiment id {meta.id!r} is not a plain directory name")
        return self.root / meta.id

    def save_meta(self, meta: ExperimentMeta) -> None:
        write_json_atomic(self.directory(meta) / META_NAME, meta.to_json())

    def save_steps(self, meta: ExperimentMeta, steps_table) -> None:
        """Write ``steps.parquet`` (WouldShrink, nothing written, when the one there holds more
        rows: keep_more.py)."""
        import pyarrow.parquet as pq

        refuse_fewer_rows(self.directory(meta) / STEPS_NAME, steps_table.num_rows)
        write_atomic(self.directory(meta) / STEPS_NAME, lambda f: pq.write_table(steps_table, f))

    def save_requests(self, meta: ExperimentMeta, requests_table) -> None:
        import pyarrow.parquet as pq

        write_atomic(self.directory(meta) / REQUESTS_NAME, lambda f: pq.write_table(requests_table, f))

    def save_trace(self, meta: ExperimentMeta, trace: dict, name: str = TRACE_NAME) -> str:
        """Write a torch.profiler Chrome trace (a dict) gzipped beside the samples; its file name
        (``name``: another rank's, ``trace-rank1.json.gz``)."""
        import gzip

        def write(out) -> None:
            with gzip.open(out, "wt", encoding="utf-8", compresslevel=5) as f:
                json.dump(trace, f, separators=(",", ":"))

        write_atomic(self.directory(meta) / name, write)
        return name

    # -- reading ----------------------------------------------------------------------------
    def entries(self) -> list[Entry]:
        """Every readable experiment's index entry (index.py: checked against each ``meta.json``
        now, none read unless it changed), oldest first; unreadable ones reported and skipped.
        Statuses as on disk: a ``running`` one may have a dead writer (``writer_alive``). Shared
        with later calls: read them, never change them."""
        entries, problems = StoreIndex(self.root).refresh(experiment_problem)
        for message in problems:
            self._report(message)
        entries = [e for e in entries if not e.problem]
        entries.sort(key=lambda e: (e.started_at, e.id))
        return entries

    def read_meta(self, experiment_id: str) -> ExperimentMeta:
        """One experiment's ``meta.json``, read now (KeyError when there is none, or when it is
        not a valid experiment: ``experiment_problem``)."""
        if not _plain_name(experiment_id):
            raise KeyError(f"{experiment_id!r} is not an experiment id")
        try:
            meta = read_meta(self.root / experiment_id / META_NAME)
        except (ValueError, TypeError, OSError) as exc:
            raise KeyError(f"experiment {experiment_id!r} is not readable in this store") from exc
        problem = experiment_problem(self.root / experiment_id, meta)
        if problem:
            raise KeyError(f"experiment {experiment_id!r}: {problem}")
        if meta.status == RunStatus.RUNNING and not writer_alive(meta):
            meta.status = RunStatus.CRASHED
        return meta

    def latest(self) -> ExperimentMeta | None:
        """The most recently started experiment (its ``meta.json`` read), None when there is none."""
        entries = self.entries()
        return self.read_meta(entries[-1].id) if entries else None

    def _scan(self, report: bool = True) -> list[ExperimentMeta]:
        metas = []
        for entry in self.entries():
            try:
                metas.append(self.read_meta(entry.id))
            except KeyError:
                continue  # deleted since it was listed
        return metas

    def _report(self, message: str) -> None:
        """Kept in ``problems``; warned once per process (each call opens a new Store)."""
        if message not in self.problems:
            self.problems.append(message)
            if message not in _WARNED:
                _WARNED.add(message)
                warnings.warn(message, StoreProblem, stacklevel=3)

    def list(self) -> list[ExperimentMeta]:
        """Every readable experiment's metadata (each ``meta.json`` read), oldest first; corrupt
        ones reported and skipped. ``entries()`` lists without reading them."""
        return self._scan()

    def resolve(self, name_or_id: str, entries: list[Entry] | None = None) -> ExperimentMeta:
        """Latest experiment with this name, or the one with this id (or id prefix). Found through
        the index (``entries``: those of a listing just made); only the chosen experiment's
        ``meta.json`` is read."""
        entries = self.entries() if entries is None else entries
        by_name = [e for e in entries if e.name == name_or_id]
        by_id = by_name[-1:] or [e for e in entries if e.id == name_or_id or e.id.startswith(name_or_id)]
        if len(by_id) == 1:
            return self.read_meta(by_id[0].id)
        if len(by_id) > 1:
            raise KeyError(f"{name_or_id!r} matches several experiment ids: {', '.join(e.id for e in by_id)}")
        known = ", ".join(sorted({e.name for e in entries})) or "none"
        raise KeyError(f"no experiment named {name_or_id!r} in {self.root} (known: {known})")

    def load(self, name_or_id: str) -> Experiment:
        meta = self.resolve(name_or_id)
        return Experiment(meta, loader=_DirectoryLoader(self, meta))

    def load_meta(self, meta: ExperimentMeta, trace: dict | None = None) -> Experiment:
        """The experiment of ``meta``, read lazily; ``trace``: its --trace window, when the caller
        already holds it (not read back from the file just written)."""
        return Experiment(meta, loader=_DirectoryLoader(self, meta), trace=trace)

    def delete(self, name_or_id: str) -> ExperimentMeta:
        """Delete the latest experiment with this name (or this id): only ever a direct child
        of the store, itself a directory (not a link), whose ``meta.json`` names it."""
        meta = self.resolve(name_or_id)
        self.remove(meta)
        return meta

    def remove(self, meta: ExperimentMeta) -> None:
        """Delete ``meta``'s directory (also a run nobody kept: a cancelled begin). Only a direct
        child of the store, reached through the store's handle: a link planted by a teammate
        redirects nothing."""
        self.directory(meta)  # a plain name, or ValueError
        check_store_owner(self.root)
        with open_directory(self.root, follow=True) as root_fd:
            st = os.stat(meta.id, dir_fd=root_fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                raise ValueError(f"{meta.id} in {self.root} is not a directory: not deleted")
            trash = f".deleted-{meta.id}"
            os.rename(meta.id, trash, src_dir_fd=root_fd, dst_dir_fd=root_fd)  # atomic: seen or not, never half
            shutil.rmtree(trash, dir_fd=root_fd, ignore_errors=True)  # fd-based: follows no link


def _plain_name(name) -> bool:
    """A name that can only mean a direct child of a directory."""
    return isinstance(name, str) and bool(name) and "/" not in name and "\0" not in name and not name.startswith(".")


def experiment_problem(directory: Path, meta: ExperimentMeta) -> str | None:
    """Why ``directory`` (holding ``meta``) is not a valid experiment, or None: its id must be
    its own name, and it must be a directory, not a link to one (a teammate's hostile
    ``meta.json`` is never trusted as a path)."""
    if meta.id != directory.name:
        return f"its meta.json id {meta.id!r} is not the directory's name (not trusted)"
    if directory.is_symlink():
        return "it is a link, not a directory of the store (not trusted)"
    return None


_WARNED: set[str] = set()  # problems already warned about in this process


class _DirectoryLoader:
    def __init__(self, store: Store, meta: ExperimentMeta) -> None:
        self.store, self.meta = store, meta

    def _read(self, read, default):
        """``read(SamplesFile)``; a corrupt file is reported once and reads as ``default``."""
        import pyarrow as pa

        from gpuprof_jupyter.core.store.samples_file import SamplesFile  # pyarrow: lazily (%load_ext stays fast)

        directory = self.store.directory(self.meta)
        try:
            return read(self._samples_file(directory, SamplesFile))
        except (pa.ArrowInvalid, OSError) as exc:
            self.store._report(f"samples of {self.meta.name!r} ({self.meta.id}) are unreadable: {exc}")
            return default

    def _samples_file(self, directory, cls):
        """One SamplesFile (footer parsed once) while the finished file stays the same."""
        try:
            st = os.stat(directory / cls(directory).parquet.name)
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            return cls(directory)  # still recording (the stream grows) or no samples
        if getattr(self, "_file_key", None) != key:
            self._file, self._file_key = cls(directory), key
        return self._file

    def samples(self):
        from gpuprof_jupyter.core.store.experiment import _empty_samples

        table = self._read(lambda f: f.read_all(), None)
        return _empty_samples() if table is None else table.to_pandas()

    def sample_devices(self) -> list[str]:
        return self._read(lambda f: f.devices(), [])

    def sample_columns(self, with_values: bool = False) -> list[str]:
        return self._read(lambda f: f.present() if with_values else f.columns(), [])

    def device_columns(self, device: str, columns=None):
        import numpy as np

        from gpuprof_jupyter.core.store.columns import Columns

        arrays = self._read(lambda f: f.read_device_arrays(device, columns), None)
        return Columns({"t": np.zeros(0)} if arrays is None else arrays)

    def step_columns(self):
        from gpuprof_jupyter.core.store.experiment import _empty_steps

        return self._table_columns(STEPS_NAME, "steps", _empty_steps)

    def request_columns(self):
        from gpuprof_jupyter.core.store.experiment import _empty_requests

        return self._table_columns(REQUESTS_NAME, "requests", _empty_requests)

    def _table_columns(self, name: str, what: str, empty):
        import pyarrow as pa
        import pyarrow.parquet as pq

        from gpuprof_jupyter.core.store.columns import Columns

        path = self.store.directory(self.meta) / name
        if not path.exists():
            return empty()
        try:
            with pq.ParquetFile(path) as f:  # not pq.read_table: that imports pandas
                return Columns.of_table(f.read(use_threads=False))
        except (pa.ArrowInvalid, OSError) as exc:
            self.store._report(f"{what} of {self.meta.name!r} ({self.meta.id}/{path.name}) are unreadable: {exc}")
            return empty()


    def trace(self, name: str | None = None):
        """The saved trace (a dict; ``name``: that file, another rank's), or None when missing
        or unreadable (reported)."""
        import gzip

        path = self.store.directory(self.meta) / (name or self.meta.trace.get("file") or TRACE_NAME)
        try:
            with gzip.open(path, "rt", encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError, EOFError) as exc:
            self.store._report(f"trace of {self.meta.name!r} ({self.meta.id}/{path.name}) is unreadable: {exc}")
            return None


def writer_alive(meta: ExperimentMeta | Entry) -> bool:
    """Is the process recording this experiment (the sampler process that created it) still
    running? (other hosts: assume so)"""
    if meta.host != socket.gethostname() or not isinstance(meta.pid, int) or meta.pid <= 0:
        return True
    try:
        os.kill(meta.pid, 0)  # signal 0: only asks whether the process exists (as psutil.pid_exists)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it exists
    return True
