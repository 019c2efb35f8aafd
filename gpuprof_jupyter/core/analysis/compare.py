"""Comparing experiments against a baseline: settings diff, metric deltas, fairness warnings.

Runs in any process (core).

Pure data: ``compare_experiments(experiments, baseline=0)`` -> ``Comparison``. The widget, the
HTML report and the CLI render it. A delta is "better" or "worse" by the metric's direction
(time, energy, cost, data waits: lower is better; SM activity, throughput, accuracy: higher);
user metrics whose name says loss/error/latency are lower-is-better, others higher.
Between runs of different lengths (step counts) totals (duration, energy, cost) get no verdict;
each run's gain over the baseline is a rate's, from the estimator every view shares
(``core/analysis/gain.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuprof_jupyter.core.analysis.cost import resolve_prices, run_cost
from gpuprof_jupyter.core.analysis.gain import Gain, objective_of, run_gain, warmup_of
from gpuprof_jupyter.core.analysis.step_figures import steps_summary
from gpuprof_jupyter.core.analysis.serving_compare import add_change_intervals, serving_effect
from gpuprof_jupyter.core.analysis.provenance import base_metric, difference_headline, metric_tags, provenance_differences, provenance_words, \
    quantity_differs
from gpuprof_jupyter.core.analysis.sharing import describe_others, others_by_device
from gpuprof_jupyter.core.analysis.summary import summary_of
from gpuprof_jupyter.core.format import NOT_RECORDED, as_number, fmt_change, fmt_pct
from gpuprof_jupyter.core.store.experiment import RunStatus

LOWER, HIGHER, NEUTRAL = -1, 1, 0
_LOWER_WORDS = ("loss", "error", "err", "wer", "cer", "perplexity", "ppl", "latency", "time", "mae", "mse",
                "rmse", "cost")


@dataclass(frozen=True)
class FigureDef:
    key: str
    label: str
    kind: str  # "seconds", "kwh", "cost", "pct", "frac", "watts", "bytes", "rate", "joules", "number"
    direction: int
    # a relative change below this is "same" (measurement noise), e.g. 0.01 = 1 %
    tolerance: float = 0.01
    # a total over the whole run: between runs of different lengths it is shown, labelled as a
    # total, and never called better or worse (a rate says that: core/analysis/gain.py)
    total: bool = False


FIGURES: list[FigureDef] = [
    FigureDef("duration_s", "duration", "seconds", LOWER, total=True),
    FigureDef("energy_kwh", "energy (kWh)", "kwh", LOWER, total=True),
    FigureDef("cost", "cost", "cost", LOWER, total=True),
    FigureDef("sm_util_mean", "sm_util mean", "pct", HIGHER),
    FigureDef("sm_util_p95", "sm_util p95", "pct", HIGHER),
    FigureDef("sm_low_frac", "sm_low_frac (time SM < 50 %)", "frac", LOWER),
    FigureDef("mem_bw_util_mean", "mem_bw_util mean", "pct", NEUTRAL),
    FigureDef("power_mean_w", "power mean (all GPUs)", "watts", NEUTRAL),
    FigureDef("gpu_mem_peak_bytes", "peak GPU memory", "bytes", NEUTRAL),
    FigureDef("memory_peak_bytes", "peak tensor memory (docs/memory.md)", "bytes", NEUTRAL),
    FigureDef("step_peak_p50_bytes", "step peak memory p50 (torch)", "bytes", NEUTRAL),
    FigureDef("cpu_util_mean", "host CPU (process tree)", "pct", NEUTRAL),
    FigureDef("samples_per_s", "throughput (samples/s)", "rate", HIGHER),
    FigureDef("data_wait_frac", "data-wait share", "frac", LOWER),
    FigureDef("energy_per_sample_j", "energy per sample", "joules", LOWER),
    # serving runs (analysis/latency.py): steady requests, warm-up left out; each change has an interval
    FigureDef("latency_p50_s", "latency p50", "latency", LOWER),
    FigureDef("latency_p99_s", "latency p99", "latency", LOWER),
    FigureDef("requests_per_s", "requests/s", "rate", HIGHER),
    FigureDef("request_samples_per_s", "serving samples/s", "rate", HIGHER),
    FigureDef("tokens_per_s", "tokens/s", "rate", HIGHER),
]


def user_metric_direction(name: str) -> int:
    lowered = name.lower()
    return LOWER if any(word in lowered for word in _LOWER_WORDS) else HIGHER


def steady_steps(experiment) -> dict:
    """The figures of the steps a run's rate is taken over (``gain.estimate``): a ``--tune``
    trial's warm-up left out, so the throughput row and the gain of one pair agree; every step
    of an ordinary run (its summary's)."""
    warmup = warmup_of(experiment)
    if not warmup:
        return summary_of(experiment).get("steps", {})
    return steps_summary(experiment.steps.iloc[warmup:])


def experiment_figures(experiment, prices=None) -> dict[str, float | None]:
    """The comparable figures of one experiment (None where not measured)."""
    summary = summary_of(experiment)
    overall, host, steps = summary.get("overall", {}), summary.get("host", {}), steady_steps(experiment)
    meta = experiment.meta
    cost = run_cost(experiment, prices)
    energy_j = as_number(overall.get("energy_j"))
    samples = as_number((summary.get("steps") or {}).get("samples"))  # the whole run's, as its energy is
    figures = {
        "duration_s": as_number(meta.duration_s if meta.duration_s is not None else summary.get("duration_s")),
        "energy_kwh": as_number(overall.get("energy_kwh")),
        "cost": as_number(cost["total"]),
        "sm_util_mean": as_number(overall.get("sm_util_mean")),
        "sm_util_p95": as_number(overall.get("sm_util_p95")),
        "sm_low_frac": as_number(overall.get("sm_low_frac")),
        "mem_bw_util_mean": as_number(overall.get("mem_bw_util_mean")),
        "power_mean_w": as_number(overall.get("power_mean_w")),
        "gpu_mem_peak_bytes": as_number(overall.get("gpu_mem_peak_bytes")),
        "memory_peak_bytes": as_number((summary.get("memory") or {}).get("peak_bytes")),
        "step_peak_p50_bytes": as_number((summary.get("memory") or {}).get("step_peak_p50_bytes")),
        "memory_headroom_frac": as_number((summary.get("memory") or {}).get("headroom_frac")),  # rules only
        "cpu_util_mean": as_number(host.get("cpu_util_mean", overall.get("cpu_util_mean"))),
        "samples_per_s": as_number(steps.get("samples_per_s")),
        "data_wait_frac": as_number(steps.get("data_wait_frac")),
        "energy_per_sample_j": energy_j / samples if energy_j is not None and samples else None,
        "energy_j": energy_j,
        "gpu_hours": cost["gpu_hours"],
    }
    requests = summary.get("requests") or {}
    for key in ("requests_per_s", "tokens_per_s", *(k for k in requests if k.startswith(("latency_", "ttft_", "host_p")))):
        figures[key] = as_number(requests.get(key)) if not isinstance(requests.get(key), list) else None
    for key in ("latency_p50_s", "latency_p99_s"):
        figures.setdefault(key, None)
    figures["request_samples_per_s"] = as_number(requests.get("samples_per_s"))
    return figures


@dataclass
class SettingRow:
    key: str
    values: list[Any]  # NOT_RECORDED where a run did not record the setting
    changed: list[bool]  # against the baseline, per experiment (baseline: False; False where either did not record it)


@dataclass
class MetricRow:
    key: str
    label: str
    kind: str
    direction: int
    values: list[float | None]
    deltas: list[float | None]  # absolute, against the baseline
    rel: list[float | None]  # relative (0.25 = +25 %), None where the baseline is 0 or missing
    verdicts: list[str | None]  # "better", "worse", "same", None (baseline, neutral, missing or not comparable)
    user: bool = False
    # per experiment: True where the figure's metric came from other APIs than the baseline's
    # (a different quantity: no verdict is given)
    incomparable: list[bool] = field(default_factory=list)
    # per experiment: a 95 % interval of its change against the baseline, where one is known
    # (serving figures: analysis/serving_compare.py); None elsewhere
    intervals: list = field(default_factory=list)

    def comparable(self, index: int) -> bool:
        return not (self.incomparable and self.incomparable[index])


@dataclass
class Warning_:
    kind: str  # "provenance", "other-processes", "hardware", "several-settings", "simulated", "status", "lengths"
    message: str
    experiments: list[str] = field(default_factory=list)


@dataclass
class Comparison:
    experiments: list
    baseline: int
    settings: list[SettingRow]
    metrics: list[MetricRow]
    warnings: list[Warning_]
    currency: str = "$"
    notes: list[str] = field(default_factory=list)  # what the reader should know about the choice of runs
    # per experiment: the gain of its rate against the baseline's (core/analysis/gain.py), None
    # for the baseline and where either run has no steps
    gains: list[Gain | None] = field(default_factory=list)
    lengths: list[tuple[float, str]] = field(default_factory=list)  # per run: (samples or steps, which)

    def length_differs(self, index: int) -> bool:
        """True when run ``index`` did another amount of work than the baseline (samples, else
        steps): its totals (duration, energy, cost) say nothing about which is faster."""
        return bool(self.lengths) and self.lengths[index] != self.lengths[self.baseline]

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.experiments]

    def metric(self, key: str) -> MetricRow:
        for row in self.metrics:
            if row.key == key:
                return row
        raise KeyError(key)

    def setting(self, key: str) -> SettingRow:
        for row in self.settings:
            if row.key == key:
                return row
        raise KeyError(key)

    def changed_settings(self, index: int) -> dict[str, tuple[Any, Any]]:
        """key -> (baseline value, this experiment's value) for settings that differ."""
        return {r.key: (r.values[self.baseline], r.values[index]) for r in self.settings if r.changed[index]}


def recorded_settings(experiment) -> dict:
    """What a comparison diffs: the params (``--param``, loaders, what the hooks saw) and the
    ``--capture``d values (``train_config.num_workers``); a param wins over a captured key."""
    return {**experiment.meta.captured, **experiment.meta.params}


def _settings_rows(experiments, baseline: int) -> list[SettingRow]:
    settings = [recorded_settings(e) for e in experiments]
    keys = list(dict.fromkeys(k for s in settings for k in s))
    rows = []
    for key in keys:
        values = [s.get(key, NOT_RECORDED) for s in settings]
        base = values[baseline]
        changed = [i != baseline and v is not NOT_RECORDED and base is not NOT_RECORDED and v != base
                   for i, v in enumerate(values)]
        rows.append(SettingRow(key, values, changed))
    return rows


def users_changes(settings: list[SettingRow], baseline: int, index: int, torch_filled: set[str]) -> list[str]:
    """The settings experiment ``index`` changed against the baseline, one key per change the
    user made: values torch filled in by itself (``torch_filled``: ``prefetch_factor`` 2 once
    workers are on) are not the user's, and keys that record one setting twice (the captured
    ``train_config.num_workers`` and the loader's ``num_workers``, same old and new values,
    one's last part ending in ``_`` plus the other's) count once."""
    return [key for key, _, _ in _user_changes(settings, baseline, index, torch_filled)]


def _user_changes(settings: list[SettingRow], baseline: int, index: int, torch_filled: set[str]) -> list[tuple]:
    changes: list[tuple[str, Any, Any]] = []
    for row in settings:
        if not row.changed[index] or row.key in torch_filled:
            continue
        old, new = row.values[baseline], row.values[index]
        if not any(same_change(c, (row.key, old, new)) for c in changes):
            changes.append((row.key, old, new))
    return changes


def same_change(one: tuple, other: tuple) -> bool:
    """Two (key, old, new) changes that record one setting twice: the same values, under keys
    whose last parts match (``cfg.batch_size`` and ``batch_size``; ``train_config.num_workers``)."""
    (key, *values), (other_key, *other_values) = one, other
    leaf, other_leaf = key.rpartition(".")[2], other_key.rpartition(".")[2]
    return values == other_values and (leaf == other_leaf or leaf.endswith("_" + other_leaf)
                                       or other_leaf.endswith("_" + leaf))


def setting_changes(a, b) -> list[tuple[str, Any, Any]]:
    """(key, old, new) for each setting the user changed from run ``a`` to run ``b``, one per
    setting (``users_changes``): what the comparison's "several settings" warning and
    pipeline.yaml's "measured alone" both count."""
    filled = set(a.meta.context.get("torch_filled") or ()) | set(b.meta.context.get("torch_filled") or ())
    return _user_changes(_settings_rows([a, b], 0), 0, 1, filled)


def _verdict(direction: int, rel: float | None, delta: float | None, tolerance: float) -> str | None:
    if delta is None or direction == NEUTRAL:
        return None
    if delta == 0 or rel is not None and abs(rel) < tolerance:
        return "same"
    return "better" if delta * direction > 0 else "worse"


def _metric_row(key, label, kind, direction, values, baseline, tolerance=0.01, user=False) -> MetricRow:
    base = values[baseline]
    deltas, rels, verdicts = [], [], []
    for i, v in enumerate(values):
        if i == baseline or v is None or base is None:
            deltas.append(None), rels.append(None), verdicts.append(None)
            continue
        delta = v - base
        rel = delta / abs(base) if base else None
        deltas.append(delta)
        rels.append(rel)
        verdicts.append(_verdict(direction, rel, delta, tolerance))
    return MetricRow(key, label, kind, direction, values, deltas, rels, verdicts, user)


def _gpu_signature(experiment) -> tuple:
    return tuple(sorted(d.get("name", "?") for d in experiment.meta.gpu_devices))


PROVENANCE_CHECKED = ("sm_util", "mem_bw_util", "power_w", "energy_j")  # metrics whose API can differ between runs


def provenance_warnings(experiments, baseline: int) -> list[Warning_]:
    """One loud warning per metric measured by different APIs across ``experiments`` (the
    comparison's, which the pipeline export passes on): "NOT THE SAME QUANTITY" where one side
    is a weaker reading (kernel-active time against SMs busy), else "MEASURED DIFFERENTLY"."""
    base = experiments[baseline]
    warnings = []
    for metric, differ in provenance_differences(experiments, baseline, PROVENANCE_CHECKED).items():
        parts = "; ".join(f"{e.name}: {provenance_words(e.meta, metric)}" for e in [base, *differ])
        other = sorted({t for e in differ for t in metric_tags(e.meta, metric)})
        headline = difference_headline(metric, metric_tags(base.meta, metric), other)
        consequence = ("so its figures are shown but not called better or worse" if headline.startswith("NOT")
                       else "so small differences may come from the measurement")
        warnings.append(Warning_("provenance", f"{headline}: {metric} was measured by different APIs, {consequence}: "
                                 f"{parts}", [e.name for e in differ]))
    return warnings


def _mark_incomparable(rows: list[MetricRow], experiments, baseline: int) -> None:
    """Figures made of a metric that measured another quantity than the baseline's get no verdict."""
    base = experiments[baseline]
    for row in rows:
        metric = None if row.user else base_metric(row.key)
        row.incomparable = [metric is not None and quantity_differs(
            metric, metric_tags(base.meta, metric), metric_tags(e.meta, metric)) for e in experiments]
        row.verdicts = [None if bad else v for v, bad in zip(row.verdicts, row.incomparable)]


IDLE_OTHERS_SM = 1.0  # % : other processes whose kernels ran less than this held memory but did not compete


def other_processes(experiment) -> dict[str, dict]:
    """device -> aggregate of the other processes that competed for the profiled GPUs: certainly
    not the kernel's (analysis.sharing), and not idle when their SM share was measured."""
    return {key: d for key, d in others_by_device(experiment.meta.context).items()
            if d.get("sm_util_mean") is None or d["sm_util_mean"] >= IDLE_OTHERS_SM}


def fairness_warnings(experiments, baseline: int) -> list[Warning_]:
    base = experiments[baseline]
    warnings: list[Warning_] = provenance_warnings(experiments, baseline)
    busy = [e for e in experiments if other_processes(e)]
    if busy:
        parts = "; ".join(f"{e.name}: {describe_others(other_processes(e))}" for e in busy)
        warnings.append(Warning_("other-processes",
                                 f"other processes were using the GPUs during {len(busy)} run(s), so timings and "
                                 f"power are shared: {parts}", [e.name for e in busy]))
    hw = [e for e in experiments if _gpu_signature(e) != _gpu_signature(base)]
    if hw:
        desc = lambda e: f"{len(e.meta.gpu_devices)}x {', '.join(sorted(set(_gpu_signature(e)))) or 'no GPU'}"  # noqa: E731
        warnings.append(Warning_("hardware",
                                 "the hardware differs: " + "; ".join(f"{e.name}: {desc(e)}" for e in [base, *hw]),
                                 [e.name for e in hw]))
    sims = {bool(e.meta.simulated) for e in experiments}
    if len(sims) > 1:
        warnings.append(Warning_("simulated", "simulated and measured runs are mixed: simulated figures are not "
                                 "measurements", [e.name for e in experiments if e.meta.simulated]))
    settings = _settings_rows(experiments, baseline)
    for i, e in enumerate(experiments):
        if i == baseline:
            continue
        changed = users_changes(settings, baseline, i, set(base.meta.context.get("torch_filled") or ())
                                | set(e.meta.context.get("torch_filled") or ()))
        if len(changed) > 1:
            warnings.append(Warning_("several-settings",
                                     f"{e.name} changes {len(changed)} settings at once against {base.name} "
                                     f"({', '.join(changed)}): its effect cannot be put down to one of them",
                                     [e.name]))
    bad = [e for e in experiments if e.meta.status != RunStatus.OK]
    if bad:
        warnings.append(Warning_("status", "not every run finished normally: " + ", ".join(
            f"{e.name} [{e.meta.status}]" for e in bad), [e.name for e in bad]))
    return warnings


def compare_experiments(experiments, baseline=0, prices=None, directions: dict[str, int] | None = None) -> Comparison:
    """Compare ``experiments`` (a list of Experiment) against ``experiments[baseline]``.

    ``baseline`` is an index or a name/id among them. ``directions`` overrides whether a
    user metric is better higher (+1) or lower (-1).
    """
    experiments = list(experiments)
    if not experiments:
        raise ValueError("nothing to compare: no experiments")
    if not isinstance(baseline, int):
        matches = [i for i, e in enumerate(experiments) if baseline in (e.name, e.id)]
        if not matches:
            raise KeyError(f"baseline {baseline!r} is not among the compared experiments "
                           f"({', '.join(e.name for e in experiments)})")
        baseline = matches[-1]
    if not 0 <= baseline < len(experiments):
        raise IndexError(f"baseline index {baseline} out of range")
    p = resolve_prices(prices)
    figures = [experiment_figures(e, p) for e in experiments]
    rows = []
    for fd in FIGURES:
        if fd.key == "cost" and not p.any:
            continue
        values = [f.get(fd.key) for f in figures]
        if all(v is None for v in values) and fd.key not in ("duration_s", "energy_kwh", "sm_util_mean"):
            continue
        rows.append(_metric_row(fd.key, fd.label, fd.kind, fd.direction, values, baseline, fd.tolerance))
    user_keys: list[str] = []
    for e in experiments:
        user_keys += [k for k in e.meta.user_metrics if k not in user_keys]
    directions = directions or {}
    for key in user_keys:
        values = [as_number(e.meta.user_metrics.get(key)) for e in experiments]
        direction = directions.get(key, user_metric_direction(key))
        rows.append(_metric_row(key, key, "number", direction, values, baseline, 0.0, user=True))
    _mark_incomparable(rows, experiments, baseline)
    add_change_intervals(rows, experiments, baseline)
    lengths = [run_length(e) for e in experiments]
    warnings = fairness_warnings(experiments, baseline)
    differ = [i for i, n in enumerate(lengths) if n != lengths[baseline]]
    if differ:
        for row in rows:
            if any(fd.key == row.key and fd.total for fd in FIGURES):
                row.label += " (total)"
                row.verdicts = [None if i in differ else v for i, v in enumerate(row.verdicts)]
        warnings.append(Warning_("lengths", "the runs differ in length (" + ", ".join(
            f"{e.name}: {n:g} {unit}" if n else f"{e.name}: no steps recorded"
            for e, (n, unit) in zip(experiments, lengths)) + "): totals (duration, energy, cost) are "
            "shown as totals, not better or worse; compare the rates (throughput, energy per sample) and the gain",
            [experiments[i].name for i in differ]))
    objective = objective_of(*experiments)
    gains = [None if i == baseline or not (lengths[i][0] and lengths[baseline][0])
             else run_gain(e, experiments[baseline], objective) for i, e in enumerate(experiments)]
    return Comparison(experiments, baseline, _settings_rows(experiments, baseline), rows, warnings, p.currency,
                      gains=gains, lengths=lengths)


def run_length(experiment) -> tuple[float, str]:
    """How much work a run did: its samples when it counted them, else its steps ((0, "steps")
    when none). A run at batch 64 does the work of one at batch 32 in half the steps."""
    steps = summary_of(experiment).get("steps") or {}
    for key in ("samples", "count"):
        value = as_number(steps.get(key))
        if value:
            return float(value), "samples" if key == "samples" else "steps"
    return 0.0, "steps"


_NOT_COMPARABLE = " (different APIs: not comparable)"


def _simulated(comparison: Comparison, index: int) -> str:
    """' (simulated)' after a GPU figure's change when either run's GPU was simulated (pipeline.yaml's comments)."""
    runs = (comparison.experiments[comparison.baseline], comparison.experiments[index])
    return " (simulated)" if any(e.meta.simulated for e in runs) else ""


def effect_text(comparison: Comparison, index: int) -> str:
    """``+33 % throughput (95 % CI +20..+46 %), -25% time, -30% energy, sm_util 45->70%`` for
    experiment ``index`` against the baseline: the gain of the rate first (the shared estimator,
    or "inconclusive" with the reason); totals only between runs of the same length, the energy
    per sample (a rate) between others."""
    parts = []
    found = comparison.gains[index] if comparison.gains else None
    if found is not None:
        parts.append(found.text())
    unequal = comparison.length_differs(index)
    per_sample = () if found is not None and found.objective == "energy_per_sample" else (  # the gain says it
        ("energy_per_sample_j", "energy per sample"),)
    for key, word in per_sample if unequal else (
            ("duration_s", "time"), ("energy_kwh", "energy"), ("cost", "cost")):
        try:
            row = comparison.metric(key)
        except KeyError:
            continue
        if row.rel[index] is not None:
            parts.append(f"{fmt_change(row.rel[index])} {word}" + (_simulated(comparison, index) if key != "duration_s" else "")
                         + ("" if row.comparable(index) else _NOT_COMPARABLE))
    try:
        sm = comparison.metric("sm_util_mean")
        base, value = sm.values[comparison.baseline], sm.values[index]
        if base is not None and value is not None:
            parts.append(f"sm_util {fmt_pct(base)} -> {fmt_pct(value)}" + _simulated(comparison, index)
                         + ("" if sm.comparable(index) else _NOT_COMPARABLE))
    except KeyError:
        pass
    parts += serving_effect(comparison.metrics, comparison.baseline, index)
    for row in comparison.metrics:
        before, after = row.values[comparison.baseline], row.values[index]
        if row.user and before is not None and after is not None:  # equal is "same", not "1->1"
            parts.append(f"{row.key} same ({after:g})" if before == after else f"{row.key} {before:g}->{after:g}")
    return ", ".join(parts)
