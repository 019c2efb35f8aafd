"""A tuning run from start to end: snapshot, baseline, search, restore.

Runs in the kernel (or the profiled script).

Used by ``%%gpuprofile --tune`` (the cell's body) and by ``gpuprof_jupyter.tune(fn)``.
Whatever happens in a trial (it raises, Ctrl-C, the budget runs out) the user's state is
restored before this returns or re-raises, and no hook or worker is left behind.
"""

from __future__ import annotations

import math
import sys
from typing import Callable

from gpuprof_jupyter.core.analysis.headroom import largest_batch
from gpuprof_jupyter.core.sources.host import allowed_cpus
from gpuprof_jupyter.core.torch_defaults import is_descriptive
from gpuprof_jupyter.kernel.tune.effective_batch import EffectiveBatch, is_follower
from gpuprof_jupyter.kernel.tune.loader_knobs import LOADER_KNOBS
from gpuprof_jupyter.kernel.tune.measure import warmup_steps
from gpuprof_jupyter.kernel.tune.opt_ins import resolve
from gpuprof_jupyter.kernel.tune.search import Coordinate, Search, TuneResult, loader_coordinates, order_coordinates
from gpuprof_jupyter.kernel.tune.spec import TuneSpec
from gpuprof_jupyter.kernel.tune.state import Snapshot
from gpuprof_jupyter.kernel.tune.trial import Trial, run_trial


def loader_baseline(params: dict) -> dict:
    """The first loader's knob values as the baseline trial recorded them (plain or prefixed keys)."""
    out: dict = {}
    for key, value in params.items():
        field = key.rsplit(".", 1)[-1]
        if field in LOADER_KNOBS and field not in out and not is_descriptive(key):
            out[field] = value
    return out


def _cuda_in_use() -> bool:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    return bool(cuda is not None and cuda.is_initialized())


def tune_body(body: Callable[[], object], spec: TuneSpec, namespace: dict, *, run_name: str,
              session_options: dict, on_trial: Callable[[Trial, bool], None] | None = None) -> TuneResult:
    """Tune ``body`` (the cell, or the user's function). KeyboardInterrupt propagates after the
    state is restored, with the result so far on the exception (``exc.tune_result``)."""
    opt_in_current = {}
    for opt in spec.opt_ins:  # a wrong field stops here, before any trial
        try:
            opt_in_current[opt.key] = resolve(namespace, opt.key)[2]
        except LookupError as exc:
            raise ValueError(str(exc)) from None
    effective = EffectiveBatch.from_opt_ins(spec.opt_ins, opt_in_current)  # a bad follower: before any trial
    snapshot = Snapshot(namespace)
    warmup = warmup_steps(spec.trial_steps)

    def run(trial: Trial, full_cell: bool) -> Trial:
        if effective is not None:  # the accumulation that keeps the effective batch
            trial.settings, trial.changed = effective.follow(trial.settings, trial.changed)
            if effective.accum_key in trial.changed:
                old, new = trial.changed[effective.accum_key]
                trial.label += f" ({effective.accum_key} {old} -> {new}: effective batch {effective.effective})"
        return run_trial(trial, body, run_name=run_name, session_options=session_options, namespace=namespace,
                         restore=snapshot.restore, objective=spec.objective, warmup=warmup,
                         stop_after=None if full_cell else warmup + spec.trial_steps)

    search = Search(spec, run_name, run, on_trial=on_trial, estimate=lambda knob, trials: _fitting_batch(
        knob, trials, effective))
    result = search.result
    try:
        reference = search.baseline(full_cell=bool(spec.opt_ins))
        if reference is None:
            return result
        first = result.trials[0].experiment
        base_loader = loader_baseline(first.meta.params if first is not None else {})
        loader, skipped = loader_coordinates(base_loader, int(allowed_cpus()), _cuda_in_use())
        result.not_tried.update(skipped)
        if not base_loader:
            result.not_tried.update({k: "no DataLoader was iterated by the cell" for k in LOADER_KNOBS})
            loader = []
        opt_coords = [Coordinate(o.key, [v for v in o.values if v != opt_in_current[o.key]], result_changing=True)
                      for o in spec.opt_ins if not is_follower(o)]
        if effective is not None:  # only batch sizes that divide the effective batch
            for coord in opt_coords:
                if coord.knob == effective.batch_key:
                    for value in [v for v in coord.values if not effective.fits(v)]:
                        result.not_tried[f"{coord.knob}={value}"] = (
                            f"not tried: {value} does not divide the effective batch {effective.effective}")
                    coord.values = [v for v in coord.values if effective.fits(v)]
        coords, result.order_reason = order_coordinates(loader, [c for c in opt_coords if c.values],
                                                        reference.data_wait_frac)
        search.run(coords, {**base_loader, **opt_in_current}, reference)
    except KeyboardInterrupt as exc:
        result.stopped = "interrupted (Ctrl-C); the trials done so far are shown"
        exc.tune_result = result
        raise
    finally:
        snapshot.restore()
    return result


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
    """Per kept knob, the evidence for it: ``num_workers 0 -> 4: +48 % throughput (95 % CI ...)``."""
    lines = {}
    for trial in result.trials:
        if not trial.verdict.startswith("kept") or not trial.changed:
            continue
        knob = trial.label.split(" ", 1)[0]
        f, base = trial.figures, result.baseline[0].figures if result.baseline else None
        lo, hi = trial.gain_ci
        text = f"{trial.label}: {100 * trial.gain:+.0f} % {result.spec.objective.replace('_', ' ')}"
        if math.isfinite(lo):
            text += f" (95 % CI {100 * lo:+.0f}..{100 * hi:+.0f} %)"
        if base is not None and math.isfinite(base.data_wait_frac) and math.isfinite(f.data_wait_frac):
            text += f", data wait {100 * base.data_wait_frac:.0f} % -> {100 * f.data_wait_frac:.0f} %"
        lines[knob] = text
    return lines


__all__ = ["loader_baseline", "tune_body", "why_lines"]
