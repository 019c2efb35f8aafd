"""The search: coordinate by coordinate, a change kept only above the noise, like for like.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

1. Every trial of one search runs the same way (``TrialPlan``): the same number of steps, or
   the whole cell each time when an opted-in field needs the whole cell (the metric the cell
   logs at its end). The plan and its estimated time are said before the first trial.
2. The baseline runs twice: the difference between the two is the trial-to-trial noise.
3. Knobs are ordered by what the baseline shows: an input-bound run (data wait >= 20 % of its
   steps) tries the loader knobs first, a compute-bound one the opted-in precision first.
4. Each knob is one coordinate: its values are tried in order from the current best settings.
   A value is kept when its gain's 95 % interval (``core/analysis/gain.py``, the estimator
   every view shares) lies above the threshold: the noise, at least ``MIN_NOISE``; the first
   value that does not beat the current best ends that direction.
5. The winner is the best trial whose ``--check`` rules all held.
6. ``--budget`` holds: no trial starts that would not fit (judged from the longest so far), and
   a trial still running when the budget ends is stopped at a step boundary and not compared.
7. A value that runs out of GPU memory "does not fit": larger values of that knob are not
   tried, smaller ones still are, and ``estimate`` (the driver's largest-batch fit over the
   trials so far) may add the largest value between the best that fitted and the one that
   did not (oom.py, docs/tune.md).

``run`` (a trial runner) is passed in, so the search itself is tested without a kernel.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

from gpuprof_jupyter.core.analysis.run_figures import step_figure
from gpuprof_jupyter.core.figure import estimated, measured
from gpuprof_jupyter.core.format import fmt_figure, fmt_setting, fmt_unit
from gpuprof_jupyter.core.torch_defaults import NEEDS_WORKERS, TORCH_PREFETCH_DEFAULT
from gpuprof_jupyter.core.analysis.gain import MIN_STEADY_STEPS, OBJECTIVE_WORDS, RateEstimate, gain
from gpuprof_jupyter.runtime.tune.measure import noise
from gpuprof_jupyter.runtime.tune.oom import DOES_NOT_FIT
from gpuprof_jupyter.runtime.tune.spec import TuneSpec
from gpuprof_jupyter.runtime.tune.trial import Trial

INPUT_BOUND_WAIT = 0.2  # share of step time waiting for data from which a run counts as input-bound
MIN_NOISE = 0.02  # a gain under 2 % is never called real, however quiet the baseline looked
BASELINE_SHARE = 0.25  # of the budget, for a whole-cell baseline: the repeat and two trials must fit too
_PRECISION_WORDS = ("amp", "precision", "dtype", "bf16", "fp16", "half")


@dataclass
class Coordinate:
    knob: str
    values: list  # tried in this order
    result_changing: bool = False  # an opted-in field: may change results


@dataclass
class TrialPlan:
    """How the baseline and every trial of one search run: ``steps`` steps each (warm-up
    included), or the whole cell each (``steps`` None)."""

    warmup: int
    steps: int | None
    why: str = ""  # why the whole cell, or why the steps changed

    def shape(self) -> str:
        if self.steps is None:
            return "the whole cell"
        return f"{self.steps} steps ({self.warmup} warm-up + {self.steps - self.warmup} measured)"


@dataclass
class TuneResult:
    spec: TuneSpec
    run_name: str
    trials: list[Trial] = field(default_factory=list)
    best_settings: dict = field(default_factory=dict)
    noise: float = math.nan
    threshold: float = math.nan  # the gain a change's interval had to clear: max(noise, MIN_NOISE)
    plan: TrialPlan | None = None
    plan_text: list[str] = field(default_factory=list)  # what the search said it would run, and when
    order_reason: str = ""
    not_tried: dict = field(default_factory=dict)  # knob -> why it was not tried or could not be applied
    stopped: str = ""  # why the search ended early ("budget", "interrupted", "the baseline raised")
    not_restored: list[str] = field(default_factory=list)  # what the trials left changed (runtime/tune/state.py)
    elapsed_s: float = 0.0
    planned_trials: int = 0

    @property
    def baseline(self) -> list[Trial]:
        return [t for t in self.trials if not t.changed]

    @property
    def winner(self) -> Trial | None:
        """The kept trial with the best settings when its checks held, else the best baseline or kept
        trial whose checks held (a baseline repeat counts); None when none passed. A trial that was
        not kept (inconclusive, under the noise, not compared) never wins."""
        passing = [t for t in self.trials if t.error is None and not t.figures.checks_failed
                   and math.isfinite(t.figures.score) and t.verdict.startswith(("baseline", "kept"))]
        kept = [t for t in passing if t.changed and t.settings == self.best_settings]
        if kept:
            return kept[-1]
        return max(passing, key=lambda t: t.figures.score, default=None)


def loader_coordinates(baseline: dict, cpus: int, cuda_in_use: bool) -> tuple[list[Coordinate], dict]:
    """The loader knobs to try from the baseline loader's settings, and those left out (why)."""
    workers = int(baseline.get("num_workers") or 0)
    candidates = [w for w in (2, 4, 8, 16, 32) if workers < w <= max(cpus, 1)] or (
        [1] if workers == 0 and cpus >= 1 else [])
    coords, skipped = [], {}
    if candidates:
        coords.append(Coordinate("num_workers", candidates))
    else:
        skipped["num_workers"] = f"already {workers}, as many as the {cpus} CPU(s) this process may use"
    prefetch = baseline.get("prefetch_factor") or TORCH_PREFETCH_DEFAULT
    coords.append(Coordinate("prefetch_factor", [v for v in (4, 8) if v > prefetch]))
    if not baseline.get("persistent_workers"):
        coords.append(Coordinate("persistent_workers", [True]))
    if cuda_in_use:
        if not baseline.get("pin_memory"):
            coords.append(Coordinate("pin_memory", [True]))
    else:
        skipped["pin_memory"] = "not tried: CUDA is not in use in this process (pinned memory only speeds up copies to a GPU)"
    return [c for c in coords if c.values], skipped


def order_coordinates(loader: list[Coordinate], opt_ins: list[Coordinate], data_wait: float) -> tuple[list, str]:
    """Input-bound: loader knobs first. Otherwise the opted-in precision first."""
    if math.isfinite(data_wait) and data_wait >= INPUT_BOUND_WAIT:
        return loader + opt_ins, (f"input-bound (data wait {fmt_figure(step_figure(data_wait, 'share'))} of step "
                                  "time): DataLoader knobs first")
    precision = [c for c in opt_ins if any(w in c.knob.lower() for w in _PRECISION_WORDS)]
    rest = [c for c in opt_ins if c not in precision]
    wait = f"data wait {fmt_figure(step_figure(data_wait, 'share'))}" if math.isfinite(data_wait) else "data wait unknown"
    return precision + loader + rest, f"not input-bound ({wait}): opted-in precision first, then DataLoader knobs"


class Search:
    """Drives the trials. ``run(trial, steps, deadline)`` runs one for ``steps`` steps (None: the
    whole cell), never past ``deadline`` on ``clock``, and fills in its figures (trial.py)."""

    def __init__(self, spec: TuneSpec, run_name: str, run: Callable[[Trial, int | None, float | None], Trial],
                 plan: TrialPlan, clock: Callable[[], float] = time.monotonic,
                 on_trial: Callable[[Trial, bool], None] | None = None,
                 on_plan: Callable[[str], None] | None = None,
                 estimate: Callable[[str, list[Trial]], object] | None = None) -> None:
        self.spec, self.run_name, self._run, self._clock = spec, run_name, run, clock
        self._estimate = estimate  # (knob, trials) -> the largest value that should fit, or None
        self._on_trial = on_trial or (lambda trial, done: None)  # (trial, False) as it starts, (trial, True) after
        self._on_plan = on_plan or (lambda text: None)
        self.result = TuneResult(spec, run_name, plan=plan)
        self._started = clock()

    def say(self, text: str) -> None:
        """A line of the plan, kept in the result and told as it is decided."""
        self.result.plan_text.append(text)
        self._on_plan(text)

    # -- budget --------------------------------------------------------------------------------
    @property
    def _deadline(self) -> float:
        return self._started + self.spec.budget_s

    def _room_for_another(self) -> bool:
        elapsed = self._clock() - self._started
        last = max((t.wall_s for t in self.result.trials if math.isfinite(t.wall_s)), default=0.0)
        return elapsed + last <= self.spec.budget_s

    def _trial(self, label: str, settings: dict, changed: dict, deadline: float | None = None) -> Trial:
        trial = Trial(len(self.result.trials) + 1, label, dict(settings), dict(changed))
        self.result.trials.append(trial)
        self._on_trial(trial, False)
        try:
            self._run(trial, self.result.plan.steps, min(deadline or self._deadline, self._deadline))
        finally:
            self.result.elapsed_s = self._clock() - self._started
            self._on_trial(trial, True)
        return trial

    def _unequal(self, trial: Trial) -> str:
        """Why ``trial`` did not run as the plan says (cut by the budget, or the cell ended before
        the plan's steps); "" when it did. Such a trial is not compared."""
        plan = self.result.plan
        if trial.cut_by_budget:
            return (f"stopped by the budget after {trial.steps_run} step(s), before "
                    f"{'the cell ended' if plan.steps is None else f'its {plan.steps}'}: not compared")
        if plan.steps is not None and trial.error is None and trial.steps_run < plan.steps:
            return (f"the cell ended after {trial.steps_run} step(s), before the {plan.steps} every trial runs: "
                    "not compared")
        return ""

    # -- the search ----------------------------------------------------------------------------
    def baseline(self) -> RateEstimate | None:
        """Two baseline trials; the first one's rate (the reference every gain of the search is
        against), or None (and ``stopped`` said) when the baseline cannot be measured."""
        result, plan = self.result, self.result.plan
        whole = plan.steps is None
        # a whole-cell baseline may use a quarter of the budget: the repeat and two trials must fit
        first = self._trial("baseline", {}, {}, self._started + self.spec.budget_s * BASELINE_SHARE if whole else None)
        if first.oom:
            result.stopped = (f"the baseline does not fit in GPU memory ({first.error}); nothing was tuned: "
                              "try a smaller batch first (docs/memory.md)")
            return None
        if first.error is not None:
            result.stopped = f"the baseline trial raised ({first.error}); nothing was tuned"
            return None
        if whole and first.cut_by_budget:
            if first.steps_run < plan.warmup + MIN_STEADY_STEPS:
                result.stopped = (f"the cell ran {first.steps_run} step(s) in a quarter of the budget, fewer than "
                                  f"the {plan.warmup + MIN_STEADY_STEPS} a measured trial needs; raise --budget")
                return None
            result.plan = plan = TrialPlan(plan.warmup, first.steps_run,
                                           f"the cell outlasted a quarter of the budget "
                                           f"({fmt_unit(self.spec.budget_s * BASELINE_SHARE, 's', 0)}), so every trial runs the "
                                           f"{first.steps_run} steps the baseline reached; what the cell logs at "
                                           "its end is not measured")
            first.cut_by_budget = False  # it defines the plan now
            self.say(f"plan changed: each trial runs {plan.shape()}: {plan.why}")
        elif first.cut_by_budget:
            result.stopped = f"the baseline was {self._unequal(first)}; nothing was tuned"
            return None
        elif self._unequal(first):  # a short cell: every trial runs all of it, as the baseline did
            if first.steps_run < plan.warmup + MIN_STEADY_STEPS:
                result.stopped = (f"the cell ran {first.steps_run} step(s), fewer than the {plan.warmup} warm-up "
                                  f"+ {MIN_STEADY_STEPS} steady steps a measured trial needs; nothing was tuned")
                return None
            result.plan = plan = TrialPlan(plan.warmup, None, f"the cell has {first.steps_run} steps, fewer than "
                                                              f"the {plan.steps} planned")
            self.say(f"plan changed: each trial runs {plan.shape()}: {plan.why}")
        first.verdict = "baseline"
        self.say(self.estimate_line(first.wall_s))
        second = self._trial("baseline (repeat)", {}, {})
        if second.error is not None:
            result.stopped = f"the repeated baseline raised ({second.error}); nothing was tuned"
            return None
        if self._unequal(second):
            second.verdict = self._unequal(second)
            result.stopped = f"the repeated baseline was {second.verdict}; nothing was tuned"
            return None
        second.verdict = "baseline (noise)"
        if not math.isfinite(first.figures.score):
            result.stopped = (f"the baseline gave no steady steps to measure (it needs more than "
                              f"{plan.warmup} warm-up steps: step() or an optimizer step)")
            return None
        result.noise = noise([first.figures, second.figures])
        return first.figures.rate

    def estimate_line(self, trial_s: float) -> str:
        """The search's estimated time, from one trial's: said once the first trial has run."""
        at_most = self.result.planned_trials or 2
        total = at_most * trial_s
        fitting = max(1, int(self.spec.budget_s // trial_s)) if trial_s > 0 else at_most
        fits = "" if total <= self.spec.budget_s else (
            f"; the budget ({fmt_unit(self.spec.budget_s, 's', 0)}) stops it after about {fitting} trial(s)")
        per = measured(trial_s, "s", "the first trial's wall time")
        estimate = estimated(total, "s", f"{at_most} trial(s) x the first trial's time")
        return f"estimated time: {at_most} trial(s) at most x {fmt_figure(per)} = {fmt_figure(estimate, labelled=False)}{fits}"

    def run(self, coordinates: list[Coordinate], baseline_settings: dict, reference: RateEstimate) -> TuneResult:
        result = self.result
        result.threshold = threshold = max(result.noise if math.isfinite(result.noise) else 0.0, MIN_NOISE)
        best_rate, best_name = reference, result.trials[0].name
        for coord in coordinates:
            current = {**baseline_settings, **result.best_settings}
            if coord.knob in NEEDS_WORKERS and not int(current.get("num_workers") or 0):
                result.not_tried.setdefault(coord.knob, "not tried: it needs DataLoader workers, and none won")
                continue
            pending, ceiling, fitted = list(coord.values), None, []  # ceiling: the smallest value that did not fit
            while pending:
                value = pending.pop(0)
                if _at_or_above(value, ceiling):
                    result.not_tried.setdefault(f"{coord.knob}={fmt_setting(value)}", f"not tried: {coord.knob} "
                                                f"{fmt_setting(ceiling)} did not fit in GPU memory")
                    continue
                if not self._room_for_another():
                    result.stopped = f"the budget ({fmt_unit(self.spec.budget_s, 's', 0)}) was reached"
                    return result
                old = current.get(coord.knob)
                settings = {**result.best_settings, coord.knob: value}
                changed = {k: (baseline_settings.get(k), v) for k, v in settings.items()
                           if baseline_settings.get(k) != v}
                trial = self._trial(f"{coord.knob} {fmt_setting(old)} -> {fmt_setting(value)}", settings, changed)
                for knob, why in trial.unreachable.items():
                    result.not_tried.setdefault(knob, why)
                if trial.oom:  # an answer, not a failure: go on below this value
                    trial.verdict = DOES_NOT_FIT
                    ceiling = value if ceiling is None or _at_or_above(ceiling, value) else ceiling
                    pending[:0] = self._below(coord.knob, ceiling, [old, *fitted], pending)
                    continue
                if trial.error is not None:
                    trial.verdict = f"raised: {trial.error}"
                    break
                if coord.knob in trial.unreachable:
                    trial.verdict = "not applied: " + trial.unreachable[coord.knob]
                    break
                unequal = self._unequal(trial)
                if unequal:
                    trial.verdict = unequal
                    if trial.cut_by_budget:
                        result.stopped = f"the budget ({fmt_unit(self.spec.budget_s, 's', 0)}) was reached during {trial.name}"
                        return result
                    break
                fitted.append(value)
                trial.gain, trial.against = gain(trial.figures.rate, best_rate), best_name
                if trial.gain.conclusive and trial.gain.low > threshold:
                    result.best_settings = dict(trial.settings)  # as run (a follower field included)
                    best_rate, best_name = trial.figures.rate, trial.name
                    current = {**baseline_settings, **trial.settings}
                    trial.verdict = "kept" + (" (fails a check)" if trial.figures.checks_failed else "")
                else:
                    found = trial.gain
                    trial.verdict = (found.text() if not found.conclusive else f"slower: {found.text()}"
                                     if found.high < 0 else "no gain beyond the noise")
                    break
        return result

    def _below(self, knob: str, ceiling, fitted: list, pending: list) -> list:
        """After ``knob`` = ``ceiling`` ran out of memory: the estimated largest value that fits,
        when it lies between the largest value that fitted and the ceiling and is not queued."""
        if self._estimate is None:
            return []
        value = self._estimate(knob, self.result.trials)
        floor = max((v for v in fitted if _is_number(v)), default=None)
        if not _is_number(value) or _at_or_above(value, ceiling) or (floor is not None and value <= floor):
            return []
        return [] if value in pending else [value]


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _at_or_above(value, ceiling) -> bool:
    """Whether ``value`` is at or above a numeric ``ceiling`` (never for non-numbers)."""
    return _is_number(value) and _is_number(ceiling) and value >= ceiling


def plan_lines(plan: TrialPlan, loader_at_most: list[Coordinate], opt_ins: list[Coordinate],
               spec: TuneSpec, per_trial: tuple[float, str] | None = None) -> tuple[list[str], int]:
    """What the search will run, said before the first trial, and how many trials at most.
    ``per_trial``: (seconds, from which run) when an earlier run of the cell tells a trial's time."""
    trials = 2 + sum(len(c.values) for c in [*loader_at_most, *opt_ins])
    listed = lambda coords: ", ".join(f"{c.knob} {'/'.join(fmt_setting(v) for v in c.values)}" for c in coords)  # noqa: E731
    then = [f"the opted-in {listed(opt_ins)}"] if opt_ins else []
    if loader_at_most:
        then.insert(0, f"if the cell iterates a DataLoader, {listed(loader_at_most)}")
    lines = [f"plan: the baseline twice, then {'; '.join(then) or 'nothing else'}: at most {trials} trials, each "
             f"{plan.shape()}" + (f" ({plan.why})" if plan.why else ""),
             "estimated time: " + (_estimate(trials, plan, per_trial) if per_trial is not None
                                   else f"at most {trials} x one trial's time (said once the first has run)")
             + f", and never past --budget {fmt_unit(spec.budget_s, 's', 0)}: a trial still running then is stopped and not "
             "compared; each change "
             f"is judged on {OBJECTIVE_WORDS[spec.objective]} against the best trial so far"]
    return lines, trials


def _estimate(trials: int, plan: TrialPlan, per_trial: tuple[float, str]) -> str:
    """'at most 6 x about 2.3 s (from 'first', an earlier run of this cell: its first 15 steps, warm-up
    included; start and stop not counted) = 13.8 s': an estimate, its basis said once."""
    seconds, run = per_trial
    basis = (f"from {run}, an earlier run of this cell: "
             + (f"its first {plan.steps} steps, warm-up included" if plan.steps is not None else "the whole cell")
             + "; start and stop not counted")
    per, total = estimated(seconds, "s", basis), estimated(trials * seconds, "s", basis)
    return f"at most {trials} x about {fmt_figure(per, labelled=False)} ({per.basis}) = {fmt_figure(total, labelled=False)}"


def tried_line(coordinates: list[Coordinate], trial_s: float, left_s: float) -> str:
    """Once the baseline has run: the knobs the search will try and the time that takes (an
    estimate: the slowest trial so far, once per trial left)."""
    more = sum(len(c.values) for c in coordinates)
    if not more:
        return "nothing more to try after the baseline"
    per = measured(trial_s, "s", "the slowest trial so far (its wall time)")
    total = estimated(more * trial_s, "s", "the slowest trial so far, once per trial left")
    left = measured(left_s, "s", "the search's clock")
    return (f"trying {', '.join(c.knob for c in coordinates)}: at most {more} more trial(s) x {fmt_figure(per)} = "
            f"{fmt_figure(total)} ({fmt_figure(left)} of the budget left)")



__all__ = ["Coordinate", "MIN_NOISE", "Search", "TrialPlan", "TuneResult", "loader_coordinates",
           "order_coordinates", "plan_lines", "tried_line"]
