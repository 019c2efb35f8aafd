"""Per-rank rows of a distributed run, for the summary, the comparison and the report. One row
per rank (``analysis.ranks``: steps, step time, data wait, waiting for the other ranks,
throughput, its GPU, how it ended), named with its host in a multi-node job.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

Past ``MAX_RANK_ROWS`` ranks (a job of 64 nodes has 512) one row gives the distribution over
every rank (min / median / max of each figure) and the rows that follow are the outliers only:
the ``OUTLIERS`` ranks with the longest data wait, the longest step time and the least waiting
for the others (the slowest), and every rank that did not end ``ok``.
"""

from __future__ import annotations

import numpy as np

from gpuprof_jupyter.core.analysis.ranks import rank_name
from gpuprof_jupyter.core.analysis.summary import summary_of
from gpuprof_jupyter.core.analysis.run_figures import step_figure
from gpuprof_jupyter.core.format import MISSING, fmt_figure, fmt_figures

MAX_RANK_ROWS = 16  # more ranks than this: a distribution row and the outliers
OUTLIERS = 3  # ranks shown per figure that stands out


def _row(experiment, rank: int, f: dict) -> dict:
    return {"rank": rank_name(experiment, rank), "steps": str(f.get("count", 0)),
            "step time p50": fmt_figure(step_figure(f.get("step_time_p50_s"), "s")),
            "data wait p50": fmt_figure(step_figure(f.get("wait_p50_s"), "s")),
            "waiting for other ranks p50": fmt_figure(step_figure(f.get("sync_wait_p50_s"), "s")),
            "throughput": fmt_figure(step_figure(f.get("samples_per_s"), "samples/s")),
            "device": f.get("gpu") or f.get("device") or MISSING, "ended": f.get("ended") or MISSING}


def _spread(ranks: dict[int, dict], key: str, unit: str) -> str:
    """min / median / max of one figure over every rank, in its unit ("n/a" when no rank has it)."""
    values = np.array([f[key] for f in ranks.values() if isinstance(f.get(key), (int, float))], dtype="float64")
    values = values[np.isfinite(values)]
    if not len(values):
        return MISSING
    return fmt_figures(step_figure(float(v), unit) for v in (values.min(), np.median(values), values.max()))


def rank_rows(experiment) -> list[dict]:
    """One dict of formatted figures per rank ([] for a run with fewer than two ranks); past
    ``MAX_RANK_ROWS`` ranks, the distribution and the outliers (module docstring)."""
    ranks = {int(r): f for r, f in (summary_of(experiment).get("ranks") or {}).items()}
    if len(ranks) <= MAX_RANK_ROWS:
        return [_row(experiment, rank, f) for rank, f in sorted(ranks.items())]
    ended = {}
    for f in ranks.values():
        ended[f.get("ended") or MISSING] = ended.get(f.get("ended") or MISSING, 0) + 1
    rows = [{"rank": f"all {len(ranks)} ranks: min / median / max", "steps": _spread(ranks, "count", "count"),
             "step time p50": _spread(ranks, "step_time_p50_s", "s"),
             "data wait p50": _spread(ranks, "wait_p50_s", "s"),
             "waiting for other ranks p50": _spread(ranks, "sync_wait_p50_s", "s"),
             "throughput": _spread(ranks, "samples_per_s", "samples/s"),
             "device": "", "ended": ", ".join(f"{k}: {v}" for k, v in sorted(ended.items()))}]

    def by(key: str, reverse: bool = True) -> list[int]:
        known = [r for r, f in ranks.items() if isinstance(f.get(key), (int, float)) and np.isfinite(f[key])]
        return sorted(known, key=lambda r: ranks[r][key], reverse=reverse)[:OUTLIERS]

    picked = dict.fromkeys([*by("wait_p50_s"), *by("step_time_p50_s"), *by("sync_wait_p50_s", reverse=False),
                            *sorted(r for r, f in ranks.items() if f.get("ended") not in ("ok", None))])
    return rows + [_row(experiment, rank, ranks[rank]) for rank in picked]


def ranks_rows(experiments) -> list[dict]:
    """The rank rows of several experiments, each row led by its experiment's name."""
    return [{"experiment": e.name, **row} for e in experiments for row in rank_rows(e)]


__all__ = ["MAX_RANK_ROWS", "rank_rows", "ranks_rows"]
