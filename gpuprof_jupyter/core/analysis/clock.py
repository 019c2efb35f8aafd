"""One clock for a multi-node job: each node's clock offset, from an event every rank shares.

Runs in any process (core).

Each part of a job (one node's ``gpuprof run``) times its steps on its own host's clock. Hosts'
wall clocks differ (NTP keeps them within milliseconds at best, seconds on a badly run
cluster), so the parts' start times alone put a node's steps where its clock says, not where
they happened. In synchronous data-parallel training every rank leaves each step's gradient
all-reduce at the same moment, and its step ends right after (the optimizer step): step k ends
at nearly the same true time on every rank. So a node's offset is the median, over the steps
all ranks made, of how far its step ends lie from the reference node's (the median over each
node's ranks at each step first: ranks on one host share a clock).

The error bound is the 95th percentile of how far each step's difference lies from that
median: how far apart ranks leave the same collective, as the run itself measured it. Where
ranks are not in lockstep (that spread is more than ``LOCKSTEP_SHARE`` of a step) or fewer
than ``MIN_STEPS`` steps are shared, no offset is estimated: the wall clocks are trusted, and
the result says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuprof_jupyter.core.analysis.run_figures import step_figure
from gpuprof_jupyter.core.format import fmt_figure

MIN_STEPS = 3  # shared steps needed to estimate an offset
LOCKSTEP_SHARE = 0.25  # step ends further apart than this share of a step: not a shared event


@dataclass(frozen=True)
class ClockOffset:
    """How far a node's clock runs ahead of the reference node's (``offset_s``, subtracted from
    its times), within ``error_s``; ``basis`` says from what, or why it is None."""

    offset_s: float | None
    error_s: float | None
    basis: str

    def as_dict(self) -> dict:
        return {"offset_s": self.offset_s, "error_s": self.error_s, "basis": self.basis}


def node_series(ranks: dict[int, np.ndarray], count: int) -> np.ndarray:
    """The node's step ends: per step index below ``count``, the median over its ranks."""
    return np.median(np.vstack([ends[:count] for ends in ranks.values()]), axis=0)


def node_offsets(step_ends: dict, reference, step_time_s: float) -> dict:
    """part -> ClockOffset against ``reference`` (a key of ``step_ends``), from ``step_ends``:
    part -> {rank: its step end times, ascending, on the parts' start-time timeline}.
    ``step_time_s``: the job's median step (how close step ends must be to be one event)."""
    counts = [len(ends) for ranks in step_ends.values() for ends in ranks.values()]
    count = min(counts) if counts else 0
    out = {reference: ClockOffset(0.0, 0.0, "the reference node")}
    if count < MIN_STEPS or not step_ends.get(reference):
        why = f"wall clocks trusted: fewer than {MIN_STEPS} steps on every rank"
        return {part: out[reference] if part == reference else ClockOffset(None, None, why) for part in step_ends}
    base = node_series(step_ends[reference], count)
    for part, ranks in step_ends.items():
        if part == reference:
            continue
        differences = node_series(ranks, count) - base
        offset = float(np.median(differences))
        error = float(np.percentile(np.abs(differences - offset), 95))
        if error > LOCKSTEP_SHARE * step_time_s:
            out[part] = ClockOffset(None, None, "wall clocks trusted: the ranks' step ends are not in lockstep "
                                    f"(95th percentile {_steps(error)} apart, steps of {_steps(step_time_s)})")
        else:
            out[part] = ClockOffset(offset, error, f"step ends of {count} synchronous steps (ranks leave the all-reduce "
                                    "together)")
    return out


def _steps(seconds: float) -> str:
    """A time the ranks' step records measured."""
    return fmt_figure(step_figure(seconds, "time"))


__all__ = ["ClockOffset", "LOCKSTEP_SHARE", "MIN_STEPS", "node_offsets", "node_series"]
