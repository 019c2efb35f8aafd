"""The ranks of a distributed run: per-rank figures, each rank's GPU, and one rank at a time
for what reads ``experiment.steps`` (the per-step rules).

Runs in any process (core).

A run's child processes report their steps keyed by rank (``runtime/jobs/children_listener.py``;
``Experiment.rank_steps()``), with what each rank said of itself in ``context.ranks``: its
``LOCAL_RANK``, ``WORLD_SIZE``, ``CUDA_VISIBLE_DEVICES`` and the device its parameters live on.

In synchronous data-parallel training every rank's step lasts as long as the slowest rank's:
the others wait at the gradient all-reduce, inside their step. So a rank's step time minus its
data wait is its compute plus that wait for the others; the smallest such figure among the
ranks is the best estimate of the compute itself (the slowest rank waits for nobody), and the
rest, on each rank, is time spent waiting for the others (``sync_wait_p50_s``). A fork of a
child (``forked_from`` in its ``context.ranks`` entry) has a key of its own but is no peer in
that training: it has its row and figures, and is left out of every comparison between ranks.
"""

from __future__ import annotations

import numpy as np

from gpuprof_jupyter.core.analysis.step_figures import steps_summary
from gpuprof_jupyter.core.store.experiment import OWN_RANK


def rank_label(rank: int) -> str:
    return "this process" if rank == OWN_RANK else f"rank {rank}"


LISTED = 8  # ranks or hosts named in one sentence; the rest are counted (a job of 512 ranks)


def listed(items, limit: int = LISTED) -> str:
    """``0, 1, 2`` or, past ``limit`` items, ``0, 1, ..., 7 and 504 more``."""
    items = [str(i) for i in items]
    return ", ".join(items) if len(items) <= limit else ", ".join(items[:limit]) + f" and {len(items) - limit} more"


def rank_name(experiment, rank: int) -> str:
    """``rank 3``, or ``rank 3 on node-b`` where the run's ranks span several hosts (a job)."""
    host = rank_host(experiment, rank)
    return f"rank {rank} on {host}" if host and len(job_hosts(experiment)) > 1 else rank_label(rank)


def rank_host(experiment, rank: int) -> str | None:
    return ((experiment.meta.context.get("ranks") or {}).get(str(rank)) or {}).get("host")


def job_hosts(experiment) -> set[str]:
    """The hosts the run's ranks ran on (one for a run on one machine)."""
    return {info.get("host") for info in (experiment.meta.context.get("ranks") or {}).values() if info.get("host")}


def rank_gpu(experiment, rank: int) -> str | None:
    """The device key (``gpu1``; ``HOST/gpu1`` in a job) of the GPU ``rank`` trained on, when it
    said so and that GPU was sampled; None otherwise (a CPU rank, a UUID in
    CUDA_VISIBLE_DEVICES, not sampled). In a job, only its own host's GPUs are candidates."""
    info = (experiment.meta.context.get("ranks") or {}).get(str(rank)) or {}
    physical = physical_gpu(info)
    if physical is None:
        return None
    return next((d["key"] for d in experiment.meta.gpu_devices if d.get("index") == physical
                 and d.get("host") in (None, info.get("host"))), None)


def cuda_index(info: dict) -> int | None:
    """N of the ``cuda:N`` a rank's parameters live on, as the rank numbers its GPUs (``cuda``
    alone: 0); None when not on a GPU."""
    device = str(info.get("device") or "")
    if not device.startswith("cuda"):
        return None
    return int(device.partition(":")[2] or 0)


def physical_gpu(info: dict) -> int | None:
    """The host's index of the GPU a rank used: ``cuda:N`` read through its CUDA_VISIBLE_DEVICES."""
    index = cuda_index(info)
    if index is None:
        return None
    visible = info.get("cuda_visible_devices")
    if visible is None or visible == "":
        return index
    listed = [v.strip() for v in visible.split(",") if v.strip()]
    try:
        return int(listed[index])
    except (IndexError, ValueError):
        return None


def forked_ranks(experiment) -> set[int]:
    """Keys of the run's forks of a child (docs/scripts.md): processes of their own, no ranks."""
    return {int(key) for key, info in (experiment.meta.context.get("ranks") or {}).items()
            if (info or {}).get("forked_from") is not None}


def rank_figures(experiment) -> dict[int, dict]:
    """rank -> its steps' figures (``step_figures.steps_summary``) plus medians per step: step time,
    data wait, compute (step minus data wait minus waiting for the others) and waiting for the
    others; and its GPU. {} for a run with fewer than two ranks."""
    frames = experiment.rank_step_columns()
    if len(frames) < 2:
        return {}
    ranks, forks = experiment.meta.context.get("ranks") or {}, forked_ranks(experiment)
    busy = {rank: float(np.median(np.asarray(f["duration_s"], dtype="float64") - np.asarray(f["wait_s"], dtype="float64")))
            for rank, f in frames.items() if len(f) and rank not in forks}
    compute = min(busy.values()) if busy else float("nan")
    out = {}
    for rank, frame in frames.items():
        figures = steps_summary(frame)
        if len(frame):
            figures["wait_p50_s"] = float(np.median(np.asarray(frame["wait_s"], dtype="float64")))
        if rank in busy:
            figures["compute_p50_s"] = compute
            figures["sync_wait_p50_s"] = max(0.0, busy[rank] - compute)
        info = ranks.get(str(rank)) or {}
        figures.update({"device": info.get("device"), "gpu": rank_gpu(experiment, rank),
                        "local_rank": info.get("local_rank"), "ended": info.get("ended")})
        figures.update({k: info[k] for k in ("host", "node_rank", "restart_count") if info.get(k) is not None})
        if rank in forks:
            figures["forked_from"] = info["forked_from"]
        out[rank] = figures
    return out


class RankView:
    """One rank of ``experiment`` for code that reads ``.steps`` (the per-step rules): its steps
    and, when known, only its GPU's samples (``gpu_keys``); everything else is the experiment's."""

    def __init__(self, experiment, rank: int) -> None:
        self._experiment, self.rank = experiment, rank
        gpu = rank_gpu(experiment, rank)
        self.gpu_keys = [gpu] if gpu else None

    def __getattr__(self, name):
        return getattr(self._experiment, name)

    @property
    def steps(self):
        return self._experiment.rank_steps()[self.rank]


def rank_views(experiment) -> list[RankView]:
    """One view per rank that reported steps (forks of a child are no ranks); [] for a run with
    fewer than two ranks."""
    forks = forked_ranks(experiment)
    ranks = [rank for rank in experiment.rank_steps() if rank not in forks]
    return [RankView(experiment, rank) for rank in ranks] if len(ranks) > 1 else []


__all__ = ["LISTED", "RankView", "forked_ranks", "job_hosts", "listed", "physical_gpu", "rank_figures", "rank_gpu", "rank_host", "rank_label",
           "rank_name", "rank_views"]
