"""``gpuprof_jupyter.watch(JOB_ID)`` and ``%gpuprofile watch JOB_ID``: a running multi-node job,
every rank's step time and data wait, from any notebook that sees the job's store.

Runs in the kernel.

Each node's part writes its steps so far every few seconds while it runs
(``sampler_process/run.Run.write_job_steps``); the watch reads the job's parts again every
``every_s`` (``core/job.load_job(live=True)``: steps and the job's context, no samples) and
rewrites one output in place, until no part of the job runs any more (then it shows the final
figures once more and returns), ``timeout_s`` passes, or the user interrupts the cell. With
``source="prometheus=URL"`` each refresh also takes what Prometheus scraped of the nodes' GPUs
since the last (``runtime/jobs/node_gpus.py``), shown beside the ranks.
"""

from __future__ import annotations

import time

from gpuprof_jupyter.core.job import live_rows, load_job
from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.core.store.experiment import RunStatus
from gpuprof_jupyter.render.job_live import gpus_heading, job_live_html, job_live_text, waiting_text

DEFAULT_EVERY_S = 2.0  # as often as the parts write their steps


def watch(job_id: str, store=None, *, source: str | None = None, match: str | None = None,
          every_s: float = DEFAULT_EVERY_S, window_s: float = 10.0, timeout_s: float | None = None) -> None:
    """Show job ``job_id`` (the launcher's id: ``TORCHELASTIC_RUN_ID``, ``SLURM_JOB_ID``) live,
    one row per rank (host, steps, step time and data wait over its last ``window_s``), until it
    ends; before its first part appears, a line says it waits for one. ``source``:
    ``prometheus=URL`` (``match``: label matchers, as ``--match``) adds each node's GPU readings
    (ValueError when Prometheus cannot give them). Ctrl-C stops watching (the job goes on)."""
    store = store if isinstance(store, Store) else Store(store) if store is not None else Store()
    gpus = None
    if source is not None:
        from gpuprof_jupyter.runtime.jobs.node_gpus import NodeGPUs

        gpus = NodeGPUs(source, match)
        gpus.open()
    try:
        _watch(job_id, store, gpus, every_s, window_s, timeout_s)
    finally:
        if gpus is not None:
            gpus.close()


def _watch(job_id: str, store: Store, gpus, every_s: float, window_s: float, timeout_s: float | None) -> None:
    from IPython import get_ipython
    from IPython.display import display

    handle = None
    if get_ipython() is not None:
        handle = display({"text/plain": waiting_text(job_id)}, raw=True, display_id=True)
    else:
        print(waiting_text(job_id))

    def show(bundle: dict) -> None:
        if handle is not None:
            handle.update(bundle, raw=True)
        else:  # a plain Python process: each refresh printed
            print(bundle["text/plain"])
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while True:
            job = load_job(store, job_id, live=True)
            if job is not None:
                rows = live_rows(job, window_s)
                by_node, heading = None, ""
                if gpus is not None:
                    gpus.poll()
                    by_node, heading = gpus.by_node(), gpus_heading(gpus.url, gpus.notes())
                show({"text/plain": job_live_text(job, rows, window_s, by_node, heading),
                      "text/html": job_live_html(job, rows, window_s, by_node, heading)})
                if job.status != RunStatus.RUNNING:
                    return
            if deadline is not None and time.monotonic() >= deadline:
                return
            time.sleep(every_s)
    except KeyboardInterrupt:
        return


__all__ = ["watch"]
