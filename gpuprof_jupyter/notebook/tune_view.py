"""``--tune``'s result in a notebook or a script (``TuneReport``), and ``gpuprof_jupyter.tune()`` for scripts.

Runs in the kernel.

``TuneReport`` holds what a search found and shows it through ``render/tune_table.py`` (the
notes, the table of trials, the winner against the baseline, what to run next: text in a
script, HTML in a notebook). ``TuneReport.export_pipeline`` writes the winner with each kept
change's evidence as its comment.
"""

from __future__ import annotations

import inspect

from gpuprof_jupyter.runtime.option_table import TUNE, options_of
from gpuprof_jupyter.runtime.tune.driver import earlier_run, tune_body, why_lines
from gpuprof_jupyter.core.analysis.gain import Gain, gain
from gpuprof_jupyter.runtime.tune.search import MIN_NOISE, TuneResult
from gpuprof_jupyter.runtime.tune.spec import make_spec
from gpuprof_jupyter.render.tune_table import tune_html, tune_next_line, tune_notes, tune_rows, tune_text, trial_progress_text


class TuneReport:
    """What a tuning run found. Shown as a table in a notebook, as text in a script."""

    def __init__(self, result: TuneResult, store=None) -> None:
        self.result, self.store = result, store

    # -- figures ------------------------------------------------------------------------------
    @property
    def winner(self):
        return self.result.winner

    @property
    def simulated(self) -> bool:
        return any(t.experiment is not None and t.experiment.meta.simulated for t in self.result.trials)

    def rows(self) -> list[tuple]:
        return tune_rows(self.result, self.simulated)

    def next_line(self) -> str:
        return tune_next_line(self.result, self.winner_gain())

    def winner_gain(self) -> Gain:
        """The winner against the first baseline trial: the shared estimator's gain, the one
        ``compare()`` and ``pipeline.yaml`` give for the same two runs."""
        winner, base = self.winner, self.result.baseline
        if winner is None or not base or winner.figures.rate is None or base[0].figures.rate is None:
            return Gain(self.result.spec.objective, reason="no winner and baseline to compare")
        return gain(winner.figures.rate, base[0].figures.rate)

    def notes(self) -> list[str]:
        return tune_notes(self.result, self.simulated, MIN_NOISE)

    # -- outputs ------------------------------------------------------------------------------
    def export_pipeline(self, path="pipeline.yaml", step: str = "train", **options):
        """Write the winner into ``path`` with each kept change's evidence as its comment."""
        from gpuprof_jupyter.export.pipeline import export_pipeline

        winner = self.winner
        if winner is None or winner.experiment is None:
            raise LookupError("no winning trial to export: " + (self.result.stopped or "none passed the checks"))
        baseline = self.result.baseline[0].experiment if self.result.baseline else None
        return export_pipeline(winner.experiment, path, step, baseline=baseline, store=self.store,
                               evidence=why_lines(self.result), **options)

    def compare(self):
        """The winner against the baseline, in the comparison widget's form."""
        from gpuprof_jupyter.notebook.compare_widget import compare

        winner, base = self.winner, self.result.baseline
        if winner is None or not base or winner is base[0]:
            return None
        return compare(base[0].experiment.meta.id, winner.experiment.meta.id, store=self.store)

    def __str__(self) -> str:
        return tune_text(self.notes(), self.rows(), self.next_line())

    def _repr_html_(self) -> str:
        notes = self.notes()[1:] if self.simulated else self.notes()  # the banner says it
        winner = self.winner
        return tune_html(self.result.run_name, winner.name if winner is not None else None, notes, self.rows(),
                         self.next_line(), self.simulated)

    def __repr__(self) -> str:
        return str(self)


def tune(fn, *args, namespace: dict | None = None, on_plan=None, **kwargs) -> TuneReport:
    """Tune a training function for scripts: ``tune(train, loader, budget="2min")``.

    ``fn(*args, **kwargs)`` runs once per trial; ``tune=["cfg.batch_size=32,64"]`` opts fields of
    a config (found in ``namespace``, default: ``fn``'s module globals) into the search. The other
    keywords are the table's for ``tune()`` (``runtime/option_table.py``; its signature shows them):
    the run's options and ``--tune``'s. Returns a TuneReport (print it, or ``.export_pipeline()``).
    ``on_plan`` (default: print) is told what the search will run before the first trial, and
    its estimated time after the first.
    """
    from gpuprof_jupyter.runtime.run_options import RunOptions

    on_plan = on_plan if on_plan is not None else _say
    given = {o.name: kwargs.pop(o.name) if o.name in kwargs else o.api_default for o in options_of(TUNE)}
    spec = make_spec(list(given["tune"]), given["trial_steps"], given["budget"], given["objective"])
    ns = namespace if namespace is not None else (getattr(inspect.unwrap(fn), "__globals__", None) or {})
    options = RunOptions.resolve(**{o.name: given[o.name] for o in options_of(TUNE) if o.record and o.name != "name"})
    # ValueError names a bad option, before any trial
    source_text = _source_of(fn)  # trials record it: a later search of the same function estimates its time
    result = tune_body(lambda: fn(*args, **kwargs), spec, ns, run_name=given["name"] or "tune", session_options=options,
                       on_plan=on_plan, earlier=earlier_run(options.store, source_text), cell_source=source_text)
    return TuneReport(result, options.store)


def _signature_from_table(func) -> inspect.Signature:
    """``tune()``'s signature as help() and the README show it: the table's keywords, spelled out."""
    P = inspect.Parameter
    own = inspect.signature(func).parameters
    return inspect.Signature([
        own["fn"], own["args"],
        *(P(o.name, P.KEYWORD_ONLY, default=o.api_default) for o in options_of(TUNE)),
        own["namespace"], own["on_plan"], own["kwargs"]], return_annotation=TuneReport)


tune.__signature__ = _signature_from_table(tune)


def _source_of(fn) -> str | None:
    """The source of the tuned function (None for a builtin or one defined in a REPL)."""
    try:
        return inspect.getsource(inspect.unwrap(fn))
    except (OSError, TypeError):
        return None


_last: TuneReport | None = None


def last_tune() -> TuneReport | None:
    """The report of the last ``--tune`` run in this process (``.export_pipeline()``, ``.compare()``)."""
    return _last


def _say(text: str) -> None:
    print(f"gpuprof --tune: {text}", flush=True)


def _progress(trial, done: bool) -> None:
    print(f"gpuprof --tune: {trial_progress_text(trial, done)}", flush=True)


def run_tune_cell(shell, args, body: str) -> None:
    """``%%gpuprofile --tune ...``: the trials, then the table, the comparison and the next step."""
    global _last
    from IPython.core.error import UsageError
    from IPython.display import display

    from gpuprof_jupyter.notebook.cell_options import session_options
    from gpuprof_jupyter.notebook.profiled_cell import stop_stale

    if args.trace:
        raise UsageError("--trace and --tune do not go together: trace the winner in a cell of its own")
    try:
        spec = make_spec([t for t in args.tune if t], args.trial_steps, args.budget, args.objective)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    options = session_options(args)
    name = options.name or "tune"
    stop_stale()
    code = compile(shell.transform_cell(body), "<%%gpuprofile --tune cell>", "exec")

    def run_body():
        exec(code, shell.user_ns)  # noqa: S102 - the user's own cell, as IPython would run it

    earlier = earlier_run(options.store, body)  # each trial records its cell: the next search estimates from it
    try:
        result = tune_body(run_body, spec, shell.user_ns, run_name=name, session_options=options, on_trial=_progress,
                           on_plan=_say, earlier=earlier, cell_source=body)
    except ValueError as exc:  # an opted-in field that does not exist: before any trial
        raise UsageError(str(exc)) from None
    except KeyboardInterrupt as exc:
        partial = getattr(exc, "tune_result", None)
        if partial is not None:
            _last = TuneReport(partial, options.store)
            display(_last)
        raise
    _last = TuneReport(result, options.store)
    display(_last)
    comparison = _last.compare()
    if comparison is not None:
        display(comparison)


__all__ = ["TuneReport", "last_tune", "run_tune_cell", "tune"]
