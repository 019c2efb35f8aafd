"""A store's listing: one row per experiment, read through the store's index.

Runs in whichever process lists a store: ``experiments()`` in the kernel, ``gpuprof list``,
the Jupyter server's sidebar listing. A row (``analysis/table.py``: the summary's figures,
params, logged metrics) is computed once per version of an experiment's ``meta.json`` and kept
in the index (``store/index.py``), so a listing of 10,000 experiments stats their ``meta.json``
files and reads none that did not change. A run left ``running`` by a dead sampler process is
finished first, once (``crashed.py``). A running run's figures are empty: its stream still
grows, and the live view follows it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gpuprof_jupyter.core.format import json_safe
from gpuprof_jupyter.core.store.directory import Store, writer_alive
from gpuprof_jupyter.core.store.experiment import RunStatus
from gpuprof_jupyter.core.store.index import StoreIndex


@dataclass
class Listing:
    """``rows``: oldest first, each ``listing_row``'s keys plus ``running``. ``version``
    changes whenever a row, its running state or the problems change (the server's ETag)."""

    rows: list[dict]
    problems: list[str]
    tokens: list[str]  # per row: changes when that row does (its meta.json's identity, its running state)

    @property
    def version(self) -> str:
        import hashlib  # here: ``gpuprof list`` never asks (its import is a fair share of that command)

        return hashlib.sha1("\n".join(self.tokens + self.problems).encode(), usedforsecurity=False).hexdigest()[:20]


JOB_FIELDS = ("job", "job_part", "job_parts", "job_host")  # a part's place in its job (analysis/table.listing_row)


def job_rows(listing: Listing) -> Listing:
    """``listing`` with each multi-node job's parts folded into one row, where its first part was
    (``gpuprof list``, ``experiments()``, the sidebar): ``id`` the job's key, ``status`` running
    while a part runs (else the worst), ``duration_s`` the longest, ``energy_kwh`` the sum,
    ``sm_util_mean`` the parts' mean; ``parts`` says how many of the expected parts are there,
    and which are missing or still running; ``part_ids`` and ``running_ids`` name the parts. A
    job row's token joins its parts' (it changes when one of them does)."""
    jobs: dict[str, list[int]] = {}
    for i, row in enumerate(listing.rows):
        if row.get("job"):
            jobs.setdefault(row["job"], []).append(i)
    rows, tokens = [], []
    for i, row in enumerate(listing.rows):
        key = row.get("job")
        if not key:
            rows.append(row)
            tokens.append(listing.tokens[i])
        elif jobs[key][0] == i:
            rows.append(_job_row(key, [listing.rows[j] for j in jobs[key]]))
            tokens.append("+".join(listing.tokens[j] for j in jobs[key]))
    return Listing(rows, listing.problems, tokens)


def _job_row(key: str, parts: list[dict]) -> dict:
    statuses = [RunStatus.RUNNING if p.get("running") else p.get("status") for p in parts]
    names = {p.get("name") for p in parts}

    def numbers(column):
        return [p[column] for p in parts if isinstance(p.get(column), (int, float)) and p[column] == p[column]]

    places = {p.get("job_part") for p in parts}
    expected = max(numbers("job_parts"), default=None)
    said = f"{len(places)}/{expected}" if expected else f"{len(places)}"
    missing = [str(i) for i in range(expected or 0) if i not in places]
    running = [str(p.get("job_host")) for p, s in zip(parts, statuses) if s == RunStatus.RUNNING]
    said += (f" (missing: {', '.join(missing)})" if missing else "") + (f" (running: {', '.join(running)})" if running else "")
    util, energy, duration = numbers("sm_util_mean"), numbers("energy_kwh"), numbers("duration_s")
    return {**parts[0], "id": key, "name": names.pop() if len(names) == 1 else key,
            "status": RunStatus.of_parts(statuses), "running": bool(running),
            "duration_s": max(duration) if duration else None, "energy_kwh": sum(energy) if energy else None,
            "sm_util_mean": sum(util) / len(util) if util else None, "parts": said,
            "part_ids": [p.get("id") for p in parts],
            "running_ids": [p.get("id") for p, s in zip(parts, statuses) if s == RunStatus.RUNNING]}


def finish_now(store: Store, ids: list[str]) -> bool:
    """Finish these dead runs here and now (``crashed.py``); True when one was finished."""
    from gpuprof_jupyter.core.crashed import finish_crashed  # analysis, numpy: only when needed

    return any([finish_crashed(store, i) for i in ids])


def store_listing(store: Store, columns: tuple[str, ...] | None = None, finish=finish_now) -> Listing:
    """The store's rows, from the index; rows of new or changed experiments computed (and
    saved), runs whose writer died finished first. Analysis (numpy) is imported only when a row
    must be computed. The rows are shared with later listings: read them, never change them.
    ``columns``: only these are needed (a fresh process then reads only them from the index).
    ``finish(store, ids)``: what to do with dead runs (the server finishes them in the
    background and returns False: meanwhile they list as ``crashed`` without figures)."""
    entries = store.entries()
    dead = [e.id for e in entries if e.status == RunStatus.RUNNING and not writer_alive(e)]
    if dead and finish(store, dead):
        entries = store.entries()
    parsed = _parse_rows(store, entries, columns)
    rows, tokens = [], []
    for entry in entries:
        row = parsed.get(entry.id) or entry.parsed
        token = entry.key
        if entry.status == RunStatus.RUNNING:
            alive = writer_alive(entry)
            token = f"{entry.key}:{alive}"
            row = {**row, "running": alive, "status": RunStatus.RUNNING if alive else RunStatus.CRASHED}  # crashed: not ours to finish
        rows.append(row)
        tokens.append(token)
    return Listing(rows, list(store.problems), tokens)


def _parse_rows(store: Store, entries, columns: tuple[str, ...] | None) -> dict[str, dict]:
    """Give every entry its parsed row: from this process's memory, else the index file (one
    parse for all), else computed from its ``meta.json`` and saved. With ``columns``, rows read
    from the index file hold only those and are returned (id -> row), not kept on the entries."""
    missing = [e for e in entries if e.parsed is None]
    if not missing:
        return {}
    index = StoreIndex(store.root)
    partial = {}
    if any(e.row is None for e in missing):
        fields = None if columns is None else (*columns, "running")
        stored = index.stored_rows(fields)
        for e in missing:
            key, value = stored.get(e.id, (None, None))
            if e.row is None and key == e.key:
                if fields is None:
                    e.row = value
                else:
                    partial[e.id] = dict(zip(fields, value))
    missing = [e for e in missing if e.id not in partial]
    filled = []
    for e in missing:
        if e.row is None:
            e.row = _row_text(store, e.id)
            filled.append(e)
    for e, row in zip(missing, json.loads("[" + ",".join(e.row for e in missing) + "]")):
        e.parsed = row
    index.save(filled)
    return partial


def _row_text(store: Store, experiment_id: str) -> str:
    """The listing row of one experiment, from its ``meta.json``, as JSON text."""
    from gpuprof_jupyter.core.analysis.table import listing_row  # numpy: only for new rows (``gpuprof list`` stays fast)

    try:
        meta = store.read_meta(experiment_id)
    except KeyError as exc:  # deleted or damaged since it was listed: the next listing says so
        return json.dumps({"id": experiment_id, "name": "", "status": "unreadable", "error": str(exc)})
    if meta.status in (RunStatus.RUNNING, RunStatus.CRASHED) and not meta.summary:  # growing, or its writer died (being finished)
        meta.summary = {"overall": {}, "running": True}  # in memory only: a stream is never summarised here
    row = {**listing_row(store.load_meta(meta)), "running": meta.status == RunStatus.RUNNING}
    return json.dumps(json_safe(row), allow_nan=False)  # plain JSON: SQLite reads fields of it
