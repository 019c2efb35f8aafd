"""One trial: the cell run once under a profiling session, stopped after its steps.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

The trial stops at a step boundary (a step listener raises ``TrialStop``, a BaseException, so
the user's ``except Exception`` does not swallow it), every DataLoader worker it started is shut
down, its experiment is saved like any run (``context.tune`` says which tuning run and trial),
and the user's state is put back whatever happened: a raise, Ctrl-C, or the stop itself.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

from gpuprof_jupyter.core.analysis.gain import Gain
from gpuprof_jupyter.runtime.run_options import RunOptions
from gpuprof_jupyter.runtime.profile import describe_error, status_for
from gpuprof_jupyter.runtime.session import ProfileSession
from gpuprof_jupyter.core.torch_defaults import LOADER_KNOBS
from gpuprof_jupyter.runtime.tune.loader_knobs import LoaderKnobs
from gpuprof_jupyter.runtime.tune.measure import TrialFigures, measure
from gpuprof_jupyter.runtime.tune.oom import DOES_NOT_FIT, is_out_of_memory, release_memory
from gpuprof_jupyter.runtime.tune.opt_ins import OptInValues


class TrialStop(BaseException):
    """Raised at a step boundary once the trial has the steps it needs, or its time is up."""

    def __init__(self, why: str = "steps") -> None:
        super().__init__(why)
        self.why = why  # "steps" (it had them) or "budget" (the search's time ran out first)


def _stop_after(steps: int | None, deadline: float | None, clock: Callable[[], float]):
    """A step listener (runtime/hooks/activity.py) that ends the trial once ``steps`` steps are done,
    or at the first step boundary past ``deadline`` (the search's budget, on ``clock``)."""
    def listener(steps_done: int, now: float) -> bool:
        if steps is not None and steps_done >= steps:
            raise TrialStop("steps")
        if deadline is not None and clock() >= deadline:
            raise TrialStop("budget")
        return False
    return listener


@dataclass
class Trial:
    index: int
    label: str  # "baseline", "num_workers 0 -> 2"
    settings: dict  # every knob set for this trial (loader knobs and opted-in fields)
    changed: dict  # knob -> (old, new), against the baseline
    experiment: object | None = None
    figures: TrialFigures = field(default_factory=TrialFigures)
    verdict: str = ""
    gain: Gain | None = None  # against ``against`` (the best trial so far), the shared estimator's
    against: str = ""  # the name of the trial the gain is against
    error: str | None = None
    steps_run: int = 0  # every step the trial ran, warm-up included
    cut_by_budget: bool = False  # stopped by the search's budget before its steps (or the cell's end)
    unreachable: dict = field(default_factory=dict)  # knob -> why it could not be applied
    user_metrics: dict = field(default_factory=dict)
    wall_s: float = math.nan
    oom: bool = False  # it raised torch.OutOfMemoryError: its settings do not fit (oom.py)

    @property
    def name(self) -> str:
        return self.experiment.name if self.experiment is not None else f"trial {self.index}"


def run_trial(trial: Trial, body: Callable[[], object], *, run_name: str, session_options: RunOptions,
              namespace: dict, restore: Callable[[], None], objective: str, warmup: int,
              stop_after: int | None, deadline: float | None = None,
              clock: Callable[[], float] = time.monotonic, cell_source: str | None = None) -> Trial:
    """Run ``body`` once with ``trial.settings``, for ``stop_after`` steps (None: the whole cell)
    and never past ``deadline``; fill in the trial. Re-raises KeyboardInterrupt (after saving
    and restoring); any other error of the cell is kept in ``trial.error``."""
    started = time.monotonic()
    loader_settings = {k: v for k, v in trial.settings.items() if k in LOADER_KNOBS}
    opt_in_settings = {k: v for k, v in trial.settings.items() if k not in LOADER_KNOBS}
    options = session_options.replace(name=f"{run_name}-t{trial.index}",
                                      params={**session_options.params, **opt_in_settings})
    session = ProfileSession(options, cell_source=cell_source)
    error: BaseException | None = None
    knobs = LoaderKnobs(loader_settings)
    try:
        session.start()  # inside the try: Ctrl-C while it starts still stops it and restores
        session.meta.context["tune"] = {"run": run_name, "trial": trial.index, "label": trial.label,
                                        "settings": dict(trial.settings), "warmup_steps": warmup,
                                        "objective": objective}
        if (stop_after is not None or deadline is not None) and session.activity is not None:
            session.activity.step_listeners.append(_stop_after(stop_after, deadline, clock))
        with knobs, OptInValues(namespace, opt_in_settings):
            try:
                body()
            except TrialStop as stop:  # the trial had its steps (or its time) before the cell ended
                trial.cut_by_budget = stop.why == "budget"
    except BaseException as exc:  # noqa: B036, BLE001 - saved with the trial; Ctrl-C re-raised below
        error = exc
    finally:
        try:
            session.record_loaders(namespace)
            tune = session.meta.context.get("tune") if session.meta is not None else None
            if is_out_of_memory(error) and tune is not None:
                tune["verdict"] = DOES_NOT_FIT  # saved with the experiment
            trial.experiment = session.stop(status_for(error), describe_error(error))
        finally:
            restore()
            if is_out_of_memory(error):  # nothing of the failed trial stays in memory
                trial.oom = True
                release_memory(error)
    trial.unreachable = dict(knobs.unreachable)
    trial.wall_s = time.monotonic() - started
    trial.user_metrics = dict(trial.experiment.meta.user_metrics or {})
    trial.steps_run = len(trial.experiment.steps)
    trial.figures = measure(trial.experiment, objective)  # after the warm-up saved above, as compare() reads it
    if error is not None:
        trial.error = describe_error(error) or type(error).__name__
        if isinstance(error, KeyboardInterrupt):
            raise error
    return trial


__all__ = ["Trial", "TrialStop", "run_trial"]
