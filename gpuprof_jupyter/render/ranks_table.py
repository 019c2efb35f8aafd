"""Per-rank rows of a distributed run, for the summary, the comparison and the report. One row
per rank (``analysis.ranks``: steps, step time, data wait, waiting for the other ranks,
throughput, its GPU, how it ended), named with its host in a multi-node job.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.
"""

from __future__ import annotations

from gpuprof_jupyter.core.analysis.ranks import rank_name
from gpuprof_jupyter.core.analysis.summary import summary_of
from gpuprof_jupyter.core.format import fmt_rate, fmt_seconds


def rank_rows(experiment) -> list[dict]:
    """One dict of formatted figures per rank; [] for a run with fewer than two ranks."""
    ranks = summary_of(experiment).get("ranks") or {}
    return [{"rank": rank_name(experiment, int(rank)), "steps": str(f.get("count", 0)),
             "step time p50": fmt_seconds(f.get("step_time_p50_s")),
             "data wait p50": fmt_seconds(f.get("wait_p50_s")),
             "waiting for other ranks p50": fmt_seconds(f.get("sync_wait_p50_s")),
             "throughput": fmt_rate(f.get("samples_per_s"), " samples/s"),
             "device": f.get("gpu") or f.get("device") or "n/a", "ended": f.get("ended") or "n/a"}
            for rank, f in sorted(ranks.items(), key=lambda item: int(item[0]))]


def ranks_rows(experiments) -> list[dict]:
    """The rank rows of several experiments, each row led by its experiment's name."""
    return [{"experiment": e.name, **row} for e in experiments for row in rank_rows(e)]


__all__ = ["rank_rows", "ranks_rows"]
