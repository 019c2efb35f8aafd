"""The experiment payloads of the ``experiments`` endpoints, built from the store through the
public api (``api.experiments``), the analysis (summaries, min/max decimation) and the store's
tail reader: no second copy of their logic here.

Runs in the Jupyter server.

A running experiment is followed through its crash-safe stream (``samples.arrows``, appended by
the kernel every couple of seconds): each call reads only the bytes after the offset the
caller (or this server's cache) already has, so a 12-hour run is never read again from the
start, and a page reload finds the server's decimated history ready.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import numpy as np

from gpuprof_jupyter.core.analysis.decimate import MinMaxHistory, minmax_decimate
from gpuprof_jupyter.core.analysis.summary import summary_of
from gpuprof_jupyter.core.analysis.table import COLUMNS, extra_columns, flat_record
from gpuprof_jupyter.core.crashed import finish_crashed
from gpuprof_jupyter.core.format import finite_or_none, json_safe
from gpuprof_jupyter.core.listing import finish_now, job_rows, store_listing
from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.core.store.experiment import ExperimentMeta, RunStatus
from gpuprof_jupyter.core.store.samples_file import STREAM_NAME, read_stream_tail

SERIES = {"gpu": ("sm_util", "mem_bw_util", "power_w", "gpu_mem_used_bytes"), "host": ("cpu_util",)}
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


_ROWS_JSON: dict[tuple[str, str], tuple[str, str]] = {}  # (store, id) -> (row's token, its JSON)
_ROWS_LOCK = threading.Lock()


class NotFound(LookupError):
    """No such experiment in this store."""


def _running(store: Store, meta: ExperimentMeta) -> bool:
    return meta.status == RunStatus.RUNNING and (store.directory(meta) / STREAM_NAME).exists()


class Finisher:
    """Finishes runs whose sampler process died (``core/crashed.py``) on one thread of its own,
    so that the poll which finds one (finishing a 6-hour run takes seconds) is not held: it lists
    the run as ``crashed`` meanwhile, and the polls after the finish list its figures. The thread
    starts a moment after that poll and runs at a lower priority, so the polls keep their pace."""

    START_AFTER_S = 0.5

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: set[tuple[str, str]] = set()
        self._pool = None

    def __call__(self, store: Store, ids: list[str]) -> bool:
        from concurrent.futures import ThreadPoolExecutor

        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="server-crashed-run")
            for experiment_id in ids:
                key = (str(store.root), experiment_id)
                if key not in self._pending:
                    self._pending.add(key)
                    self._pool.submit(self._finish, Store(store.root), experiment_id, key)
        return False

    def _finish(self, store: Store, experiment_id: str, key: tuple[str, str]) -> None:
        try:
            time.sleep(self.START_AFTER_S)  # the poll that found it answers first (they share the GIL)
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)  # Linux: this thread only
            except (AttributeError, OSError):
                pass
            finish_crashed(store, experiment_id)
        finally:
            with self._lock:
                self._pending.discard(key)

    def wait(self) -> None:
        """Wait for the finishes under way (tests, shutdown)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


def list_experiments(store: Store, unless: str | None = None, finish=None,
                     scrub=lambda text: text) -> tuple[str, str | None]:
    """The listing's version (``core/listing.py``: changes whenever a row does) and its JSON
    text, ``{"columns": [...], "rows": [{column: value}], "problems": [...]}``, oldest first
    (None when the version is ``unless``: the caller holds that one already).

    The columns of ``gpuprof_jupyter.experiments()`` (summary figures, params, logged metrics),
    then ``running``; a row lacks the params and metrics its run lacks. A multi-node job's parts
    are one row (``core/listing.job_rows``: ``id`` the job's key, ``parts``, ``part_ids``,
    ``running_ids``; those columns are listed where the store holds a job). A running experiment's
    figures are empty (None); its live series come from ``experiment_detail``. Each row's JSON
    is made once per version of that row. ``scrub``: applied to the problems' text.
    """
    listing = job_rows(store_listing(store, finish=finish or finish_now))  # a multi-node job: one row
    version = listing.version  # a hash of every row's token: once
    if version == unless:
        return version, None
    jobs = ["parts", "part_ids", "running_ids"] if any(row.get("parts") for row in listing.rows) else []
    columns = [*COLUMNS, *extra_columns(listing.rows), "running", *jobs]
    root = str(store.root)
    with _ROWS_LOCK:
        texts = []
        for row, token in zip(listing.rows, listing.tokens):
            key = (root, row["id"])
            cached = _ROWS_JSON.get(key)
            if cached is None or cached[0] != token:
                record = flat_record(row)
                cached = _ROWS_JSON[key] = (token, json.dumps(json_safe(record)))
            texts.append(cached[1])
    problems = json.dumps([scrub(p) for p in listing.problems])
    return version, f'{{"columns": {json.dumps(columns)}, "problems": {problems}, "rows": [{",".join(texts)}]}}'


def find(store: Store, experiment_id: str) -> ExperimentMeta:
    """The experiment with exactly this id (NotFound otherwise; names are not ids here): its
    own ``meta.json`` is read, no other."""
    if not _ID.match(experiment_id or ""):
        raise NotFound(f"{experiment_id!r} is not an experiment id")
    try:
        return store.read_meta(experiment_id)
    except KeyError as exc:
        if isinstance(exc.__cause__, (FileNotFoundError, NotADirectoryError)):
            raise NotFound(f"no experiment {experiment_id!r} in {store.root.name}") from None
        raise NotFound(exc.args[0]) from None


def load_listed(store: Store, experiment_id: str):
    """What a row of the listing names, whole (the report, the export): a multi-node job by its
    key (its parts read as one experiment, ``core/job.py``), else the experiment with this id."""
    from gpuprof_jupyter.core.job import load_job

    job = load_job(store, experiment_id) if _ID.match(experiment_id or "") else None
    return job if job is not None else store.load_meta(find(store, experiment_id))


def _columns_of(device: str, meta: ExperimentMeta) -> tuple[str, ...]:
    kinds = {d.get("key"): d.get("kind") for d in meta.devices}
    return SERIES.get(kinds.get(device) or ("host" if device == "host" else "gpu"), SERIES["gpu"])


def _series(t, Y, columns) -> dict:
    out = {"t": finite_or_none(np.asarray(t, dtype="float64").tolist())}
    Y = np.asarray(Y, dtype="float64").reshape(len(out["t"]), len(columns)) if len(columns) else Y
    for i, name in enumerate(columns):
        out[name] = finite_or_none(Y[:, i].tolist())
    return out


def _frame_series(table, meta: ExperimentMeta, max_points: int) -> dict:
    """Rows of a stream tail (an Arrow table, every device) as decimated series per device."""
    import pyarrow.compute as pc

    out = {}
    if table is None or table.num_rows == 0:
        return out
    for device in [d for d in pc.unique(table.column("device")).to_pylist() if d]:
        part = table.filter(pc.equal(table.column("device"), device))
        columns = [c for c in _columns_of(device, meta) if c in part.column_names]
        t = part.column("t").to_numpy(zero_copy_only=False).astype("float64")
        Y = np.column_stack([pc.fill_null(part.column(c), float("nan")).to_numpy(zero_copy_only=False)
                             for c in columns]) if columns else np.empty((len(t), 0))
        ts, rows = minmax_decimate(t, Y, max_points)
        out[device] = _series(ts, rows, columns)
    return out


class Follower:
    """One running experiment's decimated history, grown by tail reads of its stream."""

    def __init__(self, meta: ExperimentMeta, max_points: int) -> None:
        self.meta, self.max_points = meta, max_points
        self.offset = 0
        self.histories: dict[str, tuple[tuple[str, ...], MinMaxHistory]] = {}
        self.lock = threading.Lock()

    def update(self, stream: Path) -> None:
        import pyarrow.compute as pc

        with self.lock:
            table, self.offset = read_stream_tail(stream, self.offset)
            if table is None:
                return
            for device in [d for d in pc.unique(table.column("device")).to_pylist() if d]:
                part = table.filter(pc.equal(table.column("device"), device))
                if device not in self.histories:
                    columns = tuple(c for c in _columns_of(device, self.meta) if c in part.column_names)
                    self.histories[device] = (columns, MinMaxHistory(len(columns), buckets=self.max_points // 2 * 2,
                                                                     width_s=max(self.meta.interval_s, 0.05)))
                columns, history = self.histories[device]
                t = part.column("t").to_numpy(zero_copy_only=False).astype("float64")
                Y = np.column_stack([pc.fill_null(part.column(c), float("nan")).to_numpy(zero_copy_only=False)
                                     for c in columns]) if columns else np.empty((len(t), 0))
                history.add(t, Y)

    def series(self) -> dict:
        with self.lock:
            out = {}
            for device, (columns, history) in self.histories.items():
                ts, rows = history.points()
                out[device] = _series(ts, rows, columns)
            return out


class Followers:
    """The server's followers, one per running experiment directory (dropped once it ends)."""

    def __init__(self, max_points: int) -> None:
        self.max_points = max_points
        self._lock = threading.Lock()
        self._by_dir: dict[str, Follower] = {}

    def get(self, directory: Path, meta: ExperimentMeta) -> Follower:
        with self._lock:
            follower = self._by_dir.get(str(directory))
            if follower is None:
                follower = self._by_dir[str(directory)] = Follower(meta, self.max_points)
            return follower

    def drop(self, directory: Path) -> None:
        with self._lock:
            self._by_dir.pop(str(directory), None)


def _meta_payload(meta: ExperimentMeta) -> dict:
    keep = ("id", "name", "status", "started_at", "ended_at", "duration_s", "interval_s", "source", "simulated",
            "devices", "units", "notes", "gaps", "phases", "params", "user_metrics", "error", "checks",
            "alerts")
    return json_safe({k: getattr(meta, k) for k in keep})


def experiment_detail(store: Store, experiment_id: str, followers: Followers, max_points: int,
                      offset: int | None = None) -> dict:
    """One experiment: metadata, summary and decimated series per device (``t`` in s since start).

    Running (its stream is there): ``running: true``, ``offset`` (the stream's bytes read so
    far) and no summary yet. With ``offset`` given, only the rows after it are read and
    returned (``tail: true``): the caller appends them and asks again from the new offset.
    Without it, the series come from the server's follower, itself grown by tail reads.
    Finished: the stored summary and each device's series read once, decimated.
    """
    meta = find(store, experiment_id)
    if meta.status == RunStatus.CRASHED and not meta.summary:  # its writer died: finished once (here, or
        finish_crashed(store, experiment_id)           # by the listing's finisher), never summarised per poll
        meta = find(store, experiment_id)
    directory = store.directory(meta)
    payload = _meta_payload(meta)
    if _running(store, meta):
        stream = directory / STREAM_NAME
        payload.update(running=True, summary=None)
        if offset is not None:
            table, new_offset = read_stream_tail(stream, offset)
            payload.update(tail=True, offset=new_offset, series=_frame_series(table, meta, max_points))
            return payload
        follower = followers.get(directory, meta)
        follower.update(stream)
        payload.update(tail=False, offset=follower.offset, series=follower.series())
        return payload
    followers.drop(directory)
    experiment = store.load_meta(meta)
    payload.update(running=False, tail=False, offset=None, summary=json_safe(summary_of(experiment)))
    series = {}
    for device in experiment.sample_devices():
        frame = experiment.device_frame(device, list(_columns_of(device, meta)))
        columns = [c for c in _columns_of(device, meta) if c in frame.columns]
        t = frame["t"].to_numpy(dtype="float64")
        Y = frame[columns].to_numpy(dtype="float64", na_value=np.nan) if columns else np.empty((len(t), 0))
        ts, rows = minmax_decimate(t, Y, max_points, gaps=meta.gaps or ())
        series[device] = _series(ts, rows, columns)
    payload["series"] = series
    return payload
