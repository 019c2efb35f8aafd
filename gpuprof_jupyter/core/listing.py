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

import hashlib
import json
import threading
from dataclasses import dataclass, replace

from gpuprof_jupyter.core.analysis.table import listing_row
from gpuprof_jupyter.core.crashed import finish_crashed
from gpuprof_jupyter.core.store.directory import Store, writer_alive
from gpuprof_jupyter.core.store.index import StoreIndex

_PARSED: dict[tuple[str, str], tuple[str, dict]] = {}  # (store, id) -> (row text, row): parsed once
_PARSED_LOCK = threading.Lock()


@dataclass
class Listing:
    """``rows``: oldest first, each ``listing_row``'s keys plus ``running``. ``version``
    changes whenever a row, its running state or the problems change (the server's ETag)."""

    rows: list[dict]
    problems: list[str]
    version: str


def store_listing(store: Store) -> Listing:
    """The store's rows, from the index; rows of new or changed experiments computed (and
    saved), runs whose writer died finished first."""
    entries = store.entries()
    dead = [e for e in entries if e.status == "running" and not writer_alive(e)]
    if dead and any([finish_crashed(store, e.id) for e in dead]):
        entries = store.entries()
    filled, rows = [], []
    for entry in entries:
        if entry.row is None:
            entry = _filled(store, entry)
            if entry is None:
                continue  # deleted or damaged since it was listed: the next listing reports it
            filled.append(entry)
        rows.append(_parsed(store, entry))
    StoreIndex(store.root).save(filled)
    digest = hashlib.sha1(usedforsecurity=False)
    for entry, row in zip(entries, rows):
        digest.update(f"{entry.id}\0{entry.key}\0{row['running']}\n".encode())
    digest.update(json.dumps(store.problems).encode())
    return Listing(rows, list(store.problems), digest.hexdigest()[:20])


def _filled(store: Store, entry):
    """``entry`` with its listing row computed from its ``meta.json`` (None when unreadable)."""
    try:
        meta = store.read_meta(entry.id)
    except KeyError:
        return None
    if meta.status == "running":
        meta.summary = {"overall": {}, "running": True}  # in memory only: not summarised while it grows
    row = listing_row(store.load_meta(meta))
    return replace(entry, row=json.dumps(row, default=str))


def _parsed(store: Store, entry) -> dict:
    """The entry's row as a dict (parsed once per row text) with ``running`` as of now."""
    cache_key = (str(store.root), entry.id)
    with _PARSED_LOCK:
        text, row = _PARSED.get(cache_key, (None, None))
    if text != entry.row:
        row = json.loads(entry.row)
        with _PARSED_LOCK:
            _PARSED[cache_key] = (entry.row, row)
    running = entry.status == "running" and writer_alive(entry)
    if row.get("status") == "running" and not running:
        row = {**row, "status": "crashed"}  # dead but not finished (a store this process cannot write)
    return {**row, "running": running}
