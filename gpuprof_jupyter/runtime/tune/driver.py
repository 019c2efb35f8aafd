"""A tuning run from start to end: snapshot, baseline, search, restore.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

Used by ``%%gpuprofile --tune`` (the cell's body) and by ``gpuprof_jupyter.tune(fn)``.
Whatever happens in a trial (it raises, Ctrl-C, the budget runs out) the user's state is
restored before this returns or re-raises, and no hook or worker is left behind.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Callable

from gpuprof_jupyter.core.analysis.headroom import largest_batch
from gpuprof_jupyter.core.analysis.run_figures import step_figure
from gpuprof_jupyter.core.format import fmt_figure
from gpuprof_jupyter.runtime.run_options import RunOptions
from gpuprof_jupyter.core.sources.host import allowed_cpus
from gpuprof_jupyter.core.torch_defaults import LOADER_KNOBS, is_descriptive
from gpuprof_jupyter.runtime.tune.effective_batch import EffectiveBatch, is_follower
from gpuprof_jupyter.runtime.tune.measure import warmup_steps
from gpuprof_jupyter.runtime.tune.opt_ins import resolve
from gpuprof_jupyter.runtime.tune.search import Coordinate, Search, TrialPlan, TuneResult, loader_coordinates, \
    order_coordinates, plan_lines, tried_line
from gpuprof_jupyter.runtime.tune.spec import TuneSpec
from gpuprof_jupyter.runtime.tune.state import Snapshot
from gpuprof_jupyter.runtime.tune.trial import Trial, run_trial


def loader_baseline(params: dict) -> dict:
    """The first loader's knob values as the baseline trial recorded them (plain or prefixed keys)."""
    out: dict = {}
    for key, value in params.items():
        field = key.rsplit(".", 1)[-1]
        if field in LOADER_KNOBS and field not in out and not is_descriptive(key):
            out[field] = value
    return out


def earlier_run(store, cell_source: str | None):
    """The latest finished run of the cell ``cell_source`` in ``store`` that recorded steps (a
    profiled run of it, or a trial of an earlier search), as an Experiment whose steps load when
    read: the plan's time estimate comes from them."""
    want = (cell_source or "").strip()
    if not want or store is None:
        return None
    try:
        metas = store.list()
    except Exception:  # noqa: BLE001 - an unreadable store: no estimate yet, the search still runs
        return None
    for meta in reversed(metas):
        steps = (meta.summary or {}).get("steps") or {}
        if (meta.status == "ok" and str((meta.context or {}).get("cell_source") or "").strip() == want
                and steps.get("count") and steps.get("step_time_p50_s")):
            return store.load_meta(meta)
    return None


def trial_estimate(run, plan: TrialPlan) -> tuple[float, str] | None:
    """(seconds, run name) one trial of ``plan`` should take, from an earlier run of the cell:
    the time from its start to the end of its step ``plan.steps``, the steps a trial runs, its
    slow first ones (DataLoader workers starting, compilation) included; None when that run
    cannot tell (fewer steps, or a trial that may have stopped before the cell's end)."""
    if run is None:
        return None
    meta = run.meta
    if plan.steps is not None:
        try:
            ends = run.steps["t_end_s"].to_numpy(dtype="float64")
        except (KeyError, OSError, ValueError):  # steps gone or unreadable: no estimate yet
            return None
        return (float(ends[plan.steps - 1]), repr(meta.name)) if len(ends) >= plan.steps else None
    if (meta.context or {}).get("tune") or not meta.duration_s:
        return None
    return float(meta.duration_s), repr(meta.name)


def _cuda_in_use() -> bool:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    return bool(cuda is not None and cuda.is_initialized())


def tune_body(body: Callable[[], object], spec: TuneSpec, namespace: dict, *, run_name: str,
              session_options: RunOptions, on_trial: Callable[[Trial, bool], None] | None = None,
              on_plan: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic,
              earlier=None, cell_source: str | None = None) -> TuneResult:
    """Tune ``body`` (the cell, or the user's function). KeyboardInterrupt propagates after the
    state is restored, with the result so far on the exception (``exc.tune_result``).
    ``on_plan`` is told what the search will run before the first trial (and its estimated
    time, from ``earlier``, an earlier run of the same cell, when there is one; else once the
    first trial has run)."""
    opt_in_current = {}
    for opt in spec.opt_ins:  # a wrong field stops here, before any trial
        try:
            opt_in_current[opt.key] = resolve(namespace, opt.key)[2]
        except LookupError as exc:
            raise ValueError(str(exc)) from None
    effective = EffectiveBatch.from_opt_ins(spec.opt_ins, opt_in_current)  # a bad follower: before any trial
    snapshot = Snapshot(namespace)
    warmup = warmup_steps(spec.trial_steps)
    plan = (TrialPlan(warmup, None, "an opted-in field may change what the cell logs at its end, so every trial, "
                                    "the baseline included, runs the whole cell") if spec.opt_ins
            else TrialPlan(warmup, warmup + spec.trial_steps))

    def run(trial: Trial, steps: int | None, deadline: float | None) -> Trial:
        if effective is not None:  # the accumulation that keeps the effective batch
            trial.settings, trial.changed = effective.follow(trial.settings, trial.changed)
            if effective.accum_key in trial.changed:
                old, new = trial.changed[effective.accum_key]
                trial.label += f" ({effective.accum_key} {old} -> {new}: effective batch {effective.effective})"
        return run_trial(trial, body, run_name=run_name, session_options=session_options, namespace=namespace,
                         restore=snapshot.restore, objective=spec.objective, warmup=warmup,
                         stop_after=steps, deadline=deadline, clock=clock, cell_source=cell_source)

    search = Search(spec, run_name, run, plan, clock=clock, on_trial=on_trial, on_plan=on_plan,
                    estimate=lambda knob, trials: _fitting_batch(knob, trials, effective))
    result = search.result
    cpus, cuda = int(allowed_cpus()), _cuda_in_use()
    opt_coords = [Coordinate(o.key, [v for v in o.values if v != opt_in_current[o.key]], result_changing=True)
                  for o in spec.opt_ins if not is_follower(o)]
    if effective is not None:  # only batch sizes that divide the effective batch
        for coord in opt_coords:
            if coord.knob == effective.batch_key:
                for value in [v for v in coord.values if not effective.fits(v)]:
                    result.not_tried[f"{coord.knob}={value}"] = (
                        f"not tried: {value} does not divide the effective batch {effective.effective}")
                coord.values = [v for v in coord.values if effective.fits(v)]
    lines, result.planned_trials = plan_lines(plan, loader_coordinates({}, cpus, cuda)[0],
                                              [c for c in opt_coords if c.values], spec, trial_estimate(earlier, plan))
    for line in lines:
        search.say(line)
    try:
        reference = search.baseline()
        if reference is None:
            return result
        first = result.trials[0].experiment
        base_loader = loader_baseline(first.meta.params if first is not None else {})
        loader, skipped = loader_coordinates(base_loader, cpus, cuda)
        result.not_tried.update(skipped)
        if not base_loader:
            result.not_tried.update({k: "no DataLoader was iterated by the cell" for k in LOADER_KNOBS})
            loader = []
        coords, result.order_reason = order_coordinates(loader, [c for c in opt_coords if c.values],
                                                        reference_wait(result))
        search.say(tried_line(coords, max(t.wall_s for t in result.trials), spec.budget_s - result.elapsed_s))
        search.run(coords, {**base_loader, **opt_in_current}, reference)
    except KeyboardInterrupt as exc:
        result.stopped = "interrupted (Ctrl-C); the trials done so far are shown"
        exc.tune_result = result
        raise
    finally:
        snapshot.restore()
        result.not_restored = snapshot.not_restored()
    return result


def reference_wait(result: TuneResult) -> float:
    """The baseline's data-wait share (its two runs' mean), which orders the knobs."""
    waits = [t.figures.data_wait_frac for t in result.baseline if math.isfinite(t.figures.data_wait_frac)]
    return sum(waits) / len(waits) if waits else math.nan


def _fitting_batch(knob: str, trials: list[Trial], effective: EffectiveBatch | None):
    """After a batch size ran out of memory: the largest batch that fits (``largest_batch`` over
    the trials that ran), a divisor of the effective batch when one is kept; None when not known."""
    if "batch" not in knob.rsplit(".", 1)[-1].lower():
        return None
    runs = [t.experiment for t in trials if t.error is None and t.experiment is not None]
    try:
        batch = largest_batch(runs).batch
    except ValueError:
        return None
    if batch and effective is not None:
        batch = effective.largest_divisor(batch)
    return batch or None


def why_lines(result: TuneResult) -> dict[str, str]:
    """Per kept knob, the evidence for it: ``num_workers 0 -> 4: +48 % throughput (95 % CI ...)
    against tune-t1``, the gain the table shows for that trial."""
    lines = {}
    for trial in result.trials:
        if not trial.verdict.startswith("kept") or not trial.changed or trial.gain is None:
            continue
        knob = trial.label.split(" ", 1)[0]
        f, base = trial.figures, result.baseline[0].figures if result.baseline else None
        text = f"{trial.label}: {trial.gain.text()} against {trial.against}"
        if base is not None and math.isfinite(base.data_wait_frac) and math.isfinite(f.data_wait_frac):
            text += (f", data wait {fmt_figure(step_figure(base.data_wait_frac, 'share'))} -> "
                     f"{fmt_figure(step_figure(f.data_wait_frac, 'share'))}")
        lines[knob] = text
    return lines


__all__ = ["earlier_run", "loader_baseline", "trial_estimate", "tune_body", "why_lines"]
