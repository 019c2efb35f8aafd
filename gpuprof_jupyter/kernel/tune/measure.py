"""A trial's figures over its steady steps, with a confidence interval.

Runs in the kernel (or the profiled script).

Warm-up (the first steps: worker start-up, ``torch.compile``, caches) is excluded. The steady
steps are cut into contiguous blocks and the interval is taken over the blocks' scores, not
over single steps: with DataLoader workers, step times come in bursts (a prefetched batch, then
a wait), and single steps are not independent draws. Scores are "higher is better" for every
objective (samples/s, samples/J, steps/s), so gains compare the same way.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import numpy as np

import dataclasses

from gpuprof_jupyter.core.analysis.rules import evaluate_rule, parse_rule, stored_results
from gpuprof_jupyter.core.analysis.summary import phases_summary

BLOCKS = 5
STEADY_PHASE = "gpuprof-tune-steady"  # in memory only: the window a trial's checks are judged on
# two-sided 95 % Student t quantiles by degrees of freedom (blocks - 1)
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def warmup_steps(trial_steps: int) -> int:
    """Steps left out before measuring: at least 5 (worker start-up, the first batches, caches),
    a quarter of the trial for long ones."""
    return max(5, trial_steps // 4)


@dataclass
class TrialFigures:
    """One trial, measured. ``score``: the objective, higher is better; ``score_ci``: 95 %."""

    steps: int = 0  # steady steps measured
    samples_per_s: float = math.nan
    step_time_s: float = math.nan
    energy_per_sample_j: float = math.nan
    sm_util_mean: float = math.nan
    data_wait_frac: float = math.nan
    score: float = math.nan
    score_ci: tuple[float, float] = (math.nan, math.nan)
    blocks: list[float] = field(default_factory=list)  # per-block scores (pooled for repeats)
    checks_failed: list[str] = field(default_factory=list)
    checks_not_judged: list[str] = field(default_factory=list)  # "RULE (why)": CANNOT JUDGE on this trial
    duration_s: float = math.nan  # the whole trial, warm-up and start included

    @property
    def rel_se(self) -> float:
        """Standard error of the score, relative to it (0 when unknown)."""
        if len(self.blocks) < 2 or not self.score:
            return 0.0
        return statistics.stdev(self.blocks) / math.sqrt(len(self.blocks)) / abs(self.score)


def _ci(values: list[float]) -> tuple[float, tuple[float, float]]:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, (math.nan, math.nan)
    half = _T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, (mean - half, mean + half)


def _block_score(objective: str, samples: float, seconds: float, steps: int, energy: float) -> float:
    if objective == "energy_per_sample":
        return samples / energy if energy > 0 else math.nan
    if objective == "time":
        return steps / seconds if seconds > 0 else math.nan
    return samples / seconds if seconds > 0 else math.nan


def measure(experiment, objective: str, warmup: int) -> TrialFigures:
    """The steady-state figures of one trial's saved experiment."""
    figures = TrialFigures(duration_s=float(experiment.meta.duration_s or math.nan))
    steps = experiment.steps
    steady = steps.iloc[warmup:] if len(steps) > warmup else steps.iloc[0:0]
    if len(steady) < 2:
        stored = stored_results(experiment)
        figures.checks_failed = [r.rule for r in stored if r.judged and not r.passed]
        figures.checks_not_judged = [_unjudged(r) for r in stored if not r.judged]
        return figures
    duration = steady["duration_s"].to_numpy(dtype="float64")
    wait = steady["wait_s"].to_numpy(dtype="float64")
    n = np.nan_to_num(steady["n_samples"].to_numpy(dtype="float64"), nan=1.0)  # unknown: one sample a step
    ends = steady["t_end_s"].to_numpy(dtype="float64")
    starts = ends - duration
    k = min(BLOCKS, len(steady) // 2)
    edges = np.linspace(0, len(steady), k + 1).astype(int)
    spans = [{"name": f"block{i}", "start_s": float(starts[a]), "end_s": float(ends[b - 1])}
             for i, (a, b) in enumerate(zip(edges[:-1], edges[1:]))]
    whole = {"name": "steady", "start_s": float(starts[0]), "end_s": float(ends[-1])}
    gpu_keys = [d["key"] for d in experiment.meta.gpu_devices]
    windows = phases_summary(experiment, [whole, *spans], gpu_keys, experiment.meta.sampling_interval_s,
                             experiment.meta.gaps or [])
    blocks = []
    for (a, b), window in zip(zip(edges[:-1], edges[1:]), windows[1:]):
        blocks.append(_block_score(objective, float(n[a:b].sum()), float(duration[a:b].sum()), int(b - a),
                                   window["energy_j"]))
    blocks = [b for b in blocks if math.isfinite(b)]
    total_s, samples = float(duration.sum()), float(n.sum())
    energy = windows[0]["energy_j"]
    figures.steps = len(steady)
    figures.samples_per_s = samples / total_s
    figures.step_time_s = total_s / len(steady)
    figures.energy_per_sample_j = energy / samples if gpu_keys and samples and math.isfinite(energy) else math.nan
    figures.sm_util_mean = windows[0]["sm_util_mean"]
    figures.data_wait_frac = float(wait.sum() / total_s) if total_s > 0 else math.nan
    figures.blocks = blocks
    if blocks:
        figures.score, figures.score_ci = _ci(blocks)
    figures.checks_failed, figures.checks_not_judged = judge_checks(experiment, whole["start_s"], whole["end_s"])
    return figures


def judge_checks(experiment, start_s: float, end_s: float) -> tuple[list[str], list[str]]:
    """The cell's ``--check`` rules on the trial's steady window: (failed, not judged).

    A trial is short, so a rule over the whole run would count its warm-up (worker start-up,
    the first batches) that a full run spreads over hours. Rules on time or steps are judged
    inside the steady steps; a rule on a logged metric that the stopped trial never logged is
    not judged (it cannot fail or pass a trial); other value rules keep their stored result. A
    rule that cannot be judged (CANNOT JUDGE: a GPU metric on a host-only source, steps too
    short) neither fails nor passes the trial: it is listed as not judged, with why.
    """
    stored = stored_results(experiment)
    meta = experiment.meta
    saved_phases = meta.phases
    meta.phases = [*saved_phases, {"name": STEADY_PHASE, "start_s": start_s, "end_s": end_s}]
    failed_rules, not_judged = [], []
    try:
        for result in stored:
            rule = parse_rule(result.rule)
            if rule.is_share and rule.phase is None:
                result = evaluate_rule(experiment, dataclasses.replace(rule, phase=STEADY_PHASE))
            elif not rule.is_share and rule.phase is None and rule.metric not in meta.user_metrics and (
                    "neither logged nor" in (result.detail or "")):
                not_judged.append(f"{result.rule} (never logged before the trial stopped)")
                continue
            if not result.judged:
                not_judged.append(_unjudged(result))
            elif not result.passed:
                failed_rules.append(result.rule)
    finally:
        meta.phases = saved_phases
    return failed_rules, not_judged


def _unjudged(result) -> str:
    """``"RULE (why it cannot be judged)"``, in the trial's words (not the internal phase name)."""
    why = result.detail.replace(f"in phase {STEADY_PHASE!r}", "in the steady steps")
    no_gpu = result.to_judge.partition(":")[0] if "read no GPU" in result.to_judge else ""
    return f"{result.rule} ({why}{': ' + no_gpu if no_gpu else ''})"


def pooled(trials: list[TrialFigures]) -> TrialFigures:
    """Repeats of one setting as one: blocks pooled, means averaged (the baseline's reference)."""
    blocks = [b for t in trials for b in t.blocks]
    out = TrialFigures(steps=sum(t.steps for t in trials), blocks=blocks,
                       checks_failed=sorted({c for t in trials for c in t.checks_failed}),
                       checks_not_judged=sorted({c for t in trials for c in t.checks_not_judged}))
    for name in ("samples_per_s", "step_time_s", "energy_per_sample_j", "sm_util_mean", "data_wait_frac"):
        values = [getattr(t, name) for t in trials if math.isfinite(getattr(t, name))]
        setattr(out, name, statistics.fmean(values) if values else math.nan)
    if blocks:
        out.score, out.score_ci = _ci(blocks)
    return out


def gain(candidate: TrialFigures, reference: TrialFigures) -> tuple[float, tuple[float, float]]:
    """Relative gain of ``candidate`` over ``reference`` (0.48: +48 %) with its 95 % interval."""
    if not (candidate.score and reference.score) or math.isnan(candidate.score) or math.isnan(reference.score):
        return math.nan, (math.nan, math.nan)
    g = candidate.score / reference.score - 1.0
    se = math.hypot(candidate.rel_se, reference.rel_se) * (1.0 + g)
    return g, (g - 1.96 * se, g + 1.96 * se)


def noise(repeats: list[TrialFigures]) -> float:
    """Trial-to-trial noise: the largest relative difference between repeats of the baseline."""
    scores = [t.score for t in repeats if math.isfinite(t.score)]
    if len(scores) < 2:
        return math.nan
    return (max(scores) - min(scores)) / statistics.fmean(scores)


__all__ = ["TrialFigures", "gain", "measure", "noise", "pooled", "warmup_steps"]
