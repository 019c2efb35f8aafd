"""``--tune``'s result as people read it: the notes, the table of trials and what to run next, as text and HTML.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

The table (trial, settings changed, steps, throughput with its interval, energy per sample,
``sm_util``, data wait, verdict), the winner against the baseline, and one line saying what to
run next. ``notebook/tune_view.py``'s ``TuneReport`` holds the result and shows these; the text
table is ``render/text_table.py``'s, the HTML one ``render/html.py``'s. Simulated runs say so,
as everywhere.
"""

from __future__ import annotations

from types import SimpleNamespace

from gpuprof_jupyter.core.analysis.gain import Gain
from gpuprof_jupyter.core.analysis.run_figures import run_figure, step_figure
from gpuprof_jupyter.core.figure import Figure
from gpuprof_jupyter.core.format import fmt_figure, fmt_figures, fmt_setting, fmt_unit, missing
from gpuprof_jupyter.render.html import SIMULATED_TEXT, html, join, simulated_banner, table
from gpuprof_jupyter.render.text_table import text_table

HEADER = ("trial", "settings changed", "steps", "throughput (samples/s, 95 % CI)", "gain (95 % CI)", "energy / sample",
          "sm_util", "data wait", "verdict")


def _spread(value, by: str = "two baseline trials' throughput") -> str:
    """A relative spread of throughput (the noise, the threshold) with one decimal: '3.2 %'."""
    return fmt_figure(Figure(value, "share", "measured", by, digits=1))


def _run(trial, simulated: bool):
    """The trial's run, for its figures' provenance (a stand-in when it kept none)."""
    if trial.experiment is not None:
        return trial.experiment.meta
    return SimpleNamespace(simulated=simulated, source="", provenance={})


def tune_rows(result, simulated: bool) -> list[tuple]:
    """One row of ``HEADER``'s cells a trial of ``result`` (a ``runtime/tune/search.TuneResult``)."""
    out = []
    for t in result.trials:
        f, run = t.figures, _run(t, simulated)
        changed = ", ".join(f"{k} {fmt_setting(a)} -> {fmt_setting(b)}" for k, (a, b) in t.changed.items()) or "(baseline)"
        ci = fmt_figure(step_figure(f.samples_per_s, "/s")) + (
            "" if missing(f.score_ci[0]) or result.spec.objective != "throughput"
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


def trial_progress_text(trial, done: bool) -> str:
    """A trial's line while the search runs: started, or its steady steps, throughput, data wait, verdict."""
    if not done:
        return f"trial {trial.index} [{trial.label}] running"
    f = trial.figures
    return (f"{trial.name} [{trial.label}] {f.steps} steady steps, {fmt_figure(step_figure(f.samples_per_s, 'samples/s'))}, "
            f"data wait {fmt_figure(step_figure(f.data_wait_frac, 'share'))}" + (f": {trial.verdict}" if trial.verdict else ""))


def tune_next_line(result, winner_gain: Gain) -> str:
    """What to run next: the winner and its gain against the baseline (``winner_gain``), or why none."""
    winner = result.winner
    if winner is None:
        why = result.stopped or "no trial passed the cell's --check rules"
        first = result.trials[0].name if result.trials else "baseline"
        return f"No winner: {why}. Next: look at the trials' diagnosis (gpuprof_jupyter.diagnose('{first}'))."
    if not winner.changed:
        return ("The baseline stays: no change gained more than the noise "
                f"({_spread(result.noise)} between two baseline runs). Next: nothing to change in the cell.")
    settings = ", ".join(f"{k}={fmt_setting(b)}" for k, (_, b) in winner.changed.items())
    return (f"Winner {winner.name}: {settings}: {winner_gain.text()} against the baseline "
            f"{result.baseline[0].name}. Next: set {settings} in the cell, or keep it in pipeline.yaml with "
            "gpuprof_jupyter.last_tune().export_pipeline('pipeline.yaml').")


def tune_notes(result, simulated: bool, min_noise: float) -> list[str]:
    """The search's notes: its plan, order, noise and threshold (``min_noise``: the search's floor),
    what it did not try, why it stopped, its time and what it restored."""
    r = result
    out = list(r.plan_text)
    if r.order_reason:
        out.append(f"searched in order: {r.order_reason}")
    if not missing(r.threshold):
        floor = (f"the floor of {_spread(min_noise, 'the search')}, as the measured noise was lower" if r.threshold > (
            r.noise if not missing(r.noise) else 0.0) else "the measured noise")
        out.append(f"noise between the two baseline trials: {_spread(r.noise)}; a change is kept when the lower "
                   f"end of its gain's 95 % interval is above {_spread(r.threshold, 'the search')} ({floor}); a gain whose "
                   "interval includes 0 is inconclusive; the cell's checks are judged on each trial's steady steps")
    out += [f"{k}: {why}" for k, why in r.not_tried.items()]
    if r.stopped:
        out.append(f"stopped early: {r.stopped}")
    out.append(f"{len(r.trials)} trial(s) in {fmt_figure(Figure(r.elapsed_s, 's', 'measured', 'the clock'))} "
               f"(budget {fmt_unit(r.spec.budget_s, 's')}); restored "
               "after each: models (values, tree, hooks, train/eval, requires_grad), optimizers, schedulers, RNG, "
               "the namespace's variables, lists, dicts and sets, os.environ; not restored: files the cell "
               "writes, tensors or arrays changed in place outside a model (docs/tune.md)")
    out += [f"not restored: {what}" for what in r.not_restored]
    if simulated:
        out.insert(0, SIMULATED_TEXT)
    return out


def tune_text(notes: list[str], rows: list[tuple], next_line: str) -> str:
    """The text form: the notes, the table of trials, what to run next."""
    return "\n".join([*notes, "", *text_table([HEADER, *rows]), "", next_line])


def tune_html(run_name: str, winner_name: str | None, notes: list[str], rows: list[tuple], next_line: str,
              simulated: bool) -> str:
    """The notebook's form: the banner once when simulated (``notes`` without the simulated line),
    the run and its winner, the notes, the table, what to run next."""
    return str(html("<div class='gpuprof-tune'>{}<b>gpuprof --tune</b> ({}), winner: {}<ul>{}</ul>{}"
                    "<p class='gpuprof-tune-next'><b>{}</b></p></div>",
                    simulated_banner() if simulated else "", run_name, winner_name or "none",
                    join(html("<li>{}</li>", n) for n in notes),
                    table(rows, HEADER, cls="gpuprof-table gpuprof-tune-table"), next_line))
