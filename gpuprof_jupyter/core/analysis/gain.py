"""One estimator of a run's rate and of the gain between two runs, with its 95 % interval.

Runs in any process (core).

The ``--tune`` table, its report, ``compare()`` (and the HTML report) and ``pipeline.yaml``
all take their gains from here, so a gain reads the same everywhere. Gains are of rates
(samples/s, samples per joule, steps/s), never of totals: two runs of different lengths have
different durations and energies whatever they changed.

A run's rate is taken over its steady steps (a ``--tune`` trial's warm-up, saved in
``context.tune.warmup_steps``, is left out; an ordinary run counts every step): the point
value is total samples over total step time (as ``step_figures.steps_summary``), and its
uncertainty comes from ``BLOCKS`` contiguous blocks of steps, not single steps (DataLoader
workers deliver batches in bursts, so single steps are not independent draws). A gain whose
interval includes 0, or of a run too short to give an interval, is inconclusive, with the reason.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import numpy as np

from gpuprof_jupyter.core.analysis.summary import phases_summary
from gpuprof_jupyter.core.format import fmt_change

BLOCKS = 5
MIN_BLOCK_STEPS = 2
MIN_STEADY_STEPS = BLOCKS * MIN_BLOCK_STEPS  # the fewest steady steps that give an interval
OBJECTIVES = ("throughput", "energy_per_sample", "time")
OBJECTIVE_WORDS = {"throughput": "throughput", "energy_per_sample": "samples per joule", "time": "steps/s"}
# two-sided 95 % Student t quantiles by degrees of freedom
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def t95(dof: int) -> float:
    return _T95.get(dof, 1.96) if dof >= 1 else math.nan


def warmup_of(experiment) -> int:
    """Steps a run's figures leave out: a ``--tune`` trial's warm-up, 0 for other runs."""
    tune = (experiment.meta.context or {}).get("tune") or {}
    try:
        return max(0, int(tune.get("warmup_steps") or 0))
    except (TypeError, ValueError):
        return 0


def objective_of(*experiments) -> str:
    """The objective the runs were tuned for when they are trials of one ``--tune`` search,
    else throughput."""
    found = {((e.meta.context or {}).get("tune") or {}).get("objective") for e in experiments}
    found.discard(None)
    return found.pop() if len(found) == 1 and next(iter(found)) in OBJECTIVES else "throughput"


@dataclass
class RateEstimate:
    """A run's rate over its steady steps; higher is better for every objective."""

    objective: str
    steps: int = 0
    value: float = math.nan
    blocks: list[float] = field(default_factory=list)  # per-block rates
    reason: str = ""  # why there is no interval ("" when there is one)
    windows: list[dict] = field(default_factory=list)  # phases_summary of the steady window, then each block

    @property
    def rel_se(self) -> float:
        """Standard error of the rate relative to it (NaN without an interval)."""
        if self.reason or len(self.blocks) < 2 or not statistics.fmean(self.blocks):
            return math.nan
        return statistics.stdev(self.blocks) / math.sqrt(len(self.blocks)) / abs(statistics.fmean(self.blocks))

    @property
    def interval(self) -> tuple[float, float]:
        half = t95(len(self.blocks) - 1) * self.rel_se * self.value
        return (self.value - half, self.value + half) if math.isfinite(half) else (math.nan, math.nan)


def _rate(objective: str, samples: float, seconds: float, steps: int, energy: float) -> float:
    if objective == "energy_per_sample":
        return samples / energy if energy > 0 else math.nan
    if objective == "time":
        return steps / seconds if seconds > 0 else math.nan
    return samples / seconds if seconds > 0 else math.nan


def estimate(experiment, objective: str = "throughput", *, warmup: int | None = None,
             windows: bool = False) -> RateEstimate:
    """``experiment``'s rate over its steady steps (after ``warmup``, by default ``warmup_of``).

    ``windows``: also summarise the steady window and each block (SM activity, energy), as
    the energy objective needs anyway. A step without a sample count counts as one sample.
    """
    out = RateEstimate(objective)
    steps = experiment.steps
    warmup = warmup_of(experiment) if warmup is None else warmup
    steady = steps.iloc[warmup:] if len(steps) > warmup else steps.iloc[0:0]
    out.steps = len(steady)
    if not len(steady):
        out.reason = f"no steady steps in {experiment.name}"
        return out
    duration = steady["duration_s"].to_numpy(dtype="float64")
    n = np.nan_to_num(steady["n_samples"].to_numpy(dtype="float64"), nan=1.0)
    ends = steady["t_end_s"].to_numpy(dtype="float64")
    starts = ends - duration
    k = BLOCKS if len(steady) >= MIN_STEADY_STEPS else 0
    edges = np.linspace(0, len(steady), k + 1).astype(int) if k else np.array([0, len(steady)])
    pairs = list(zip(edges[:-1], edges[1:]))
    spans = [{"name": f"block{i}", "start_s": float(starts[a]), "end_s": float(ends[b - 1])}
             for i, (a, b) in enumerate(pairs)] if k else []
    whole = {"name": "steady", "start_s": float(starts[0]), "end_s": float(ends[-1])}
    gpu_keys = [d["key"] for d in experiment.meta.gpu_devices]
    if windows or objective == "energy_per_sample":
        if gpu_keys:
            out.windows = phases_summary(experiment, [whole, *spans], gpu_keys, experiment.meta.sampling_interval_s,
                                         experiment.meta.gaps or [])
        else:  # no GPU: no energy and no SM activity to read
            out.windows = [{"energy_j": math.nan, "sm_util_mean": math.nan} for _ in range(1 + len(spans))]
    energies = [w["energy_j"] for w in out.windows] or [math.nan] * (1 + len(spans))
    out.value = _rate(objective, float(n.sum()), float(duration.sum()), len(steady), energies[0])
    if k:
        blocks = [_rate(objective, float(n[a:b].sum()), float(duration[a:b].sum()), int(b - a), e)
                  for (a, b), e in zip(pairs, energies[1:])]
        out.blocks = [b for b in blocks if math.isfinite(b)]
    if not k:
        out.reason = (f"only {len(steady)} steady step(s) in {experiment.name}; an interval needs at least "
                      f"{MIN_STEADY_STEPS} ({BLOCKS} blocks of {MIN_BLOCK_STEPS})")
    elif len(out.blocks) < 2:
        out.reason = f"{experiment.name} has no {OBJECTIVE_WORDS[objective]} reading for its blocks of steps"
    return out


def _change(value: float) -> str:
    """A gain as core/format.py writes a change, one decimal below 10 % (a 1.3 % gain is not "+1 %")."""
    return fmt_change(value, 1 if abs(value) < 0.0995 else 0)


@dataclass(frozen=True)
class Gain:
    """``candidate``'s rate against ``reference``'s: 0.48 is +48 %. ``reason`` says why it is
    inconclusive ("" when the interval lies wholly above or below 0)."""

    objective: str
    value: float = math.nan
    low: float = math.nan
    high: float = math.nan
    reason: str = ""

    @property
    def conclusive(self) -> bool:
        return not self.reason and math.isfinite(self.value)

    def text(self) -> str:
        """``+179 % throughput (95 % CI +150 %..+210 %)``, or ``throughput inconclusive: <why>``."""
        word = OBJECTIVE_WORDS.get(self.objective, self.objective)
        if not self.conclusive:
            return f"{word} inconclusive: {self.reason or 'no rate to compare'}"
        return f"{_change(self.value)} {word} (95 % CI {_change(self.low)}..{_change(self.high)})"


def gain(candidate: RateEstimate, reference: RateEstimate) -> Gain:
    """The relative gain of ``candidate`` over ``reference`` and its 95 % interval."""
    objective = reference.objective
    if not (math.isfinite(candidate.value) and math.isfinite(reference.value) and reference.value):
        missing = candidate if not math.isfinite(candidate.value) else reference
        return Gain(objective, reason=missing.reason or "no rate to compare")
    g = candidate.value / reference.value - 1.0
    why = candidate.reason or reference.reason
    if why:
        return Gain(objective, g, reason=why)
    half = t95(min(len(candidate.blocks), len(reference.blocks)) - 1) * math.hypot(
        candidate.rel_se, reference.rel_se) * (1.0 + g)
    low, high = g - half, g + half
    if low <= 0.0 <= high:
        return Gain(objective, g, low, high, f"its 95 % interval {_change(low)}..{_change(high)} includes 0 "
                                             f"(point {_change(g)})")
    return Gain(objective, g, low, high)


def run_gain(candidate_run, reference_run, objective: str | None = None) -> Gain:
    """The gain between two saved runs (``compare()``, ``pipeline.yaml``): the same estimator
    the ``--tune`` search used, over each run's steady steps."""
    objective = objective or objective_of(candidate_run, reference_run)
    return gain(estimate(candidate_run, objective), estimate(reference_run, objective))


__all__ = ["BLOCKS", "Gain", "MIN_STEADY_STEPS", "OBJECTIVES", "OBJECTIVE_WORDS", "RateEstimate", "estimate",
           "gain", "objective_of", "run_gain", "t95", "warmup_of"]
