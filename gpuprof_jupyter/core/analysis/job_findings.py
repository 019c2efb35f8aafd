"""Findings only a job across hosts has: a slow node (every rank on one host slower) told apart
from a slow rank, and ranks or parts that never reported.

Runs in any process (core).

A straggler (``rank_findings.straggler_rank``) is one rank. When every rank of its host lags the
same way against the ranks of the other hosts (its data wait, or its step time, past the same
threshold), the cause is that host's (a slow disk or network link, a hot or throttled GPU, a
noisy neighbour), not the rank's: one ``slow-node`` finding names the host and its ranks. A
rank a job expected (``WORLD_SIZE``) that sent nothing, or a node whose part was never saved,
is named as missing (``core/job.py`` counts them), never silently absent.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gpuprof_jupyter.core.analysis.finding import Finding
from gpuprof_jupyter.core.analysis.ranks import job_hosts, listed, rank_host
from gpuprof_jupyter.core.analysis.run_figures import step_figure
from gpuprof_jupyter.core.format import fmt_figure


def slow_node(experiment, ranks: dict[int, dict], slow: int, values: dict[int, float],
              lags: Callable[[int, list[int]], bool], cause: str, what: str, gpu: bool = True) -> Finding | None:
    """A ``slow-node`` finding when ``slow``'s host has several ranks and every one of them
    ``lags(rank, others)`` against the ranks on other hosts; None otherwise. ``values``: rank ->
    the figure compared (s per step), ``what`` its text; ``cause``: ``data`` or ``compute``;
    ``gpu``: whether a GPU was read (else the advice names the host's CPUs, not its GPUs)."""
    host = rank_host(experiment, slow)
    if host is None or len(job_hosts(experiment)) < 2:
        return None
    mine = [r for r in ranks if rank_host(experiment, r) == host]
    others = [r for r in ranks if rank_host(experiment, r) != host]
    if len(mine) < 2 or not others or not all(lags(r, others) for r in mine):
        return None
    names = listed(mine)
    compute = ("its GPUs' clocks, temperature and other processes" if gpu
               else "its CPUs (no GPU was read): other processes on them, its threads")
    return Finding("slow-node", f"Node {host} is slow: all its ranks ({names}) lag", "high",
                   f"every rank on {host} (rank {names}) has a longer {what} than the {len(others)} rank(s) on the "
                   f"other hosts (median {_per_step(median_of(values, mine))} against "
                   f"{_per_step(median_of(values, others))}): the host is the cause, not one rank",
                   f"look at that host: its storage or network link (data), {compute} (compute); move the job "
                   "off it to confirm",
                   {"host": host, "ranks": mine, "cause": cause})


def _per_step(seconds: float) -> str:
    """A time per step (the ranks' medians), measured by their step hooks."""
    return fmt_figure(step_figure(seconds, "time"))


def ranks_missing(experiment) -> Finding | None:
    """The ranks (of ``WORLD_SIZE``) and parts (of the nodes expected) that never reported."""
    job = experiment.meta.context.get("job") or {}
    missing, parts = job.get("missing_ranks") or [], job.get("missing_parts") or []
    if not missing and not parts:
        return None
    said = []
    if missing:
        said.append(f"rank {listed(missing)} of {job.get('world_size')} sent no step")
    if parts:
        said.append(f"part {listed(parts)} of {job.get('parts_expected')} (a node's gpuprof run) "
                    "saved nothing in this store")
    return Finding("ranks-missing", "Ranks never reported: " + listed(missing or parts), "high",
                   "; ".join(said) + "; every figure and finding here is of the ranks that did",
                   "check that node's gpuprof run (same --store, same job id), that its store folder was copied "
                   "here, and the launcher's log for that rank", {"ranks": missing, "parts": parts})


def median_of(values: dict[int, float], ranks: list[int]) -> float:
    return float(np.median([values[r] for r in ranks]))


__all__ = ["median_of", "ranks_missing", "slow_node"]
