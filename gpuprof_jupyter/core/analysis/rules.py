"""Rules: ``sm_util > 60 for >=80%``, ``sm_util < 50 for <=30% in phase train``,
``sm_util > 60 for >=80% per step``, ``sm_util < 50 for >30% within step``, ``accuracy >= 0.92``.

Runs in any process (core).

This module evaluates rules on a run. The grammar (``parse_rule``) is ``rule_grammar.py``; a
result and its verdict (``RuleResult``, ``stored_results``, ``RuleFailed``) are
``rule_results.py``; their names are re-exported here, so ``rules.X`` stays where it was.

The forms (their grammar is in ``rule_grammar.py``):

* With ``for``, METRIC is a sampled metric (``sm_util``, ``power_w``, ``cpu_util``...). The
  share is time-weighted over samples with gaps excluded (a gap counts neither for nor
  against), across GPUs the per-tick average. ``for 80%`` means ``for >=80%``; shares are
  percentages (0-100).
* ``in phase NAME`` keeps only the time inside phases with that name.
* ``per step`` counts steps instead of time: the share of reported steps whose own
  time-weighted mean of METRIC meets the condition (a gate: "sm_util > 60 % on 80 % of
  iterations").
* ``within step`` judges each step on its own time: a rule holds for a step when the share
  of *that step's* time meeting the condition (time-weighted, gaps excluded) meets the share
  (an alert: "SM below 50 % for more than 30 % of a step"). At stop it passes when it
  held in every measured step; ``measured`` is the share of steps in which it held. Live
  alerts evaluate it as each step closes (``analysis.live_alerts``); docs/rules.md.
* Without ``for``: a single value: a logged user metric (``accuracy``), a figure of the
  experiment (``duration_s``, ``energy_kwh``, ``cost``, ``sm_util_mean``, ``data_wait_frac``,
  ...), or the time-weighted mean of a sampled metric. ``%`` after a number compared with a
  ``*_frac`` figure divides it by 100.

A malformed rule raises ``RuleError`` naming what is wrong: a unit missing where a bare number
would be misread (rule_units.check_bare), a threshold that is not finite, digits that are not
ASCII. A name that is neither the profiler's (``known_names``) nor logged in the run is a typo:
its result is ``unknown`` (``gpuprof`` exits 2), never a CANNOT JUDGE to accept.

Every result has one of three verdicts (``RuleResult.verdict``): PASS, FAIL, or CANNOT JUDGE
when the run holds nothing to judge the rule on: its metric has no reading (``sm_util`` on a
host-only source), the run is shorter than the metric's native window allows
(analysis.provenance.too_short), ``per step``/``within step`` steps are shorter than that window
or the sampling interval (each step's value would repeat its neighbours' readings), the steps,
the phase or the logged value are absent. A rule that cannot be judged never passes: its
``passed`` is False, ``judged`` False, and ``to_judge`` says how to make it judgeable. Callers
that gate (``gpuprof check``/``run``, ``--fail-on-check``, ``tune()``) treat it apart from a
failure (cli.py: exit status 3).

A rule says what its metric measured where that is less than the name suggests (``sm_util``
from NVML is kernel-active time: analysis.provenance), and a verdict on a simulated metric says
so (``RuleResult.simulated``).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from gpuprof_jupyter.core.figure import measured as measured_figure
from gpuprof_jupyter.core.format import as_number, fmt_figure, fmt_metric_value, fmt_unit
from gpuprof_jupyter.core.metrics import METRICS
from gpuprof_jupyter.core.analysis.input_findings import no_steps_advice
from gpuprof_jupyter.core.analysis.ranks import rank_name, rank_views
from gpuprof_jupyter.core.analysis.provenance import (MIN_WINDOWS, base_metric, measured_as, metric_tags, short_steps, step_window,
                                                      too_short)
from gpuprof_jupyter.core.analysis.series import metric_over_time
from gpuprof_jupyter.core.analysis.windows import metric_windows
from gpuprof_jupyter.core.analysis.stats import measured_time, overlap_weights, sample_weights, time_share_exact, weighted_mean
from gpuprof_jupyter.core.analysis.rule_units import ALIASES, metric_needs_requests
from gpuprof_jupyter.core.analysis.summary import summary_of
from gpuprof_jupyter.core.analysis.run_figures import STEP_HOOKS, metric_figure, metric_unit
from gpuprof_jupyter.core.analysis.rule_grammar import (
    OPS, SAMPLED, Rule, RuleError, parse_rule, parse_rules, suggest_name)
from gpuprof_jupyter.core.analysis.rule_results import (
    CANNOT_JUDGE, FAIL, PASS, VERDICT_DIGITS, PlainRecord, RuleFailed, RuleResult, failed, raise_if_failed,
    rule_figure, stored_results, verdict_counts)

# Figures of the reported steps a value rule can gate (rule name -> key of the summary's "steps"):
# judged on any source, the GPU-free gates of CPU-only CI (docs/scripts.md).
STEP_FIGURES = {"steps": "count", "step_time_p50_s": "step_time_p50_s", "step_time_p95_s": "step_time_p95_s",
                "steps_per_s": "steps_per_s", "samples_per_s": "samples_per_s", "data_wait_frac": "data_wait_frac"}

# -- evaluation -----------------------------------------------------------------------------
def _series(experiment, metric: str):
    """(t, values, weights) for a sampled metric: GPUs averaged per tick (one rank's GPU for a
    ``ranks.RankView`` that knows it), or the host's."""
    t, values = metric_over_time(experiment, metric, "mean", getattr(experiment, "gpu_keys", None))
    return t, values, sample_weights(t, experiment.meta.sampling_interval_s, experiment.meta.gaps or ())


def _phase_mask(experiment, t: np.ndarray, phase: str):
    spans = [(p["start_s"], p.get("end_s") if p.get("end_s") is not None else p["start_s"])
             for p in experiment.meta.phases if p.get("name") == phase]
    if not spans:
        return None
    mask = np.zeros(len(t), dtype=bool)
    for start, end in spans:
        mask |= (t >= start) & (t < end)
    return mask


def _no_phase(experiment, rule: Rule, kind: str) -> RuleResult:
    names = sorted({p.get("name") for p in experiment.meta.phases}) or ["none recorded"]
    return _cannot_judge(experiment, rule, f"no phase named {rule.phase!r} (phases: {', '.join(names)})", kind,
                         f"mark the phase in the profiled code: with gpuprof_jupyter.phase({rule.phase!r}): ...")


def _no_steps(experiment, rule: Rule, kind: str) -> RuleResult:
    word = "within" if rule.within_step else "per"
    return _cannot_judge(experiment, rule, f"'{word} step' needs reported steps (step() or track()); none were", kind,
                         no_steps_advice(experiment.meta.context))


# What kind of run records a figure the profiler computes (never "log it yourself": a gate on a
# figure reported by hand would gate the hand, not the run).
_RECORDED_BY = {
    "memory_headroom_frac": "a run whose model is on a GPU (NVML, or --source sim's simulated GPU) with the CUDA "
                            "allocator in use: its peak against the device's total (docs/memory.md); a model on the "
                            "CPU has no device total to compare with",
    "memory_peak_bytes": "a torch training run whose steps the memory probe saw (an optimizer's step(), "
                         "docs/memory.md)",
    "step_peak_p50_bytes": "a training run on a GPU (torch.cuda.max_memory_allocated per step, docs/memory.md)",
    "cost": "a run with a price set (--price-kwh, --price-gpu-hour or prices in gpuprof.toml) and energy measured",
}


def recorded_by(metric: str) -> str:
    """What kind of run records ``metric``, a figure of the profiler's."""
    if metric in _RECORDED_BY:
        return f"{metric} is recorded by {_RECORDED_BY[metric]}"
    if metric_needs_requests(metric):
        return (f"{metric} is recorded by a serving run: requests are a model called under torch.no_grad() or "
                "inference_mode(), generate(), a pipeline call or a gpuprof_jupyter.request() block (docs/serving.md)")
    return f"{metric} is recorded by runs that measure it (docs/metrics.md lists which source gives what)"


def known_names() -> set[str]:
    """Every name a value rule can look up on some run, besides what a run logged: the sampled
    metrics, the comparable figures (``compare.experiment_figures``), the steps' and the serving
    figures, and their short names."""
    from gpuprof_jupyter.core.analysis.compare import FIGURES

    serving = {"host_p50_s", "host_p99_s", "requests_per_s", "tokens_per_s", "request_samples_per_s"}
    return ({f.key for f in FIGURES} | {"memory_headroom_frac", "energy_j", "gpu_hours"} | set(STEP_FIGURES)
            | set(METRICS) | set(ALIASES) | set(ALIASES.values()) | serving)


def _unknown(experiment, rule: Rule) -> RuleResult:
    """A name that is neither the profiler's nor logged in the run: a typo until shown otherwise,
    so a usage error (``RuleResult.unknown``; ``gpuprof`` exits 2), never a CANNOT JUDGE that
    ``--accept-unjudged`` would let through."""
    logged = sorted(experiment.meta.user_metrics)
    hint = suggest_name(rule.metric, sorted(known_names() | set(logged)))
    detail = (f"unknown metric {rule.metric!r}{hint}: not a metric or figure the profiler records, and this run "
              f"logged no {rule.metric!r} (logged: {', '.join(logged) or 'nothing'})")
    return RuleResult(rule.text, False, None, detail, "value", judged=False, unknown=True,
                      to_judge=(f"correct the name (docs/rules.md lists the figures); a value of your own is "
                                f"logged in the profiled code: gpuprof_jupyter.log({rule.metric}=...)"))


def _no_reading(experiment, rule: Rule, reason: str, kind: str, measured_s=None) -> RuleResult:
    """``rule.metric`` has no reading (where the rule looks): why, and where it would have one."""
    meta, metric = experiment.meta, rule.metric
    sampled = base_metric(metric)
    if metric in STEP_FIGURES:
        how = no_steps_advice(meta.context)
    elif sampled in METRICS and METRICS[sampled].scope == "gpu" and not meta.gpu_devices:
        how = (f"{sampled} is a GPU metric and this run's source ({meta.source or 'host'}) read no GPU: judge it "
               "on a GPU runner (--source nvml, or prometheus= reading dcgm-exporter); CPU-only CI can gate steps, "
               "data wait and throughput (step_time_p50_s, data_wait_frac, samples_per_s; docs/scripts.md)")
    elif sampled in METRICS:
        how = (f"the source ({meta.source or 'default'}) gave no {sampled} reading here (the run's notes say "
               f"why): judge it where the GPU or source reports {sampled} (docs/metrics.md)")
    else:
        how = recorded_by(metric)
    return _cannot_judge(experiment, rule, reason, kind, how, measured_s)


def _eval_time_share(experiment, rule: Rule) -> RuleResult:
    t, values, weights = _series(experiment, rule.metric)
    where = ""
    if rule.phase is not None:
        mask = _phase_mask(experiment, t, rule.phase)
        if mask is None:
            return _no_phase(experiment, rule, "time-share")
        weights = np.where(mask, weights, 0.0)
        where = f" in phase {rule.phase!r}"
    with np.errstate(invalid="ignore"):
        cond = OPS[rule.op](values, rule.value)
    exact = time_share_exact(cond, values, weights)
    if exact is None:
        return _no_reading(experiment, rule, f"{rule.metric} was not measured{where}", "time-share", 0.0)
    total, share = measured_time(values, weights), float(exact)
    short = too_short(experiment, rule.metric, total)
    if short:
        return _not_judged(experiment, rule, short, "time-share", total)
    passed = OPS[rule.share_op](exact, rule.share)
    gaps = summary_of(experiment).get("gaps", {})
    gap_note = (f", {fmt_figure(measured_figure(gaps['total_s'], 's', 'the sampler clock'))} of sampler gaps excluded"
                if gaps.get("count") else "")
    detail = (f"{rule.metric} {rule.op} {_threshold(rule)} for {_share(experiment, rule.metric, share)} of "
              f"{fmt_figure(measured_figure(total, 's', 'the sampler clock'))} measured{where} (needs {_needs_share(rule)})"
              f"{gap_note}")
    return _result(experiment, rule, bool(passed), share, detail, "time-share", total)


def _threshold(rule: Rule) -> str:
    """The rule's threshold as the user wrote it, in its metric's unit: the rule's number, not a
    figure of the run (so no provenance)."""
    return fmt_metric_value(rule.value, rule.metric)


def _needs_share(rule: Rule) -> str:
    """'>= 80 %': the share of time (or of steps) the rule asks for, as written."""
    return f"{rule.share_op} {fmt_unit(float(100 * rule.share), '%')}"


def _share(experiment, metric: str, share) -> str:
    """A share of time or steps in which ``metric`` held the rule's condition: a figure of that
    metric (simulated where it was), one decimal."""
    return fmt_figure(metric_figure(metric_tags(experiment.meta, metric), float(share), "share", digits=1))


def _result(experiment, rule: Rule, passed: bool, measured, detail: str, kind: str, measured_s=None,
            metric: str | None = None) -> RuleResult:
    """A result whose text says what ``metric`` (default: the rule's) measured where its name
    claims more, and carries its provenance tags and whether they are simulated."""
    metric = metric or rule.metric
    words = measured_as(experiment.meta, metric)
    detail += f"; {words}" if words else ""
    tags = metric_tags(experiment.meta, metric)
    return RuleResult(rule.text, passed, measured, detail, kind, measured_s, tags,
                      simulated=any(t.startswith("simulated") for t in tags))


def _cannot_judge(experiment, rule: Rule, reason: str, kind: str, to_judge: str, measured_s=None,
                  metric: str | None = None) -> RuleResult:
    """CANNOT JUDGE: ``reason`` says what the run lacks, ``to_judge`` how to make it judgeable."""
    result = _result(experiment, rule, False, None, reason, kind, measured_s, metric)
    result.judged, result.to_judge = False, to_judge
    return result


def _not_judged(experiment, rule: Rule, reason: str, kind: str, measured_s=None, metric: str | None = None) -> RuleResult:
    """A run too short for the metric's native window: no verdict on the value."""
    metric = metric or rule.metric
    window = metric_windows(experiment.meta).get(metric, {}).get("window_s", 0.0)
    return _cannot_judge(experiment, rule, reason, kind,
                         f"profile a run of at least {fmt_unit(MIN_WINDOWS * window, 's')} ({MIN_WINDOWS} of {metric}'s "
                         "native windows)", measured_s, metric)


def _short_steps(experiment, rule: Rule, reason: str, kind: str) -> RuleResult:
    """Steps shorter than the metric's window or the sampling interval: no per-step verdict."""
    longest = step_window(experiment.meta, rule.metric)
    interval = experiment.meta.sampling_interval_s
    faster = (f", or sample faster (--interval / interval= below the median step; now {fmt_unit(interval, 's')})"
              if longest is not None and interval and longest <= interval else "")
    share = f"{rule.metric} {rule.op} {rule.value:g} for {rule.share_op}{fmt_unit(float(100 * rule.share), '%')}"
    return _cannot_judge(experiment, rule, reason, kind,
                         f"make each reported step last at least {fmt_unit(longest, 's')} (call step() once every few "
                         f"iterations){faster}, or gate on a share of time without 'per step': {share!r}")


def _step_bounds(experiment, phase: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the reported steps, those ending in ``phase`` when given."""
    steps = experiment.steps
    ends = steps["t_end_s"].to_numpy(dtype="float64") if len(steps) else np.zeros(0)
    starts = ends - steps["duration_s"].to_numpy(dtype="float64") if len(steps) else np.zeros(0)
    if phase is not None:
        pmask = _phase_mask(experiment, ends, phase)
        keep = pmask if pmask is not None else np.zeros(len(ends), dtype=bool)
        starts, ends = starts[keep], ends[keep]
    return starts, ends


def share_within(t: np.ndarray, values: np.ndarray, weights: np.ndarray, rule: Rule,
                 start: float, end: float) -> tuple[Fraction | None, float]:
    """(exact share of ``[start, end)`` meeting ``rule``'s comparison, seconds measured there):
    each sample's time cut to the span, gaps excluded. None when nothing was measured.
    Shared by ``within step`` at stop and the live alerts (steps and sliding windows)."""
    span, cut = overlap_weights(t, weights, start, end)
    v = values[span]
    with np.errstate(invalid="ignore"):
        cond = OPS[rule.op](v, rule.value)
    return time_share_exact(cond, v, cut), measured_time(v, cut)


def step_time_shares(experiment, rule: Rule) -> list[tuple[float, float, Fraction | None]]:
    """Per reported step (in ``rule.phase`` if any): (end_s, duration_s, share of its time meeting
    the comparison, None if unmeasured)."""
    t, values, weights = _series(experiment, rule.metric)
    starts, ends = _step_bounds(experiment, rule.phase)
    return [(float(end), float(end - start), share_within(t, values, weights, rule, start, end)[0])
            for start, end in zip(starts, ends)]


def _eval_within_step(experiment, rule: Rule) -> RuleResult:
    kind = "step-time-share"
    if not len(experiment.steps):
        return _no_steps(experiment, rule, kind)
    if rule.phase is not None and _phase_mask(experiment, np.zeros(0), rule.phase) is None:
        return _no_phase(experiment, rule, kind)
    where = f" in phase {rule.phase!r}" if rule.phase else ""
    measured = [(end, share) for end, _, share in step_time_shares(experiment, rule) if share is not None]
    if not measured:
        return _no_reading(experiment, rule, f"no step{where} had a {rule.metric} reading", kind)
    short = short_steps(experiment, rule.metric, _step_durations(experiment, rule.phase))
    if short:
        return _short_steps(experiment, rule, short, kind)
    held = [(end, share) for end, share in measured if OPS[rule.share_op](share, rule.share)]
    pick = max if rule.share_op in (">", ">=") else min  # the step furthest into the condition
    end, share = pick(measured, key=lambda m: m[1])
    detail = (f"held in {len(held)} of {len(measured)} steps{where} ({rule.metric} {rule.op} "
              f"{_threshold(rule)} for {_needs_share(rule)} of a step's time); "
              f"{'most' if pick is max else 'least'}: {_share(experiment, rule.metric, share)} in the step ending at "
              f"t={fmt_figure(measured_figure(end, 'offset', STEP_HOOKS))}")
    return _result(experiment, rule, len(held) == len(measured), len(held) / len(measured), detail, kind)


def step_means(experiment, metric: str, phase: str | None = None):
    """Time-weighted mean of ``metric`` inside each reported step (NaN where unmeasured)."""
    t, values, weights = _series(experiment, metric)
    out = []
    for start, end in zip(*_step_bounds(experiment, phase)):
        inside = (t >= start) & (t < end)
        if inside.any() and weights[inside].sum() > 0:
            out.append(weighted_mean(values[inside], weights[inside]))
        else:  # a step shorter than the interval: the reading in effect at its middle
            i = np.searchsorted(t, (start + end) / 2, side="right") - 1
            out.append(float(values[i]) if 0 <= i < len(t) and weights[i] > 0 else float("nan"))
    return np.asarray(out, dtype="float64")


def _eval_step_share(experiment, rule: Rule) -> RuleResult:
    if not len(experiment.steps):
        return _no_steps(experiment, rule, "step-share")
    if rule.phase is not None and _phase_mask(experiment, np.zeros(0), rule.phase) is None:
        return _no_phase(experiment, rule, "step-share")
    short = too_short(experiment, rule.metric)
    if short:
        return _not_judged(experiment, rule, short, "step-share")
    means = step_means(experiment, rule.metric, rule.phase)
    means = means[~np.isnan(means)]
    where = f" in phase {rule.phase!r}" if rule.phase else ""
    if not len(means):
        return _no_reading(experiment, rule, f"no step{where} had a {rule.metric} reading", "step-share")
    short = short_steps(experiment, rule.metric, _step_durations(experiment, rule.phase))
    if short:
        return _short_steps(experiment, rule, short, "step-share")
    ok = int(OPS[rule.op](means, rule.value).sum())
    share = ok / len(means)
    passed = OPS[rule.share_op](Fraction(ok, len(means)), rule.share)
    detail = (f"{rule.metric} {rule.op} {_threshold(rule)} in {ok} of {len(means)} steps{where} "
              f"({_share(experiment, rule.metric, share)}, needs {_needs_share(rule)})")
    return _result(experiment, rule, bool(passed), share, detail, "step-share")


def _step_durations(experiment, phase: str | None) -> np.ndarray:
    """Durations of the steps ``step_means`` judges (those ending in ``phase`` when given)."""
    steps = experiment.steps
    durations = steps["duration_s"].to_numpy(dtype="float64")
    if phase is None:
        return durations
    mask = _phase_mask(experiment, steps["t_end_s"].to_numpy(dtype="float64"), phase)
    return durations[mask] if mask is not None else durations[:0]


def lookup_value(experiment, metric: str, prices=None):
    """A single value for ``metric``: user metric, experiment figure, or sampled mean. KeyError if none."""
    user = experiment.meta.user_metrics
    if metric in user:
        return user[metric], "logged"
    from gpuprof_jupyter.core.analysis.compare import experiment_figures

    figures = experiment_figures(experiment, prices)
    if metric in figures:
        return figures[metric], "figure"
    if metric in STEP_FIGURES:
        steps = summary_of(experiment).get("steps") or {}
        return steps.get(STEP_FIGURES[metric]), "figure"
    if metric in SAMPLED:
        t, values, weights = _series(experiment, metric)
        return weighted_mean(values, weights), "time-weighted mean"
    known = sorted(set(user) | set(figures) | set(STEP_FIGURES))
    raise KeyError(f"{metric!r} is neither logged nor a known figure{suggest_name(metric, known + SAMPLED)} "
                   f"(logged: {', '.join(sorted(user)) or 'nothing'})")


def _eval_value(experiment, rule: Rule, prices=None) -> RuleResult:
    if rule.phase is not None:
        t, values, weights = _series(experiment, rule.metric)
        mask = _phase_mask(experiment, t, rule.phase)
        if mask is None:
            return _no_phase(experiment, rule, "value")
        value, how = weighted_mean(values, np.where(mask, weights, 0.0)), f"mean in phase {rule.phase!r}"
    else:
        if rule.metric not in known_names() and rule.metric not in experiment.meta.user_metrics:
            return _unknown(experiment, rule)
        try:
            value, how = lookup_value(experiment, rule.metric, prices)
        except KeyError as exc:
            return _no_reading(experiment, rule, exc.args[0], "value")
    if value is None and how == "figure" and metric_needs_requests(rule.metric):
        return _no_reading(experiment, rule, f"{rule.metric} is a serving figure and this run recorded no requests "
                           "(docs/serving.md says what counts as one)", "value")
    if as_number(value) is None:  # missing (None, NaN, infinite), a bool or text
        return _no_reading(experiment, rule, f"{rule.metric} has no numeric value ({value!r})", "value")
    value = float(value)
    sampled = base_metric(rule.metric) if how != "logged" else None
    if sampled is None:
        # the headroom is a share of the device's total: a simulated GPU's total makes it simulated
        simulated = rule.metric == "memory_headroom_frac" and bool(experiment.meta.simulated)
        unit = metric_unit(rule.metric)
        figure = metric_figure((), value, unit, simulated_run=simulated, digits=VERDICT_DIGITS.get(unit))
        return RuleResult(rule.text, bool(OPS[rule.op](value, rule.value)), value,
                          _value_detail(rule, figure, how) + _memory_counted(experiment, rule.metric), "value",
                          simulated=simulated)
    short = too_short(experiment, sampled)
    if short:
        return _not_judged(experiment, rule, short, "value", metric=sampled)
    unit = metric_unit(rule.metric)
    figure = metric_figure(metric_tags(experiment.meta, sampled), value, unit, digits=VERDICT_DIGITS.get(unit))
    return _result(experiment, rule, bool(OPS[rule.op](value, rule.value)), value, _value_detail(rule, figure, how),
                   "value", metric=sampled)


def _memory_counted(experiment, metric: str) -> str:
    """What a memory figure counted, said in its verdict: a peak of CPU tensor sizes is not GPU
    memory, and a gate written for a GPU must not pass on it unawares."""
    if metric != "memory_peak_bytes":
        return ""
    memory = summary_of(experiment).get("memory") or {}
    if memory.get("counts") == "cpu_tensors":
        return f"; counted CPU tensors, not GPU memory: {memory.get('basis')}"
    return f"; counted by {memory['basis']}" if memory.get("basis") else ""



def _value_detail(rule: Rule, figure, how: str) -> str:
    """'memory_peak_bytes = 2.8 GiB (figure; needs < 70.00 GiB)': the run's figure (typed: its unit,
    "(simulated)" where it is) against the rule's threshold as written."""
    return f"{rule.metric} = {fmt_figure(figure)} ({how}; needs {rule.op} {_threshold(rule)})"


def evaluate_rule(experiment, rule: Rule | str, prices=None) -> RuleResult:
    """``rule`` on ``experiment``. A per-step rule on a run with several ranks is judged on each
    rank (its steps, its GPU when known) and fails when any rank fails it."""
    rule = rule if isinstance(rule, Rule) else parse_rule(rule)
    if rule.within_step or (rule.is_share and rule.per_step):
        views = rank_views(experiment)
        if views:
            return _per_rank(rule, [(rank_name(experiment, view.rank), _evaluate(view, rule, prices))
                                    for view in views])
    return _evaluate(experiment, rule, prices)


def _per_rank(rule: Rule, results: list[tuple[str, RuleResult]]) -> RuleResult:
    """FAIL when a rank fails; else CANNOT JUDGE when a rank cannot be judged; else PASS. Ranks
    by name: ``rank 3``, or ``rank 3 on node-b`` in a job across hosts."""
    failing = [rank for rank, r in results if r.verdict == FAIL]
    unjudged = [rank for rank, r in results if not r.judged]
    worst = next((r for _, r in results if r.verdict == FAIL), None) or next(
        (r for _, r in results if not r.judged), results[0][1])  # the measure shown: a failing rank's
    head = (f"failed on {', '.join(failing)}" if failing else f"cannot judge {', '.join(unjudged)}" if unjudged
            else f"held on all {len(results)} ranks")
    detail = f"judged per rank, {head}: " + "; ".join(f"{rank}: {r.detail}" for rank, r in results)
    first = results[0][1]
    return RuleResult(rule.text, not failing and not unjudged, worst.measured, detail, first.kind, first.measured_s,
                      first.provenance, judged=bool(failing) or not unjudged,
                      to_judge="" if failing else worst.to_judge, simulated=any(r.simulated for _, r in results))


def _evaluate(experiment, rule: Rule, prices=None) -> RuleResult:
    if rule.within_step:
        return _eval_within_step(experiment, rule)
    if rule.is_share:
        return _eval_step_share(experiment, rule) if rule.per_step else _eval_time_share(experiment, rule)
    return _eval_value(experiment, rule, prices)


def evaluate_rules(experiment, rules, prices=None) -> list[RuleResult]:
    return [evaluate_rule(experiment, r, prices) for r in parse_rules(rules)]


__all__ = [
    # evaluation (here)
    "STEP_FIGURES", "evaluate_rule", "evaluate_rules", "known_names", "lookup_value", "recorded_by", "share_within",
    "step_means", "step_time_shares",
    # the grammar (rule_grammar.py)
    "OPS", "SAMPLED", "Rule", "RuleError", "parse_rule", "parse_rules",
    # results and verdicts (rule_results.py)
    "CANNOT_JUDGE", "FAIL", "PASS", "VERDICT_DIGITS", "PlainRecord", "RuleFailed", "RuleResult", "failed",
    "raise_if_failed", "rule_figure", "stored_results", "verdict_counts",
]
