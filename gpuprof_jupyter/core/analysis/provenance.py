"""What a metric measured in one experiment, and whether a run or a step is long enough to
conclude anything from it.

Runs in any process (core).

Findings, rules and comparisons ask here before they claim anything (docs/metrics.md, "Provenance
in conclusions"):

* ``measured_as``: words for a reading that is a weaker quantity than its metric's name says
  (NVML ``utilization.gpu`` stored as ``sm_util`` is kernel-active time, not SMs busy);
* ``too_short``: the run covered fewer than ``MIN_WINDOWS`` of the metric's native window, so
  nothing is concluded from it;
* ``short_steps``: steps shorter than the window or the sampling interval, so per-step values
  cannot be judged;
* ``provenance_differences``: experiments whose metric came from different APIs;
* ``gpu_measured``: whether the run has GPU readings at all (a claim about the GPU needs them).

Windows come from the experiment's provenance and interval (``metrics.NATIVE_WINDOWS``), so
experiments saved before windows were recorded get them too.
"""

from __future__ import annotations

import numpy as np

from gpuprof_jupyter.core.metrics import CANNOT_TELL, METRICS, describe_provenance
from gpuprof_jupyter.core.analysis.windows import metric_tags, metric_windows
from gpuprof_jupyter.core.format import fmt_unit

MIN_WINDOWS = 3  # a run must cover this many native windows of a metric before it is judged on it

# Figures (summary/comparison keys) -> the sampled metric they are made of.
_FIGURE_METRIC = {"sm_low_frac": "sm_util", "power_mean_w": "power_w", "power_max_w": "power_w",
                  "energy_kwh": "energy_j", "energy_per_sample_j": "energy_j", "sm_clock_mean_mhz": "sm_clock_mhz"}


def base_metric(name: str) -> str | None:
    """The sampled metric a rule or figure name is about (``sm_util_mean`` -> ``sm_util``), or None."""
    if name in METRICS:
        return name
    if name in _FIGURE_METRIC:
        return _FIGURE_METRIC[name]
    prefixes = [m for m in METRICS if name.startswith(m + "_")]
    return max(prefixes, key=len) if prefixes else None


def _window(meta, metric: str) -> dict | None:
    return metric_windows(meta).get(metric)


def _window_words(metric: str, window: dict) -> str:
    tags = ", ".join(window["provenance"])
    return f"{metric}'s native window is {fmt_unit(window['window_s'], 's')} ({window['window']}; {tags})"


def measured_as(meta, metric: str) -> str | None:
    """What ``metric`` measured when its provenance is weaker than its name (else None), e.g.
    "sm_util here is kernel-active time (...); how many SMs were busy is not measurable on
    this GPU"."""
    tags = metric_tags(meta, metric)
    weak = [t for t in tags if (metric, t) in CANNOT_TELL]
    if not weak:
        return None
    if len(tags) > 1:
        where = "on the GPUs that gave it"
    else:
        where = "on this GPU" if len(meta.gpu_devices) <= 1 else "on these GPUs"
    return (f"{metric} here is {describe_provenance(weak[0])} ({weak[0]}); "
            f"{CANNOT_TELL[(metric, weak[0])]} is not measurable {where}")


def gpu_measured(meta) -> bool:
    """True when the run read a GPU (NVML, Prometheus, or a simulated one, labelled so): only then
    may a finding speak of the GPU or advise GPU-side remedies (pinned memory, CUDA graphs)."""
    return any(meta.provenance.get(device["key"]) for device in meta.gpu_devices)


def sm_is_kernel_active(meta) -> bool:
    """True when some GPU's ``sm_util`` is NVML kernel-active time, which says nothing of SM saturation."""
    return "nvml.utilization.gpu" in metric_tags(meta, "sm_util")


def run_seconds(experiment, metric: str) -> float | None:
    """Measured time of the run for ``metric`` (gaps excluded): the longest-measured GPU for a
    GPU metric, never more than the run's duration (the last sample stands for one interval
    past it); the run's duration for a host metric."""
    from gpuprof_jupyter.core.analysis.summary import summary_of

    summary = summary_of(experiment)
    duration = experiment.meta.duration_s if experiment.meta.duration_s is not None else summary.get("duration_s")
    measured = []
    if (METRICS[metric].scope if metric in METRICS else "gpu") == "gpu":
        measured = [d["measured_s"] for d in (summary.get("devices") or {}).values() if d.get("measured_s") is not None]
    if measured:
        return float(max(measured) if duration is None else min(max(measured), duration))
    return None if duration is None else float(duration)


def too_short(experiment, metric: str, run_s: float | None = None) -> str | None:
    """Why the run (or ``run_s`` of it) is too short to conclude anything from ``metric``, or None.

    Too short: fewer than ``MIN_WINDOWS`` native windows. A metric measured instantly (window 0)
    or not at all is never too short here.
    """
    window = _window(experiment.meta, metric)
    if window is None or window["window_s"] <= 0:
        return None
    run_s = run_seconds(experiment, metric) if run_s is None else run_s
    if run_s is None or run_s >= MIN_WINDOWS * window["window_s"]:
        return None
    return (f"the run measured {fmt_unit(run_s, 's', 2)} of {metric}, fewer than {MIN_WINDOWS} of its native windows "
            f"({_window_words(metric, window)}): too short for this metric, so nothing is concluded from it")


def step_window(meta, metric: str) -> float | None:
    """The shortest step a per-step value of ``metric`` can describe on its own: the longer of
    its native window and the sampling interval (a step shorter than the interval sees at most
    one reading, shared with its neighbours). None when ``metric`` was not measured."""
    window = _window(meta, metric)
    if window is None:
        return None
    return max(float(window["window_s"]), float(meta.sampling_interval_s or 0.0))


def short_steps(experiment, metric: str, durations) -> str | None:
    """Why per-step values of ``metric`` cannot be judged (median step shorter than
    ``step_window``: each step's value repeats readings that span several steps), or None."""
    longest = step_window(experiment.meta, metric)
    durations = np.asarray(durations, dtype="float64")
    durations = durations[~np.isnan(durations)]
    if longest is None or longest <= 0 or not len(durations):
        return None
    median = float(np.median(durations))
    if median >= longest:
        return None
    window = _window(experiment.meta, metric)
    interval = float(experiment.meta.sampling_interval_s or 0.0)
    limit = (f"{metric}'s native window ({fmt_unit(window['window_s'], 's')}: {window['window']}; {', '.join(window['provenance'])})"
             if window["window_s"] >= interval else f"the sampling interval ({fmt_unit(interval, 's')})")
    return (f"steps last {fmt_unit(median, 's', significant=3)} (median), shorter than {limit}, so each step's value repeats "
            "readings that span several steps")


def quantity_differs(metric: str, tags_a, tags_b) -> bool:
    """True when two sets of tags measure different quantities under one metric name: one side
    is a weaker reading (``CANNOT_TELL``: kernel-active time vs SMs busy) and the other is not.
    Other differences (instant vs averaged power) measure the same quantity differently."""
    def weak(tags):
        return any((metric, t) in CANNOT_TELL for t in tags)
    return weak(tags_a) != weak(tags_b)


def difference_headline(metric: str, tags_a, tags_b) -> str:
    """How loudly a difference of APIs is announced: a different quantity, or a different measurement."""
    return "NOT THE SAME QUANTITY" if quantity_differs(metric, tags_a, tags_b) else "MEASURED DIFFERENTLY"


def provenance_differences(experiments, baseline: int, metrics) -> dict[str, list]:
    """metric -> the experiments whose ``metric`` came from other APIs than the baseline's
    (only metrics where some differ). The one test of "different provenance" for comparisons,
    exports and gates."""
    base = experiments[baseline]
    out: dict[str, list] = {}
    for metric in metrics:
        differ = [e for e in experiments if metric_tags(e.meta, metric) != metric_tags(base.meta, metric)]
        if differ:
            out[metric] = differ
    return out


def provenance_words(meta, metric: str) -> str:
    """``'kernel-active time (...) [nvml.utilization.gpu]'``, or 'not measured'."""
    tags = metric_tags(meta, metric)
    return "; ".join(f"{describe_provenance(t)} [{t}]" for t in tags) or "not measured"


def recorded_provenance_warnings(meta, recorded: dict, where: str) -> list[str]:
    """Loud warnings where this run's metrics came from other APIs than those ``recorded`` with
    a gate's thresholds (``{metric: "tag, tag"}``, as ``pipeline.yaml`` keeps them in
    ``profiling.provenance``): the gate would compare different quantities."""
    warnings = []
    for metric, tags in (recorded or {}).items():
        expected = sorted(t.strip() for t in str(tags).split(",") if t.strip())
        measured = metric_tags(meta, metric)
        if expected and measured != expected:
            warnings.append(f"{difference_headline(metric, expected, measured)}: the thresholds in {where} were set "
                            f"where {metric} was "
                            f"{'; '.join(f'{describe_provenance(t)} [{t}]' for t in expected)}, but this run "
                            f"measured {provenance_words(meta, metric)}: the gate compares different "
                            f"{'quantities' if quantity_differs(metric, expected, measured) else 'measurements'}")
    return warnings


def recorded_provenance(meta, metrics) -> dict[str, str]:
    """``{metric: "tag, tag"}`` for the measured ones of ``metrics``: what a gate's thresholds were set on."""
    out = {}
    for metric in metrics:
        tags = metric_tags(meta, metric)
        if tags:
            out[metric] = ", ".join(tags)
    return out
