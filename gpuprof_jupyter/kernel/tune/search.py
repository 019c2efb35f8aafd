"""The search: coordinate by coordinate, a change kept only above the noise.

Runs in the kernel (or the profiled script).

1. The baseline runs twice: the difference between the two is the trial-to-trial noise.
2. Knobs are ordered by what the baseline shows: an input-bound run (data wait >= 20 % of its
   steps) tries the loader knobs first, a compute-bound one the opted-in precision first.
3. Each knob is one coordinate: its values are tried in order from the current best settings.
   A value is kept when its gain's 95 % interval lies above the noise; the first value that
   does not beat the current best ends that direction.
4. The winner is the best trial whose ``--check`` rules all held.
5. A value that runs out of GPU memory "does not fit": larger values of that knob are not
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

from gpuprof_jupyter.core.torch_defaults import TORCH_PREFETCH_DEFAULT
from gpuprof_jupyter.kernel.tune.loader_knobs import NEEDS_WORKERS
from gpuprof_jupyter.kernel.tune.measure import TrialFigures, gain, noise, pooled
from gpuprof_jupyter.kernel.tune.oom import DOES_NOT_FIT
from gpuprof_jupyter.kernel.tune.spec import TuneSpec
from gpuprof_jupyter.kernel.tune.trial import Trial

INPUT_BOUND_WAIT = 0.2  # share of step time waiting for data from which a run counts as input-bound
MIN_NOISE = 0.02  # a gain under 2 % is never called real, however quiet the baseline looked
_PRECISION_WORDS = ("amp", "precision", "dtype", "bf16", "fp16", "half")


@dataclass
class Coordinate:
    knob: str
    values: list  # tried in this order
    result_changing: bool = False  # an opted-in field: may change results


@dataclass
class TuneResult:
    spec: TuneSpec
    run_name: str
    trials: list[Trial] = field(default_factory=list)
    best_settings: dict = field(default_factory=dict)
    noise: float = math.nan
    order_reason: str = ""
    not_tried: dict = field(default_factory=dict)  # knob -> why it was not tried or could not be applied
    stopped: str = ""  # why the search ended early ("budget", "interrupted", "the baseline raised")
    elapsed_s: float = 0.0

    @property
    def baseline(self) -> list[Trial]:
        return [t for t in self.trials if not t.changed]

    @property
    def winner(self) -> Trial | None:
        """The best trial whose checks held (a baseline repeat counts); None when none passed."""
        passing = [t for t in self.trials if t.error is None and not t.figures.checks_failed
                   and math.isfinite(t.figures.score)]
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
        return loader + opt_ins, (f"input-bound (data wait {100 * data_wait:.0f} % of step time): "
                                  "DataLoader knobs first")
    precision = [c for c in opt_ins if any(w in c.knob.lower() for w in _PRECISION_WORDS)]
    rest = [c for c in opt_ins if c not in precision]
    wait = f"data wait {100 * data_wait:.0f} %" if math.isfinite(data_wait) else "data wait unknown"
    return precision + loader + rest, f"not input-bound ({wait}): opted-in precision first, then DataLoader knobs"


class Search:
    """Drives the trials. ``run(trial, full_cell)`` fills in a Trial's figures (trial.py)."""

    def __init__(self, spec: TuneSpec, run_name: str, run: Callable[[Trial, bool], Trial],
                 clock: Callable[[], float] = time.monotonic, on_trial: Callable[[Trial, bool], None] | None = None,
                 estimate: Callable[[str, list[Trial]], object] | None = None) -> None:
        self.spec, self.run_name, self._run, self._clock = spec, run_name, run, clock
        self._estimate = estimate  # (knob, trials) -> the largest value that should fit, or None
        self._on_trial = on_trial or (lambda trial, done: None)  # (trial, False) as it starts, (trial, True) after
        self.result = TuneResult(spec, run_name)
        self._started = clock()

    # -- budget --------------------------------------------------------------------------------
    def _room_for_another(self) -> bool:
        elapsed = self._clock() - self._started
        last = max((t.wall_s for t in self.result.trials if math.isfinite(t.wall_s)), default=0.0)
        return elapsed + last <= self.spec.budget_s

    def _trial(self, label: str, settings: dict, changed: dict, full_cell: bool = False) -> Trial:
        trial = Trial(len(self.result.trials) + 1, label, dict(settings), dict(changed))
        self.result.trials.append(trial)
        self._on_trial(trial, False)
        try:
            self._run(trial, full_cell)
        finally:
            self.result.elapsed_s = self._clock() - self._started
            self._on_trial(trial, True)
        return trial

    # -- the search ----------------------------------------------------------------------------
    def baseline(self, full_cell: bool) -> TrialFigures | None:
        """Two baseline trials; None (and ``stopped`` said) when the baseline cannot be measured."""
        first = self._trial("baseline", {}, {}, full_cell)
        if first.oom:
            self.result.stopped = (f"the baseline does not fit in GPU memory ({first.error}); nothing was tuned: "
                                   "try a smaller batch first (docs/memory.md)")
            return None
        if first.error is not None:
            self.result.stopped = f"the baseline trial raised ({first.error}); nothing was tuned"
            return None
        first.verdict = "baseline"
        second = self._trial("baseline (repeat)", {}, {})
        if second.error is not None:
            self.result.stopped = f"the repeated baseline raised ({second.error}); nothing was tuned"
            return None
        second.verdict = "baseline (noise)"
        measured = [t.figures for t in (first, second) if math.isfinite(t.figures.score)]
        if not measured:
            self.result.stopped = (f"the baseline gave no steady steps to measure (it needs more than "
                                   f"{self.spec.trial_steps} steps: step() or an optimizer step)")
            return None
        self.result.noise = noise([first.figures, second.figures])
        return pooled(measured)

    def run(self, coordinates: list[Coordinate], baseline_settings: dict, reference: TrialFigures) -> TuneResult:
        result = self.result
        threshold = max(result.noise if math.isfinite(result.noise) else 0.0, MIN_NOISE)
        best_figures = reference
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
                    result.stopped = f"the budget ({self.spec.budget_s:.0f} s) was reached"
                    return result
                old = current.get(coord.knob)
                settings = {**result.best_settings, coord.knob: value}
                changed = {k: (baseline_settings.get(k), v) for k, v in settings.items()
                           if baseline_settings.get(k) != v}
                trial = self._trial(f"{coord.knob} {fmt_setting(old)} -> {fmt_setting(value)}", settings, changed,
                                    full_cell=coord.result_changing)
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
                fitted.append(value)
                trial.gain, trial.gain_ci = gain(trial.figures, best_figures)
                if math.isfinite(trial.gain_ci[0]) and trial.gain_ci[0] > threshold:
                    result.best_settings = dict(trial.settings)  # as run (a follower field included)
                    best_figures = trial.figures
                    current = {**baseline_settings, **trial.settings}
                    trial.verdict = "kept" + (" (fails a check)" if trial.figures.checks_failed else "")
                else:
                    trial.verdict = "no gain beyond the noise" if math.isfinite(trial.gain) else "not measurable"
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


def fmt_setting(value) -> str:
    """A knob's value as the tune report writes it (None: torch's default)."""
    if value is None:
        return "default"
    return str(value).lower() if isinstance(value, bool) else str(value)


__all__ = ["Coordinate", "Search", "TuneResult", "fmt_setting", "loader_coordinates", "order_coordinates"]
