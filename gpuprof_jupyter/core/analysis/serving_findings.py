"""Findings for serving runs: what limits latency and throughput, with the evidence in numbers.

Runs in any process (core).

Four checks over the summary's ``requests`` (``latency.py``) and the requests themselves,
each ``(experiment) -> Finding | None`` like the training checks of ``diagnosis.py``:

* ``serving-host-bound``: the GPU idles between requests (the gaps between them are a large
  share of the serving time), or is little used inside them; the host sets the pace. On a run
  that read no GPU it says only what was measured: the time between requests.
* ``serving-warm-up``: the first requests (warm-up, left out of the figures) took a large share
  of all the request time, or the first one many times the median.
* ``latency-stall``: p99 far above p50; the slow requests are looked at for what coincided
  (Python's garbage collection, a data wait, a sampler gap, a busy host CPU) and it is named.
* ``throughput-flat``: samples/s barely grows as the batch grows within one run: the GPU is
  saturated (compute-bound), a bigger batch only adds latency (the model, on a run that read no GPU).

Every figure of the evidence is typed (core/figure.py): "(simulated)" on a simulated GPU's.
"""

from __future__ import annotations

import numpy as np

from gpuprof_jupyter.core.analysis.finding import Finding
from gpuprof_jupyter.core.analysis.latency import steady_requests
from gpuprof_jupyter.core.analysis.provenance import gpu_measured
from gpuprof_jupyter.core.analysis.series import metric_over_time
from gpuprof_jupyter.core.analysis.stats import overlap_weights, sample_weights, time_share_exact
from gpuprof_jupyter.core.analysis.summary import summary_of
from gpuprof_jupyter.core.analysis.run_figures import REQUEST_HOOK, run_figure
from gpuprof_jupyter.core.figure import measured
from gpuprof_jupyter.core.format import fmt_figure

IDLE_BETWEEN_SHARE = 0.30  # gaps between requests at least this share of the serving span
SM_LOW_INSIDE = 0.50  # or sm_util < 50 % for at least this share of the time while requests fill the span
WARMUP_SHARE = 0.20  # warm-up requests took at least this share of all request time...
WARMUP_RATIO = 10.0  # ...or the first one at least this many times the steady median
STALL_RATIO = 3.0  # p99 at least this many times p50...
STALL_MIN_REQUESTS = 20  # ...over at least this many steady requests
COINCIDE_SHARE = 0.25  # a cause that took at least this share of the slow requests' extra time
FLAT_GAIN = 1.2  # samples/s grew less than this factor...
FLAT_BATCH_RATIO = 2.0  # ...while the batch grew at least this factor


def _requests(experiment) -> dict:
    return summary_of(experiment).get("requests") or {}


def _fig(experiment, key: str, value, unit: str) -> str:
    """The run's figure ``key`` as every view writes it (core/figure.py): "(simulated)" on a
    simulated GPU's figure, "n/a" when missing."""
    return fmt_figure(run_figure(experiment.meta, key, value, unit))


def _req(value, unit: str) -> str:
    """A figure of the served requests, measured by the request hook."""
    return fmt_figure(measured(value, unit, REQUEST_HOOK))


def _served(experiment, r: dict, idle: float) -> str:
    """'the time between requests was 67 % of the serving time (200 requests in 5.98 s, latency p50 10.00 ms)'."""
    return (f"the time between requests was {_req(idle, 'share')} of the serving time ({r['measured']} requests in "
            f"{_req(r['span_s'], 's')}, latency p50 {_req(r.get('latency_p50_s'), 'time')})")


def _cpu_used(experiment, cpu) -> str:
    return f"; the process tree used {_fig(experiment, 'cpu_util_mean', cpu, '%')} of its CPUs" if cpu is not None else ""


def serving_host_bound(experiment):
    r = _requests(experiment)
    busy = r.get("busy_frac")
    if not r.get("measured") or busy is None:
        return None
    idle = max(0.0, 1.0 - busy)
    steady = steady_requests(experiment.request_columns())
    low = _sm_low_during(experiment, float(steady["t_start_s"].min()), float(steady["end"].max()))
    inside_low = low is not None and low >= SM_LOW_INSIDE and idle < IDLE_BETWEEN_SHARE
    if idle < IDLE_BETWEEN_SHARE and not inside_low:
        return None
    cpu = (summary_of(experiment).get("host") or {}).get("cpu_util_mean")
    if not gpu_measured(experiment.meta):
        return _idle_between_host(experiment, r, idle, cpu)
    if idle >= IDLE_BETWEEN_SHARE:
        evidence = _served(experiment, r, idle) + ": the GPU idles while the host prepares the next request"
    else:
        evidence = (f"requests fill {_req(busy, 'share')} of the serving time, yet sm_util was below 50 % for "
                    f"{_fig(experiment, 'sm_low_frac', low, 'share')} of that time: inside each request the GPU waits on "
                    "the host (kernel launches, Python)")
    evidence += _cpu_used(experiment, cpu)
    step = ("batch requests together (several inputs per call) and prepare the next request while this one runs "
            "(a thread, pinned memory and non_blocking copies); cut launch overhead with CUDA graphs or "
            "torch.compile(mode=\"reduce-overhead\")")
    return Finding("serving-host-bound", "Host-bound serving: the GPU waits for the host between or inside requests",
                    "high" if idle >= 0.5 else "medium", evidence, step,
                    {"idle_between_frac": idle, "sm_low_frac": low, "busy_frac": busy})


def _idle_between_host(experiment, r: dict, idle: float, cpu) -> Finding:
    """No GPU was read: the time between requests is the evidence, said of the host only."""
    evidence = (_served(experiment, r, idle) + ": the model waited for the caller between requests; no GPU was read "
                f"in this run (source {experiment.meta.source or 'host'})" + _cpu_used(experiment, cpu))
    step = ("batch requests together (several inputs per call) and prepare the next request while this one runs "
            "(a thread or a queue), so the model is never waiting for its caller")
    return Finding("serving-host-bound", "Idle between requests: the caller sets the pace",
                   "high" if idle >= 0.5 else "medium", evidence, step,
                   {"idle_between_frac": idle, "sm_low_frac": None, "busy_frac": r.get("busy_frac"),
                    "gpu_measured": False})


def _sm_low_during(experiment, start: float, end: float) -> float | None:
    """Share of [start, end] with sm_util (per-tick mean across GPUs) below 50 %, time-weighted,
    gaps excluded; None when not measured there."""
    t, sm = metric_over_time(experiment, "sm_util", "mean")
    if not len(t):
        return None
    weights = sample_weights(t, experiment.meta.sampling_interval_s, experiment.meta.gaps or ())
    span, cut = overlap_weights(t, weights, start, end)
    values = sm[span]
    share = time_share_exact(values < 50.0, values, cut)
    return None if share is None else float(share)


def serving_warm_up(experiment):
    r = _requests(experiment)
    warm = r.get("warmup_latency_s") or []
    p50 = r.get("latency_p50_s")
    if not warm or not p50:
        return None
    total = sum(warm) + (r.get("latency_mean_s") or 0.0) * r.get("measured", 0)
    share = sum(warm) / total if total > 0 else 0.0
    ratio = warm[0] / p50
    if share < WARMUP_SHARE and ratio < WARMUP_RATIO:
        return None
    evidence = (f"the first {len(warm)} request(s) took {_req(sum(warm), 'time')} ({_req(share, 'share')} of all request "
                f"time; the first {_req(ratio, 'ratio')} the steady median of {_req(p50, 'time')}); they are left out of "
                f"the percentiles ({r.get('warmup_rule', '')})")
    paid = ("lazy initialisation, kernel selection (cudnn.benchmark), the allocator and torch.compile's compilation"
            if gpu_measured(experiment.meta) else "lazy initialisation, the first allocations and torch.compile's compilation")
    step = ("warm the model up before serving or measuring (a few requests of each input shape): the first calls pay "
            f"for {paid}; cache compiled artifacts between processes where you can")
    return Finding("serving-warm-up", "Latency dominated by warm-up", "medium" if share >= WARMUP_SHARE else "info",
                    evidence, step, {"warmup_share": share, "first_over_p50": ratio})


def latency_stall(experiment):
    r = _requests(experiment)
    p50, p99 = r.get("latency_p50_s"), r.get("latency_p99_s")
    if not p50 or not p99 or r.get("measured", 0) < STALL_MIN_REQUESTS or p99 < STALL_RATIO * p50:
        return None
    steady = steady_requests(experiment.request_columns())
    latency = steady["latency_s"]
    slow = latency >= min(STALL_RATIO * p50, p99)
    extra = float(np.sum(latency[slow] - p50))
    causes = _coincided(experiment, steady, slow, extra)
    named = "; ".join(text for _, text in causes) if causes else "nothing recorded coincided (not GC, data waits, sampler gaps or a busy host)"
    evidence = (f"p99 {_req(p99, 'time')} is {_req(p99 / p50, 'ratio')} p50 {_req(p50, 'time')}: {int(slow.sum())} slow request(s) of "
                f"{len(latency)}; what coincided: {named}")
    advice = {
        "gc": "Python's garbage collector paused the slow requests: gc.freeze() after loading the model, or "
              "gc.disable() around the serving loop with gc.collect() between batches",
        "data": "the slow requests waited for their data: prefetch inputs (DataLoader workers, a queue) so a request "
                "never waits on I/O",
        "gap": "the whole process stalled (the sampler could not run: a long call holding the GIL, swapping); look "
               "for blocking work on the serving thread",
        "cpu": "the host's CPUs were saturated during the slow requests: other work on the machine or in this "
               "process competes with serving; pin threads or move it elsewhere",
    }
    step = "; ".join(advice[key] for key, _ in causes) or (
        "profile a slow request (--trace) to see what it waits on; check for shape changes that recompile or re-tune")
    return Finding("latency-stall", "Latency stalls: p99 far above p50", "high" if p99 >= 10 * p50 else "medium",
                    evidence, step, {"p50_s": p50, "p99_s": p99, "slow": int(slow.sum()),
                                     "causes": [key for key, _ in causes]})


def _coincided(experiment, steady: dict, slow: np.ndarray, extra: float) -> list[tuple[str, str]]:
    """(cause, text) for what took a share of the slow requests' extra time, largest first."""
    if extra <= 0:
        return []
    found = []
    for key, column, words in (("gc", "gc_s", "garbage collection"), ("data", "wait_s", "data waits")):
        seconds = float(np.sum(steady[column][slow]))
        if seconds >= COINCIDE_SHARE * extra:
            found.append((seconds, key, f"{words} took {_req(seconds, 'time')} inside them "
                                        f"({_req(min(1.0, seconds / extra), 'share')} of their time above p50)"))
    start, end = steady["t_start_s"][slow], steady["end"][slow]
    gaps = [(g[0], g[1]) for g in experiment.meta.gaps or []]
    overlap = sum(max(0.0, min(e, ge) - max(s, gs)) for s, e in zip(start, end) for gs, ge in gaps)
    if overlap >= COINCIDE_SHARE * extra:
        found.append((overlap, "gap", f"sampler gaps (the process stalled) overlapped them for {_req(overlap, 'time')}"))
    busy = _host_cpu_during(experiment, start, end)
    if busy is not None and busy >= 90.0:
        found.append((0.0, "cpu", f"the host's CPUs were {_fig(experiment, 'host_cpu_util', busy, '%')} busy during them"))
    return [(key, text) for _, key, text in sorted(found, key=lambda f: -f[0])]


def _host_cpu_during(experiment, starts, ends) -> float | None:
    """Mean whole-host CPU % over the samples inside the given spans (None: not measured)."""
    if "host" not in experiment.sample_devices():
        return None
    frame = experiment.device_columns("host", ["host_cpu_util"])
    if "host_cpu_util" not in frame:
        return None
    t, cpu = np.asarray(frame["t"], dtype="float64"), np.asarray(frame["host_cpu_util"], dtype="float64")
    inside = np.zeros(len(t), dtype=bool)
    for start, end in zip(starts, ends):
        inside |= (t >= start) & (t <= end + experiment.meta.sampling_interval_s)
    values = cpu[inside & np.isfinite(cpu)]
    return float(values.mean()) if len(values) else None


def throughput_flat(experiment):
    rows = _requests(experiment).get("per_batch") or []
    if len(rows) < 2:
        return None
    small, large = rows[0], rows[-1]
    if large["batch"] < FLAT_BATCH_RATIO * small["batch"] or not small.get("samples_per_s"):
        return None
    gain = (large.get("samples_per_s") or 0.0) / small["samples_per_s"]
    if gain >= FLAT_GAIN:
        return None
    evidence = (f"batch {_req(large['batch'], 'count')} gives {_req(large['samples_per_s'], 'samples/s')} against "
                f"{_req(small['samples_per_s'], 'samples/s')} at batch {_req(small['batch'], 'count')} "
                f"({_req(gain, 'ratio')} for {_req(large['batch'] / small['batch'], 'ratio')} the batch), while latency p50 "
                f"went from {_req(small['latency_p50_s'], 'time')} to {_req(large['latency_p50_s'], 'time')}")
    saturated = ("the GPU is saturated (compute-bound)" if gpu_measured(experiment.meta) else
                 f"the model is saturated (compute-bound; no GPU was read in this run (source {experiment.meta.source or 'host'}))")
    step = (f"{saturated}: a bigger batch only adds latency; serve the smallest batch that "
            "reaches this throughput, and for more speed lower the precision (bf16/fp16, quantisation) or compile "
            "the model (torch.compile)")
    return Finding("throughput-flat", "Throughput flat as the batch grows: compute-bound", "medium", evidence, step,
                    {"gain": gain, "batch_ratio": large["batch"] / small["batch"]})


SERVING_CHECKS = [serving_host_bound, serving_warm_up, latency_stall, throughput_flat]

__all__ = ["SERVING_CHECKS", "latency_stall", "serving_host_bound", "serving_warm_up", "throughput_flat"]
