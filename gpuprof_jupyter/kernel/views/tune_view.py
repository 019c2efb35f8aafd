"""``--tune``'s result as people see it, and ``gpuprof_jupyter.tune()`` for scripts.

Runs in the kernel.

The table (trial, settings changed, steps, throughput with its interval, energy per sample,
``sm_util``, data wait, verdict), the winner against the baseline, and one line saying what to
run next. ``TuneReport.export_pipeline`` writes the winner with each kept change's evidence as
its comment. Simulated runs say so, as everywhere.
"""

from __future__ import annotations

import html
import inspect
import math

from gpuprof_jupyter.kernel.tune.driver import tune_body, why_lines
from gpuprof_jupyter.kernel.tune.search import TuneResult, fmt_setting
from gpuprof_jupyter.kernel.tune.spec import make_spec
from gpuprof_jupyter.core.format import fmt_frac, fmt_pct, missing

_HEADER = ("trial", "settings changed", "steps", "throughput (samples/s, 95 % CI)", "energy / sample", "sm_util",
           "data wait", "verdict")


def _num(value, digits: int = 1) -> str:
    return "n/a" if missing(value) else f"{value:.{digits}f}"


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
        out = []
        for t in self.result.trials:
            f = t.figures
            changed = ", ".join(f"{k} {fmt_setting(a)} -> {fmt_setting(b)}" for k, (a, b) in t.changed.items()) or "(baseline)"
            ci = f"{_num(f.samples_per_s)}" + (
                "" if missing(f.score_ci[0]) or self.result.spec.objective != "throughput"
                else f" ({_num(f.score_ci[0])}..{_num(f.score_ci[1])})")
            energy = "n/a" if missing(f.energy_per_sample_j) else f"{f.energy_per_sample_j:.3g} J"
            verdict = t.verdict + ("" if not f.checks_failed else f"; check failed: {'; '.join(f.checks_failed)}")
            if f.checks_not_judged:
                verdict += f"; not judged (never logged before the trial stopped): {'; '.join(f.checks_not_judged)}"
            if t.user_metrics:
                verdict += "; " + ", ".join(f"{k}={fmt_setting(v)}" for k, v in t.user_metrics.items())
            out.append((t.name, changed, str(f.steps), ci, energy, fmt_pct(f.sm_util_mean), fmt_frac(f.data_wait_frac),
                        verdict))
        return out

    def next_line(self) -> str:
        result, winner = self.result, self.winner
        if winner is None:
            why = result.stopped or "no trial passed the cell's --check rules"
            return f"No winner: {why}. Next: look at the trials' diagnosis (gpuprof_jupyter.diagnose('{_first(result)}'))."
        if not winner.changed:
            return ("The baseline stays: no change gained more than the noise "
                    f"({_pct(result.noise)} between two baseline runs). Next: nothing to change in the cell.")
        settings = ", ".join(f"{k}={fmt_setting(b)}" for k, (_, b) in winner.changed.items())
        gain = winner.figures.score / result.baseline[0].figures.score - 1 if result.baseline else math.nan
        return (f"Winner {winner.name}: {settings} ({100 * gain:+.0f} % {result.spec.objective.replace('_', ' ')} "
                f"against the baseline). Next: set {settings} in the cell, or keep it in pipeline.yaml with "
                "gpuprof_jupyter.last_tune().export_pipeline('pipeline.yaml').")

    def notes(self) -> list[str]:
        r = self.result
        out = [f"searched in order: {r.order_reason}"] if r.order_reason else []
        if not missing(r.noise):
            out.append(f"noise between the two baseline trials: {_pct(r.noise)}; a change is kept when its "
                       "gain's 95 % interval lies above it; the cell's checks are judged on each trial's steady steps")
        out += [f"{k}: {why}" for k, why in r.not_tried.items()]
        if r.stopped:
            out.append(f"stopped early: {r.stopped}")
        out.append(f"{len(r.trials)} trial(s) in {r.elapsed_s:.0f} s (budget {r.spec.budget_s:.0f} s); "
                   "the model, optimizer, schedulers, RNG and the namespace were restored after each "
                   "(files the cell writes are not: docs/tune.md)")
        if self.simulated:
            out.insert(0, "SIMULATED GPU: the figures below are simulated, not measurements")
        return out

    # -- outputs ------------------------------------------------------------------------------
    def export_pipeline(self, path="pipeline.yaml", step: str = "train", **options):
        """Write the winner into ``path`` with each kept change's evidence as its comment."""
        from gpuprof_jupyter.render.pipeline_yaml import export_pipeline

        winner = self.winner
        if winner is None or winner.experiment is None:
            raise LookupError("no winning trial to export: " + (self.result.stopped or "none passed the checks"))
        baseline = self.result.baseline[0].experiment if self.result.baseline else None
        return export_pipeline(winner.experiment, path, step, baseline=baseline, store=self.store,
                               evidence=why_lines(self.result), **options)

    def compare(self):
        """The winner against the baseline, in the comparison widget's form."""
        from gpuprof_jupyter.kernel.views.compare_widget import compare

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
        head = "".join(f"<th>{html.escape(h)}</th>" for h in _HEADER)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in self.rows())
        winner = self.winner
        marks = "".join(f"<li>{html.escape(n)}</li>" for n in self.notes())
        label = ('<div class="gpuprof-simulated" style="color:#b45309;font-weight:bold">SIMULATED GPU</div>'
                 if self.simulated else "")
        win = html.escape(winner.name) if winner is not None else "none"
        return (f'<div class="gpuprof-tune">{label}<b>gpuprof --tune</b> ({html.escape(self.result.run_name)}), '
                f"winner: {win}<ul>{marks}</ul>"
                f'<table class="gpuprof-tune-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
                f'<p class="gpuprof-tune-next"><b>{html.escape(self.next_line())}</b></p></div>')

    def __repr__(self) -> str:
        return str(self)


def _pct(value) -> str:
    return "n/a" if missing(value) else f"{100 * value:.1f} %"


def _first(result: TuneResult) -> str:
    return result.trials[0].name if result.trials else "baseline"


def tune(fn, *args, name: str | None = None, trial_steps: int | None = None, budget="5min",
         objective: str = "throughput", tune=(), checks=(), source=None, store=None, interval=None, devices=None,
         namespace: dict | None = None, **kwargs) -> TuneReport:
    """Tune a training function for scripts: ``tune(train, loader, budget="2min")``.

    ``fn(*args, **kwargs)`` runs once per trial; ``tune=["cfg.batch_size=32,64"]`` opts fields of
    a config (found in ``namespace``, default: ``fn``'s module globals) into the search. Returns
    a TuneReport (print it, or ``.export_pipeline()``).
    """
    from gpuprof_jupyter.kernel.runtime.run_options import RunOptions

    spec = make_spec(list(tune), trial_steps, budget, objective)
    ns = namespace if namespace is not None else (getattr(inspect.unwrap(fn), "__globals__", None) or {})
    options = RunOptions.resolve(interval=interval, devices=devices, source=source, store=store,
                                 checks=list(checks))  # ValueError names a bad one, before any trial
    result = tune_body(lambda: fn(*args, **kwargs), spec, ns, run_name=name or "tune", session_options=options)
    return TuneReport(result, options.store)


_last: TuneReport | None = None


def last_tune() -> TuneReport | None:
    """The report of the last ``--tune`` run in this process (``.export_pipeline()``, ``.compare()``)."""
    return _last


def _progress(trial, done: bool) -> None:
    if not done:
        print(f"gpuprof --tune: trial {trial.index} [{trial.label}] running", flush=True)
        return
    f = trial.figures
    print(f"gpuprof --tune: {trial.name} [{trial.label}] {f.steps} steady steps, "
          f"{_num(f.samples_per_s)} samples/s, data wait {fmt_frac(f.data_wait_frac)}"
          + (f": {trial.verdict}" if trial.verdict else ""), flush=True)


def run_tune_cell(shell, args, body: str) -> None:
    """``%%gpuprofile --tune ...``: the trials, then the table, the comparison and the next step."""
    global _last
    from IPython.core.error import UsageError
    from IPython.display import display

    from gpuprof_jupyter.kernel.views.cell_options import session_options
    from gpuprof_jupyter.kernel.views.profiled_cell import stop_stale

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

    try:
        result = tune_body(run_body, spec, shell.user_ns, run_name=name, session_options=options, on_trial=_progress)
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
