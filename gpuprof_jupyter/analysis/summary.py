"""The summary of one experiment: per-device and overall figures, steps, phases, gaps.

Across GPUs, utilisations are averaged per tick, power and energy are totals, and the memory
peak is the largest device's. Means and shares are time-weighted with gaps excluded.
"""

from __future__ import annotations

import math

import numpy as np

from ..metrics import decode_throttle_reasons
from .stats import sample_weights, time_share, weighted_mean, weighted_quantile

SM_LOW_THRESHOLD = 50.0  # % : "SM < 50 %" is the seeds' alert line


def _nan_to_none(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _clean(obj):
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer)):
        obj = obj.item()
    return _nan_to_none(obj)


def util_stats(prefix: str, values: np.ndarray, weights: np.ndarray) -> dict:
    return {
        f"{prefix}_mean": weighted_mean(values, weights),
        f"{prefix}_p50": weighted_quantile(values, weights, 0.50),
        f"{prefix}_p95": weighted_quantile(values, weights, 0.95),
    }


def _column(frame, name: str) -> np.ndarray:
    if name in frame:
        return frame[name].to_numpy(dtype="float64")
    return np.full(len(frame), np.nan)


def _last_valid(values: np.ndarray) -> float:
    valid = values[~np.isnan(values)]
    return float(valid[-1]) if len(valid) else float("nan")


def gpu_device_summary(frame, interval: float, gaps=()) -> dict:
    t = frame["t"].to_numpy()
    w = sample_weights(t, interval, gaps)
    sm = _column(frame, "sm_util")
    out = util_stats("sm_util", sm, w)
    out["sm_low_frac"] = time_share(sm < SM_LOW_THRESHOLD, sm, w)
    for metric in ("gpu_busy", "mem_bw_util", "sm_occupancy", "tensor_util"):
        values = _column(frame, metric)
        out[f"{metric}_mean"] = weighted_mean(values, w)
    out["mem_bw_util_p95"] = weighted_quantile(_column(frame, "mem_bw_util"), w, 0.95)
    power = _column(frame, "power_w")
    out["power_mean_w"] = weighted_mean(power, w)
    out["power_max_w"] = float(np.nanmax(power)) if np.isfinite(power).any() else float("nan")
    out["energy_j"] = _last_valid(_column(frame, "energy_j"))
    for metric in ("gpu_mem_used_bytes", "torch_mem_allocated_bytes", "torch_mem_reserved_bytes"):
        values = _column(frame, metric)
        out[metric.replace("_bytes", "_peak_bytes")] = float(np.nanmax(values)) if np.isfinite(values).any() else float("nan")
    out["gpu_mem_peak_bytes"] = out.pop("gpu_mem_used_peak_bytes")
    out["gpu_mem_total_bytes"] = _last_valid(_column(frame, "gpu_mem_total_bytes"))
    out["gpu_temp_max_c"] = float(np.nanmax(_column(frame, "gpu_temp_c"))) if "gpu_temp_c" in frame and frame["gpu_temp_c"].notna().any() else float("nan")
    out["sm_clock_mean_mhz"] = weighted_mean(_column(frame, "sm_clock_mhz"), w)
    out["throttle_shares"] = throttle_shares(_column(frame, "throttle_reasons"), w)
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


def host_summary(frame, interval: float, gaps=()) -> dict:
    w = sample_weights(frame["t"].to_numpy(), interval, gaps)
    cpu = _column(frame, "cpu_util")
    out = util_stats("cpu_util", cpu, w)
    out["host_cpu_util_mean"] = weighted_mean(_column(frame, "host_cpu_util"), w)
    rss = _column(frame, "rss_bytes")
    out["rss_peak_bytes"] = float(np.nanmax(rss)) if np.isfinite(rss).any() else float("nan")
    out["disk_read_mean_bytes_s"] = weighted_mean(_column(frame, "disk_read_bytes_s"), w)
    out["disk_write_mean_bytes_s"] = weighted_mean(_column(frame, "disk_write_bytes_s"), w)
    return out


def overall_gpu(samples, gpu_keys: list[str], per_device: dict, interval: float, gaps=()) -> dict:
    """Across GPUs: per-tick mean of utilisations; totals of power and energy; max memory."""
    out: dict = {"gpu_count": len(gpu_keys)}
    if not gpu_keys:
        return out
    gpus = samples[samples["device"].isin(gpu_keys)]
    for metric in ("sm_util", "mem_bw_util"):
        if metric not in gpus:
            continue
        wide = gpus.pivot_table(index="t", columns="device", values=metric, aggfunc="mean", dropna=False)
        t = wide.index.to_numpy(dtype="float64")
        mean_series = wide.mean(axis=1, skipna=True).to_numpy(dtype="float64")
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


def steps_summary(steps) -> dict:
    if steps is None or len(steps) == 0:
        return {"count": 0}
    duration = steps["duration_s"].to_numpy(dtype="float64")
    wait = steps["wait_s"].to_numpy(dtype="float64")
    n = steps["n_samples"].to_numpy(dtype="float64")
    total = duration.sum()
    out = {
        "count": int(len(steps)),
        "step_time_p50_s": float(np.percentile(duration, 50)),
        "step_time_p95_s": float(np.percentile(duration, 95)),
        "data_wait_frac": float(wait.sum() / total) if total > 0 else float("nan"),
        "steps_per_s": float(len(steps) / total) if total > 0 else float("nan"),
        "samples_per_s": float(np.nansum(n) / total) if total > 0 and np.isfinite(n).any() else float("nan"),
        "samples": float(np.nansum(n)) if np.isfinite(n).any() else float("nan"),
    }
    return out


def phases_summary(samples, phases: list[dict], gpu_keys: list[str], interval: float, gaps=()) -> list[dict]:
    out = []
    gpus = samples[samples["device"].isin(gpu_keys)] if gpu_keys else samples.iloc[0:0]
    for phase in phases:
        start, end = phase["start_s"], phase.get("end_s") or phase["start_s"]
        inside = gpus[(gpus["t"] >= start) & (gpus["t"] <= end)]
        sm = weighted_mean(*(_column(inside, "sm_util"), sample_weights(inside["t"].to_numpy(), interval, gaps))) if len(inside) else float("nan")
        energy = 0.0
        for key in gpu_keys:
            series = gpus[gpus["device"] == key]
            e = _column(series, "energy_j")
            ok = ~np.isnan(e)
            if ok.sum() >= 2:
                tt = series["t"].to_numpy()[ok]
                energy += float(np.interp(end, tt, e[ok]) - np.interp(start, tt, e[ok]))
        out.append({"name": phase["name"], "start_s": start, "end_s": end, "duration_s": end - start,
                    "sm_util_mean": sm, "energy_j": energy if gpu_keys else float("nan")})
    return out


def summarize(experiment) -> dict:
    """Figures for ``experiment`` (an Experiment or anything with .meta/.samples/.steps)."""
    meta, samples = experiment.meta, experiment.samples
    interval = meta.interval_s or 0.1
    gaps = meta.gaps or []
    gpu_keys = [d["key"] for d in meta.devices if d.get("kind") == "gpu"]
    per_device: dict[str, dict] = {}
    for key in gpu_keys:
        frame = samples[samples["device"] == key]
        per_device[key] = gpu_device_summary(frame, interval, gaps) if len(frame) else {"measured_s": 0.0}
    measured_gpus = [k for k in gpu_keys if per_device[k].get("measured_s")]
    host_frame = samples[samples["device"] == "host"]
    host = host_summary(host_frame, interval, gaps) if len(host_frame) else {}
    summary = {
        "duration_s": meta.duration_s,
        "devices": per_device,
        "host": host,
        "overall": overall_gpu(samples, measured_gpus, per_device, interval, gaps),
        "steps": steps_summary(experiment.steps),
        "phases": phases_summary(samples, meta.phases, measured_gpus, interval, gaps),
        "gaps": {"count": len(gaps), "total_s": float(sum(e - s for s, e in gaps))},
        "simulated": meta.simulated,
    }
    summary["overall"]["cpu_util_mean"] = host.get("cpu_util_mean", float("nan"))
    return _clean(summary)
