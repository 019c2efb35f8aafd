"""A run whose sampler process died without finishing it: finished once, by whoever finds it.

Runs in whichever process lists a store (the kernel, ``gpuprof list``, the Jupyter server).
A run left ``running`` by a dead sampler process has no Parquet file and no summary; a
listing that summarised its stream on every poll took 14-18 s for a 6-hour, 9-device run.
The first process to find it dead finishes it with the same code as a normal end
(``finish.py``: Parquet from the stream, summary, metadata) and status ``crashed``, keeping
every data file that holds more than it can rebuild (a run that was finished before its
``meta.json`` was: its steps, its samples, its summary; ``store/keep_more.py``); from then
on it lists like any finished run. Under the store's lock, and only after reading
``meta.json`` again: a second finder sees ``crashed`` and does nothing.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timezone

from gpuprof_jupyter.core.finish import finish_experiment
from gpuprof_jupyter.core.store.directory import META_NAME, STEPS_NAME, Store, writer_alive
from gpuprof_jupyter.core.store.experiment import RunStatus
from gpuprof_jupyter.core.store.index import read_meta


def finish_crashed(store: Store, experiment_id: str) -> bool:
    """Finish the run ``experiment_id`` if it is still ``running`` and its writer is dead;
    True when this call finished it (False: alive, already finished, unreadable, or a store
    this process may not write: then it lists as ``crashed`` without a summary)."""
    try:
        with store.locked():
            return _finish_if_dead(store, experiment_id)
    except OSError:  # the lock could not be taken (a read-only store)
        return False


def _finish_if_dead(store: Store, experiment_id: str) -> bool:
    try:
        meta = read_meta(store.root / experiment_id / META_NAME)
    except (ValueError, TypeError, OSError):
        return False
    if meta.status != RunStatus.RUNNING or meta.id != experiment_id or writer_alive(meta):
        return False
    meta.status = RunStatus.CRASHED
    found = datetime.now(timezone.utc).isoformat(timespec="seconds")
    lost = "" if (store.directory(meta) / STEPS_NAME).exists() else \
        " (steps and rule results, kept by the kernel, are not on disk)"
    meta.notes.append(f"gpuprof: the sampler process (pid {meta.pid}) ended without finishing this run; "
                      f"finished from what it wrote by {socket.gethostname()} pid {os.getpid()} at {found}{lost}")
    finish_experiment(store, meta, [], [], meta.notes)
    return True
