"""Serving figures of a run's requests: latency percentiles, throughput, warm-up, per batch size.

Runs in any process (core).

Reads the requests as numpy columns (``Experiment.request_columns``: ``core/finish.py``
REQUEST_FIELDS). Warm-up is found by one rule, said in the summary (``warmup_rule``): the
leading requests slower than twice the run's median latency, at most the first 10 % of them
(at least one may always be). They are reported apart (``warmup_count``,
``warmup_latency_s``) and left out of every other figure.

Throughput is over the steady requests' span, from the first one's start to the last one's
end: time between requests (host work, data) counts, as it does for a user waiting.
Percentiles are numpy's default (linear between order statistics).
"""

from __future__ import annotations

import math

import numpy as np

WARMUP_FACTOR = 2.0  # slower than this many times the median latency: still warming up
WARMUP_MAX_SHARE = 0.10  # warm-up is at most this share of the requests
WARMUP_RULE = (f"leading requests slower than {WARMUP_FACTOR:g}x the median latency, "
               f"at most the first {WARMUP_MAX_SHARE:.0%} (at least 1)")
QUANTILES = (("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99))
CHANGE_RESAMPLES = 400  # bootstrap resamples of a latency change's interval


def warmup_count(latency: np.ndarray) -> int:
    """How many leading requests are warm-up (``WARMUP_RULE``)."""
    n = len(latency)
    if n < 2:
        return 0
    limit = max(1, int(math.floor(n * WARMUP_MAX_SHARE)))
    threshold = WARMUP_FACTOR * float(np.nanmedian(latency))
    count = 0
    while count < limit and latency[count] > threshold:
        count += 1
    return count


def _covered(starts: np.ndarray, ends: np.ndarray) -> float:
    """Seconds inside at least one of the spans ``[start, end)`` (overlaps counted once)."""
    covered, reach = 0.0, -math.inf
    for start, end in sorted(zip(starts, ends)):
        if not (math.isfinite(start) and math.isfinite(end)):
            continue
        if end > reach:
            covered += end - max(start, reach)
            reach = end
    return covered


def _rate(total: float, span: float) -> float:
    return total / span if span > 0 else math.nan


def _percentiles(values: np.ndarray, prefix: str) -> dict:
    values = values[np.isfinite(values)]
    if not len(values):
        return {}
    out = {f"{prefix}_{name}_s": float(np.percentile(values, q)) for name, q in QUANTILES}
    out[f"{prefix}_max_s"] = float(values.max())
    out[f"{prefix}_mean_s"] = float(values.mean())
    return out


def _throughput(start: np.ndarray, end: np.ndarray, batch: np.ndarray, tokens: np.ndarray) -> dict:
    span = float(end.max() - start.min()) if len(start) else 0.0
    out = {"span_s": span, "requests_per_s": _rate(len(start), span)}
    if np.isfinite(batch).any():
        out["samples_per_s"] = _rate(float(np.nansum(batch)), span)
    if np.isfinite(tokens).any():
        out["tokens_per_s"] = _rate(float(np.nansum(tokens)), span)
    return out


def steady_requests(requests) -> dict[str, np.ndarray]:
    """The requests after warm-up, as arrays (``latency``, ``start``, ``end``, ``batch``, ...) in
    start order; with ``warmup`` (the leading count left out)."""
    start = np.asarray(requests["t_start_s"], dtype="float64")
    order = np.argsort(start, kind="stable")
    get = {name: np.asarray(requests[name], dtype="float64")[order]
           for name in ("t_start_s", "latency_s", "host_s", "batch", "tokens", "ttft_s")}
    for name in ("gc_s", "wait_s"):  # recorded since GC and data waits were attributed to requests
        get[name] = (np.asarray(requests[name], dtype="float64")[order] if name in requests
                     else np.zeros(len(order)))
    skip = warmup_count(get["latency_s"])
    out = {name: values[skip:] for name, values in get.items()}
    out["end"] = out["t_start_s"] + np.fmax(out["host_s"], out["latency_s"])
    out["warmup"] = skip
    out["warmup_latency_s"] = get["latency_s"][:skip]
    return out


def requests_summary(requests) -> dict:
    """The summary's ``requests``: {} when the run had none."""
    if requests is None or len(requests) == 0:
        return {}
    steady = steady_requests(requests)
    latency, start, end = steady["latency_s"], steady["t_start_s"], steady["end"]
    cuda = np.asarray(requests["cuda"], dtype=bool) if "cuda" in requests else np.zeros(len(requests), dtype=bool)
    kinds = requests["kind"] if "kind" in requests else []
    out = {
        "count": int(len(requests)),
        "measured": int(len(latency)),
        "warmup_count": int(steady["warmup"]),
        "warmup_rule": WARMUP_RULE,
        "warmup_latency_s": [float(v) for v in steady["warmup_latency_s"]],
        "timing": ("CUDA events (until the request's GPU work was done)" if cuda.all() else
                   "host wall time" if not cuda.any() else "CUDA events where recorded, else host wall time"),
        "kinds": {str(k): int(n) for k, n in zip(*np.unique(np.asarray(kinds, dtype=str), return_counts=True))},
    }
    out.update(_percentiles(latency, "latency"))
    if cuda.any():
        out.update({k: v for k, v in _percentiles(steady["host_s"], "host").items() if k in ("host_p50_s", "host_p99_s")})
    out.update(_throughput(start, end, steady["batch"], steady["tokens"]))
    out["busy_frac"] = _covered(start, start + latency) / out["span_s"] if out["span_s"] > 0 else math.nan
    # requests in flight on average: above 1 when threads serve at once (busy_frac stays a share)
    out["concurrency_mean"] = float(np.nansum(latency) / out["span_s"]) if out["span_s"] > 0 else math.nan
    ttft = steady["ttft_s"][np.isfinite(steady["ttft_s"])]
    if len(ttft):
        out["ttft_p50_s"], out["ttft_p90_s"] = float(np.percentile(ttft, 50)), float(np.percentile(ttft, 90))
    batches = steady["batch"][np.isfinite(steady["batch"])]
    if len(np.unique(batches)) > 1:
        out["per_batch"] = per_batch(steady)
    elif len(batches):
        out["batch"] = float(batches[0])
    return out


def per_batch(steady: dict) -> list[dict]:
    """One row per batch size: count, latency p50/p99 and samples/s (batch over the median
    latency: the rate a loop of only that batch would reach)."""
    rows = []
    batch = steady["batch"]
    for size in np.unique(batch[np.isfinite(batch)]):
        latency = steady["latency_s"][batch == size]
        p50 = float(np.percentile(latency, 50))
        rows.append({"batch": float(size), "count": int(len(latency)), "latency_p50_s": p50,
                     "latency_p99_s": float(np.percentile(latency, 99)),
                     "samples_per_s": _rate(float(size), p50)})
    return rows


def change_interval(baseline, other, figure: str, confidence: float = 0.95, seed: int = 0) -> tuple[float, float] | None:
    """A bootstrap interval of ``other``'s figure minus ``baseline``'s, for a latency
    percentile (``latency_p50_s``, ...) or ``requests_per_s``: each run's steady requests
    resampled with replacement (seeded: the same runs give the same interval). None when a
    run has fewer than 5 steady requests."""
    a, b = steady_requests(baseline), steady_requests(other)
    if len(a["latency_s"]) < 5 or len(b["latency_s"]) < 5:
        return None
    rng = np.random.default_rng(seed)
    fa, fb = _resampled(a, figure, rng), _resampled(b, figure, rng)
    diffs = fb - fa
    tail = (1 - confidence) / 2 * 100
    return float(np.percentile(diffs, tail)), float(np.percentile(diffs, 100 - tail))


def _resampled(steady: dict, figure: str, rng) -> np.ndarray:
    latency = steady["latency_s"]
    picks = rng.integers(0, len(latency), size=(CHANGE_RESAMPLES, len(latency)))
    if figure == "requests_per_s":  # the span stays; the rate moves with the mean time per request
        per_request = (steady["end"].max() - steady["t_start_s"].min()) / len(latency)
        gaps = per_request - latency.mean()  # time between requests, kept as it was
        return 1.0 / (latency[picks].mean(axis=1) + gaps)
    for name, q in QUANTILES:
        if figure == f"latency_{name}_s":
            return np.percentile(latency[picks], q, axis=1)
    raise ValueError(f"no interval for {figure!r}")


__all__ = ["WARMUP_RULE", "change_interval", "per_batch", "requests_summary", "steady_requests", "warmup_count"]
