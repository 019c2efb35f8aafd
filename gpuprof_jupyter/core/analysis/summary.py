"""The summary of one experiment: per-device and overall figures, steps, requests, phases, gaps.

Runs in any process (core).

Across GPUs, utilisations are averaged per tick, power and energy are totals, and the memory
peak is the largest device's. Means and shares are time-weighted with gaps excluded.

Samples are read one device and one column at a time (``Experiment.device_columns``), never as
the whole long frame, so memory stays small however long the run; samples and steps are read as
numpy columns (``store.columns``), so the sampler process, which summarises every run, never
imports pandas.
"""

from __future__ import annotations

import math

import numpy as np

from gpuprof_jupyter.core.format import json_safe
from gpuprof_jupyter.core.metrics import decode_throttle_reasons
from gpuprof_jupyter.core.analysis.memory import memory_summary, step_peaks
from gpuprof_jupyter.core.analysis.windows import metric_windows
from gpuprof_jupyter.core.analysis.series import across_devices, column
from gpuprof_jupyter.core.analysis.latency import requests_summary
from gpuprof_jupyter.core.analysis.ranks import rank_figures
from gpuprof_jupyter.core.analysis.step_figures import steps_summary
from gpuprof_jupyter.core.analysis.stats import gap_spans, overlap_weights, sample_weights, time_share, weighted_mean, weighted_quantile, weighted_quantiles

SM_LOW_THRESHOLD = 50.0  # % : the usual alert line, "SM < 50 %"


def util_stats(prefix: str, values: np.ndarray, weights: np.ndarray) -> dict:
    p50, p95 = weighted_quantiles(values, weights, (0.50, 0.95))
    return {f"{prefix}_mean": weighted_mean(values, weights), f"{prefix}_p50": p50, f"{prefix}_p95": p95}


def _max(values: np.ndarray) -> float:
    return float(np.nanmax(values)) if np.isfinite(values).any() else float("nan")


def _last_valid(values: np.ndarray) -> float:
    valid = values[~np.isnan(values)]
    return float(valid[-1]) if len(valid) else float("nan")


def _gpu_figures(t: np.ndarray, get, interval: float, gaps=()) -> dict:
    """Figures of one GPU: ``t`` its sample times, ``get(metric)`` one metric's values."""
    w = sample_weights(t, interval, gaps)
    sm = get("sm_util")
    out = util_stats("sm_util", sm, w)
    out["sm_low_frac"] = time_share(sm < SM_LOW_THRESHOLD, sm, w)
    del sm
    for metric in ("gpu_busy", "sm_occupancy", "tensor_util"):
        out[f"{metric}_mean"] = weighted_mean(get(metric), w)
    bw = get("mem_bw_util")
    out["mem_bw_util_mean"] = weighted_mean(bw, w)
    out["mem_bw_util_p95"] = weighted_quantile(bw, w, 0.95)
    del bw
    power = get("power_w")
    out["power_mean_w"] = weighted_mean(power, w)
    out["power_max_w"] = _max(power)
    del power
    out["energy_j"] = _last_valid(get("energy_j"))
    for metric in ("gpu_mem_used_bytes", "torch_mem_allocated_bytes", "torch_mem_reserved_bytes", "step_peak_memory_bytes"):
        out[metric.replace("_bytes", "_peak_bytes")] = _max(get(metric))
    out["gpu_mem_peak_bytes"] = out.pop("gpu_mem_used_peak_bytes")
    out["gpu_mem_total_bytes"] = _last_valid(get("gpu_mem_total_bytes"))
    for metric in ("own_sm_util", "other_sm_util"):  # per-process attribution (1 s lane, NaN between)
        out[f"{metric}_mean"] = weighted_mean(get(metric), w)
    for metric in ("own_gpu_mem_bytes", "other_gpu_mem_bytes"):
        out[metric.replace("_bytes", "_peak_bytes")] = _max(get(metric))
    out["gpu_temp_max_c"] = _max(get("gpu_temp_c"))
    out["sm_clock_mean_mhz"] = weighted_mean(get("sm_clock_mhz"), w)
    out["throttle_shares"] = throttle_shares(get("throttle_reasons"), w)
    out["measured_s"] = float(w.sum())
    out["last_t"] = float(t[-1]) if len(t) else float("nan")
    return out


def throttle_shares(masks: np.ndarray, weights: np.ndarray) -> dict[str, float]:
    """reason name -> share of measured time it was active (gpu_idle left out: not a throttle)."""
    ok = ~np.isnan(masks) & (weights > 0)
    total = weights[ok].sum()
    if total <= 0:
        return {}
    shares: dict[str, float] = {}
    for mask in np.unique(masks[ok]):
        for name in decode_throttle_reasons(mask):
            if name != "gpu_idle":
                shares[name] = shares.get(name, 0.0) + float(weights[ok & (masks == mask)].sum() / total)
    return shares


def _host_figures(t: np.ndarray, get, interval: float, gaps=()) -> dict:
    w = sample_weights(t, interval, gaps)
    out = util_stats("cpu_util", get("cpu_util"), w)
    out["host_cpu_util_mean"] = weighted_mean(get("host_cpu_util"), w)
    out["rss_peak_bytes"] = _max(get("rss_bytes"))
    out["disk_read_mean_bytes_s"] = weighted_mean(get("disk_read_bytes_s"), w)
    out["disk_write_mean_bytes_s"] = weighted_mean(get("disk_write_bytes_s"), w)
    return out


def _device_figures(experiment, key: str, figures, interval: float, gaps=()) -> dict:
    """``figures(t, get, ...)`` for one device, reading its samples one column at a time."""
    t = np.asarray(experiment.device_columns(key, [])["t"], dtype="float64")
    if not len(t):
        return {}

    def get(name: str) -> np.ndarray:
        return column(experiment.device_columns(key, [name]), name)

    return figures(t, get, interval, gaps)


def _host_of(experiment, interval: float, gaps=()) -> dict:
    """The host's figures; a multi-node job's (``core/job.py``: one ``HOST/host`` device per node)
    averaged over its nodes, its peak RSS the largest."""
    keys = [d["key"] for d in experiment.meta.devices if d.get("kind") == "host" and d.get("key") != "host"]
    if not keys:
        return _device_figures(experiment, "host", _host_figures, interval, gaps)
    nodes = [f for f in (_device_figures(experiment, key, _host_figures, interval, gaps) for key in keys) if f]
    out = {}
    for name in {n for f in nodes for n in f}:
        values = [float(f[name]) for f in nodes if isinstance(f.get(name), (int, float)) and np.isfinite(f[name])]
        out[name] = (max(values) if name == "rss_peak_bytes" else float(np.mean(values))) if values else float("nan")
    return out


def overall_gpu(experiment, gpu_keys: list[str], per_device: dict, interval: float, gaps=(),
                series: dict | None = None) -> dict:
    """Across GPUs: per-tick mean of utilisations; totals of power and energy; max memory.

    ``series``: per-tick means already computed, {metric: (t, mean)} (filled in when given).
    """
    out: dict = {"gpu_count": len(gpu_keys)}
    if not gpu_keys:
        return out
    stored = set(experiment.sample_columns())
    for metric in ("sm_util", "mem_bw_util"):
        if metric not in stored:
            continue
        t, mean_series = across_devices(experiment, gpu_keys, metric, "mean")
        if series is not None:
            series[metric] = (t, mean_series)
        w = sample_weights(t, interval, gaps)
        out.update(util_stats(metric, mean_series, w))
        if metric == "sm_util":
            out["sm_low_frac"] = time_share(mean_series < SM_LOW_THRESHOLD, mean_series, w)
    devs = [per_device[k] for k in gpu_keys]
    out["power_mean_w"] = float(np.nansum([d["power_mean_w"] for d in devs])) if any(
        not math.isnan(d["power_mean_w"]) for d in devs) else float("nan")
    energies = [d["energy_j"] for d in devs if not math.isnan(d["energy_j"])]
    out["energy_j"] = float(sum(energies)) if energies else float("nan")
    out["energy_kwh"] = out["energy_j"] / 3.6e6
    peaks = [d["gpu_mem_peak_bytes"] for d in devs if not math.isnan(d["gpu_mem_peak_bytes"])]
    out["gpu_mem_peak_bytes"] = max(peaks) if peaks else float("nan")
    torch_peaks = [d["torch_mem_allocated_peak_bytes"] for d in devs if not math.isnan(d["torch_mem_allocated_peak_bytes"])]
    out["torch_mem_allocated_peak_bytes"] = max(torch_peaks) if torch_peaks else float("nan")
    return out


def phases_summary(experiment, phases: list[dict], gpu_keys: list[str], interval: float, gaps=(),
                   sm_series: tuple | None = None) -> list[dict]:
    """Per phase name (a ``phase("fwd")`` entered in every step of a loop is one row): how often
    it was entered, its total duration, SM utilisation (per-tick mean across GPUs,
    time-weighted over all its spans) and energy (the GPUs' counters interpolated at each
    span's ends, summed); ``start_s``/``end_s``: its first start and last end.

    ``sm_series``: ``(t, per-tick mean sm_util)`` when already computed.
    """
    if not phases:
        return []
    if gpu_keys and sm_series is None:
        sm_series = across_devices(experiment, gpu_keys, "sm_util", "mean")
    t_sm, sm_mean = sm_series if gpu_keys else (np.zeros(0), np.zeros(0))
    spans: dict[str, list] = {}  # name -> its (start, end) spans, names in first-seen order
    for p in phases:
        spans.setdefault(p["name"], []).append((p["start_s"], p.get("end_s") or p["start_s"]))
    names = list(spans)
    bounds = {name: np.array(spans[name]).T for name in names}  # (starts, ends) arrays
    energy = dict.fromkeys(names, 0.0)
    for key in gpu_keys:  # one device's energy counter at a time
        frame = experiment.device_columns(key, ["energy_j"])
        e = column(frame, "energy_j")
        ok = ~np.isnan(e)
        if ok.sum() >= 2:
            tt, ee = np.asarray(frame["t"], dtype="float64")[ok], e[ok]
            for name in names:
                starts, ends = bounds[name]
                energy[name] += float(np.sum(np.interp(ends, tt, ee) - np.interp(starts, tt, ee)))
    weights = sample_weights(t_sm, interval, gaps)
    out = []
    for name in names:
        starts, ends = bounds[name]
        total = seconds = 0.0
        for start, end in spans[name]:  # each sample counts for its time inside the span
            cut, w = overlap_weights(t_sm, weights, start, end)
            values = sm_mean[cut]
            ok = ~np.isnan(values) & (w > 0)
            total, seconds = total + float(np.sum(values[ok] * w[ok])), seconds + float(np.sum(w[ok]))
        sm = total / seconds if seconds > 0 else float("nan")
        out.append({"name": name, "count": len(spans[name]), "start_s": float(starts.min()),
                    "end_s": float(ends.max()), "duration_s": float(np.sum(ends - starts)),
                    "sm_util_mean": sm, "energy_j": energy[name] if gpu_keys else float("nan")})
    return out


def summarize(experiment) -> dict:
    """Figures for ``experiment`` (an Experiment: .meta, .steps and the per-device readers
    ``device_columns``/``sample_columns``; its ``samples`` frame is not loaded for this)."""
    meta = experiment.meta
    interval = meta.sampling_interval_s
    gaps = meta.gaps or []
    gpu_keys = [d["key"] for d in meta.gpu_devices]
    per_device: dict[str, dict] = {}
    for key in gpu_keys:
        per_device[key] = _device_figures(experiment, key, _gpu_figures, interval, gaps) or {"measured_s": 0.0}
    measured_gpus = [k for k in gpu_keys if per_device[k].get("measured_s")]
    host = _host_of(experiment, interval, gaps)
    series: dict = {}
    steps = steps_summary(experiment.step_columns())
    overall = overall_gpu(experiment, measured_gpus, per_device, interval, gaps, series=series)
    summary = {
        "duration_s": meta.duration_s,
        "devices": per_device,
        "host": host,
        "overall": overall,
        "steps": steps,
        "requests": requests_summary(experiment.request_columns()),
        "phases": phases_summary(experiment, meta.phases, measured_gpus, interval, gaps, series.get("sm_util")),
        "gaps": {"count": len(gaps), "total_s": float(sum(e - s for s, e in gap_spans(gaps)))},
        "simulated": meta.simulated,
        "metric_windows": metric_windows(meta, steps.get("step_time_p50_s")),
    }
    summary["overall"]["cpu_util_mean"] = host.get("cpu_util_mean", float("nan"))
    memory = memory_summary(meta.context, experiment.step_columns(), {k: per_device[k] for k in measured_gpus})
    if isinstance(meta.context.get("oom"), dict):  # it died of torch.OutOfMemoryError (analysis.oom)
        memory["oom"] = _oom(experiment, memory)
    if memory:  # torch's per-step peaks or a sampled step's breakdown (analysis.memory)
        summary["memory"] = memory
    summary["run_kind"] = run_kind(steps.get("count", 0), summary["requests"].get("count", 0))
    ranks = rank_figures(experiment)
    if ranks:  # a distributed run: each rank's steps (``steps`` above is the lowest rank's)
        summary["ranks"] = {str(rank): figures for rank, figures in ranks.items()}
    if meta.trace:  # a --trace window was asked for (analysis.trace_summary)
        from gpuprof_jupyter.core.analysis.trace_summary import summarize_trace

        from gpuprof_jupyter.core.analysis.time_breakdown import experiment_breakdowns

        traced = meta.trace.get("rank")  # --trace on-alert under gpuprof run: the window is that rank's
        traced_steps = experiment.rank_steps().get(traced) if traced is not None else None
        summary["trace"] = summarize_trace(experiment.trace, meta.trace,
                                           experiment.steps if traced_steps is None else traced_steps)
        summary["trace"]["breakdowns"] = experiment_breakdowns(experiment)  # where each window's time went
    return json_safe(summary)


def run_kind(steps: int, requests: int) -> str | None:
    """"training" (steps), "serving" (requests), "training and serving" (both: evaluation
    under no_grad inside a training loop, say), or None (neither)."""
    if steps and requests:
        return "training and serving"
    return "training" if steps else ("serving" if requests else None)


def _oom(experiment, memory: dict) -> dict:
    """``summary["memory"]["oom"]``: the step it died in, its step peaks, its batch."""
    from gpuprof_jupyter.core.analysis.oom import oom_summary
    from gpuprof_jupyter.core.analysis.run_batch import run_batch

    steps = experiment.step_columns()
    return oom_summary(experiment.meta.context["oom"], memory, experiment.meta.context, len(steps),
                       step_peaks(steps), run_batch(experiment))


def summary_of(experiment) -> dict:
    """``experiment``'s summary: the stored one, else computed now and kept in its metadata."""
    if not experiment.meta.summary:
        experiment.meta.summary = summarize(experiment)
    elif "metric_windows" not in experiment.meta.summary:  # saved before windows were recorded
        summary = experiment.meta.summary
        summary["metric_windows"] = metric_windows(experiment.meta, (summary.get("steps") or {}).get("step_time_p50_s"))
    return experiment.meta.summary
