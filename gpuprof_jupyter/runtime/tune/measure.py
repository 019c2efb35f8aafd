"""A trial's figures over its steady steps, with a confidence interval.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

Warm-up (the first steps: worker start-up, ``torch.compile``, caches) is excluded and its
length saved with the trial (``context.tune.warmup_steps``), so ``compare()`` and
``pipeline.yaml`` measure the same steady steps. The rate and its interval come from the one
estimator every view shares (``core/analysis/gain.py``). Scores are "higher is better" for
every objective (samples/s, samples/J, steps/s), so gains compare the same way.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field

from gpuprof_jupyter.core.analysis.gain import MIN_STEADY_STEPS, RateEstimate, estimate, warmup_of
from gpuprof_jupyter.core.analysis.rules import evaluate_rule, parse_rule, stored_results

STEADY_PHASE = "gpuprof-tune-steady"  # in memory only: the window a trial's checks are judged on


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
    rate: RateEstimate | None = None  # the shared estimator's reading (core/analysis/gain.py)
    checks_failed: list[str] = field(default_factory=list)
    checks_not_judged: list[str] = field(default_factory=list)  # "RULE (why)": CANNOT JUDGE on this trial
    duration_s: float = math.nan  # the whole trial, warm-up and start included


def measure(experiment, objective: str) -> TrialFigures:
    """The steady-state figures of one trial's saved experiment, after the warm-up it saved
    (``context.tune.warmup_steps``): the one the comparison and pipeline.yaml leave out too, so
    one pair has one gain wherever it is shown."""
    figures = TrialFigures(duration_s=float(experiment.meta.duration_s or math.nan))
    warmup = warmup_of(experiment)
    rate = estimate(experiment, objective, warmup=warmup, windows=True)
    figures.rate, figures.steps = rate, rate.steps
    steps = experiment.steps
    steady = steps.iloc[warmup:] if len(steps) > warmup else steps.iloc[0:0]
    if not len(steady) or not math.isfinite(rate.value):
        stored = stored_results(experiment)
        figures.checks_failed = [r.rule for r in stored if r.judged and not r.passed]
        figures.checks_not_judged = [_unjudged(r) for r in stored if not r.judged]
        return figures
    total_s = float(steady["duration_s"].sum())
    samples = float(steady["n_samples"].fillna(1.0).sum())
    energy = rate.windows[0]["energy_j"] if rate.windows else math.nan
    figures.samples_per_s = samples / total_s if total_s > 0 else math.nan
    figures.step_time_s = total_s / len(steady)
    figures.energy_per_sample_j = energy / samples if samples and math.isfinite(energy) else math.nan
    figures.sm_util_mean = rate.windows[0]["sm_util_mean"] if rate.windows else math.nan
    figures.data_wait_frac = float(steady["wait_s"].sum() / total_s) if total_s > 0 else math.nan
    figures.score, figures.score_ci = rate.value, rate.interval
    end = float(steady["t_end_s"].iloc[-1])
    start = float(steady["t_end_s"].iloc[0] - steady["duration_s"].iloc[0])
    figures.checks_failed, figures.checks_not_judged = judge_checks(experiment, start, end)
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


def noise(repeats: list[TrialFigures]) -> float:
    """Trial-to-trial noise: the largest relative difference between repeats of the baseline."""
    scores = [t.score for t in repeats if math.isfinite(t.score)]
    if len(scores) < 2:
        return math.nan
    return (max(scores) - min(scores)) / statistics.fmean(scores)


__all__ = ["MIN_STEADY_STEPS", "TrialFigures", "measure", "noise", "warmup_steps"]
