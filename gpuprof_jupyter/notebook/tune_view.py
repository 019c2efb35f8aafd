"""``--tune``'s result as people see it, and ``gpuprof_jupyter.tune()`` for scripts.

Runs in the kernel.

The table (trial, settings changed, steps, throughput with its interval, energy per sample,
``sm_util``, data wait, verdict), the winner against the baseline, and one line saying what to
run next. ``TuneReport.export_pipeline`` writes the winner with each kept change's evidence as
its comment. Simulated runs say so, as everywhere.
"""

from __future__ import annotations

import inspect

from gpuprof_jupyter.runtime.option_table import TUNE, options_of
from gpuprof_jupyter.runtime.tune.driver import earlier_run, tune_body, why_lines
from gpuprof_jupyter.core.analysis.gain import Gain, gain
from gpuprof_jupyter.runtime.tune.search import MIN_NOISE, TuneResult
from gpuprof_jupyter.runtime.tune.spec import make_spec
from gpuprof_jupyter.core.analysis.run_figures import run_figure, step_figure
from gpuprof_jupyter.core.figure import Figure
from gpuprof_jupyter.core.format import fmt_figure, fmt_figures, fmt_setting, missing
from gpuprof_jupyter.render.html import SIMULATED_TEXT, html, join, simulated_banner, table

def _spread(value, by: str = "two baseline trials' throughput") -> str:
    """A relative spread of throughput (the noise, the threshold) with one decimal: '3.2 %'."""
    return fmt_figure(Figure(value, "share", "measured", by, digits=1))


_HEADER = ("trial", "settings changed", "steps", "throughput (samples/s, 95 % CI)", "gain (95 % CI)", "energy / sample",
           "sm_util", "data wait", "verdict")


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

    def _run(self, trial):
        """The trial's run, for its figures' provenance (a stand-in when it kept none)."""
        if trial.experiment is not None:
            return trial.experiment.meta
        from types import SimpleNamespace

        return SimpleNamespace(simulated=self.simulated, source="", provenance={})

    def rows(self) -> list[tuple]:
        out = []
        for t in self.result.trials:
            f, run = t.figures, self._run(t)
            changed = ", ".join(f"{k} {fmt_setting(a)} -> {fmt_setting(b)}" for k, (a, b) in t.changed.items()) or "(baseline)"
            ci = fmt_figure(step_figure(f.samples_per_s, "/s")) + (
                "" if missing(f.score_ci[0]) or self.result.spec.objective != "throughput"
                else f" ({fmt_figures([step_figure(v, '/s') for v in f.score_ci[:2]], '..')})")
            gain = "" if t.gain is None else (
                t.gain.text() if t.gain.conclusive else "inconclusive") + f" vs {t.against}"
            energy = fmt_figure(run_figure(run, "energy_per_sample_j", f.energy_per_sample_j, "J"))
            verdict = t.verdict + ("" if not f.checks_failed else f"; check failed: {'; '.join(f.checks_failed)}")
            if f.checks_not_judged:
                verdict += f"; cannot be judged: {'; '.join(f.checks_not_judged)}"
            if t.user_metrics:
                verdict += "; " + ", ".join(f"{k}={fmt_setting(v)}" for k, v in t.user_metrics.items())
            out.append((t.name, changed, str(f.steps), ci, gain, energy,
                        fmt_figure(run_figure(run, "sm_util_mean", f.sm_util_mean, "%")),
                        fmt_figure(step_figure(f.data_wait_frac, "share")), verdict))
        return out

    def next_line(self) -> str:
        result, winner = self.result, self.winner
        if winner is None:
            why = result.stopped or "no trial passed the cell's --check rules"
            return f"No winner: {why}. Next: look at the trials' diagnosis (gpuprof_jupyter.diagnose('{_first(result)}'))."
        if not winner.changed:
            return ("The baseline stays: no change gained more than the noise "
                    f"({_spread(result.noise)} between two baseline runs). Next: nothing to change in the cell.")
        settings = ", ".join(f"{k}={fmt_setting(b)}" for k, (_, b) in winner.changed.items())
        return (f"Winner {winner.name}: {settings}: {self.winner_gain().text()} against the baseline "
                f"{result.baseline[0].name}. Next: set {settings} in the cell, or keep it in pipeline.yaml with "
                "gpuprof_jupyter.last_tune().export_pipeline('pipeline.yaml').")

    def winner_gain(self) -> Gain:
        """The winner against the first baseline trial: the shared estimator's gain, the one
        ``compare()`` and ``pipeline.yaml`` give for the same two runs."""
        winner, base = self.winner, self.result.baseline
        if winner is None or not base or winner.figures.rate is None or base[0].figures.rate is None:
            return Gain(self.result.spec.objective, reason="no winner and baseline to compare")
        return gain(winner.figures.rate, base[0].figures.rate)

    def notes(self) -> list[str]:
        r = self.result
        out = list(r.plan_text)
        if r.order_reason:
            out.append(f"searched in order: {r.order_reason}")
        if not missing(r.threshold):
            floor = (f"the floor of {_spread(MIN_NOISE, 'the search')}, as the measured noise was lower" if r.threshold > (
                r.noise if not missing(r.noise) else 0.0) else "the measured noise")
            out.append(f"noise between the two baseline trials: {_spread(r.noise)}; a change is kept when the lower "
                       f"end of its gain's 95 % interval is above {_spread(r.threshold, 'the search')} ({floor}); a gain whose "
                       "interval includes 0 is inconclusive; the cell's checks are judged on each trial's steady steps")
        out += [f"{k}: {why}" for k, why in r.not_tried.items()]
        if r.stopped:
            out.append(f"stopped early: {r.stopped}")
        out.append(f"{len(r.trials)} trial(s) in {fmt_figure(Figure(r.elapsed_s, 's', 'measured', 'the clock'))} "
                   f"(budget {fmt_setting(r.spec.budget_s)} s); restored "
                   "after each: models (values, tree, hooks, train/eval, requires_grad), optimizers, schedulers, RNG, "
                   "the namespace's variables, lists, dicts and sets, os.environ; not restored: files the cell "
                   "writes, tensors or arrays changed in place outside a model (docs/tune.md)")
        out += [f"not restored: {what}" for what in r.not_restored]
        if self.simulated:
            out.insert(0, SIMULATED_TEXT)
        return out

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
        rows = [_HEADER, *self.rows()]
        widths = [max(len(str(r[i])) for r in rows) for i in range(len(_HEADER))]
        lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
        return "\n".join([*self.notes(), "", *lines, "", self.next_line()])

    def _repr_html_(self) -> str:
        notes = self.notes()[1:] if self.simulated else self.notes()  # the banner says it
        winner = self.winner
        return str(html("<div class='gpuprof-tune'>{}<b>gpuprof --tune</b> ({}), winner: {}<ul>{}</ul>{}"
                        "<p class='gpuprof-tune-next'><b>{}</b></p></div>",
                        simulated_banner() if self.simulated else "", self.result.run_name,
                        winner.name if winner is not None else "none", join(html("<li>{}</li>", n) for n in notes),
                        table(self.rows(), _HEADER, cls="gpuprof-table gpuprof-tune-table"), self.next_line()))

    def __repr__(self) -> str:
        return str(self)


def _first(result: TuneResult) -> str:
    return result.trials[0].name if result.trials else "baseline"


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
    if not done:
        print(f"gpuprof --tune: trial {trial.index} [{trial.label}] running", flush=True)
        return
    f = trial.figures
    print(f"gpuprof --tune: {trial.name} [{trial.label}] {f.steps} steady steps, "
          f"{fmt_figure(step_figure(f.samples_per_s, 'samples/s'))}, data wait {fmt_figure(step_figure(f.data_wait_frac, 'share'))}"
          + (f": {trial.verdict}" if trial.verdict else ""), flush=True)


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
