"""A run's figures as typed values (core/figure.py): which provenance a summary or comparison
figure of one run has, so every view labels it the same way.

Runs in any process (core).

The rule, by what made the figure:

* a GPU metric (``sm_util_mean``, ``power_mean_w``, ``energy_kwh``, ``cost``...): simulated on
  a simulated run, else measured by the API its provenance names (NVML, GPM, DCGM);
* a host metric (``cpu_util_mean``): measured by psutil over the kernel's process tree;
* steps (throughput, step time, data wait): measured by the step hooks; serving figures by the
  request hook; the run's duration by the clock;
* tensor memory: measured by what counted it (``summary["memory"]["basis"]``: the allocator or
  tensor sizes); a GPU's memory total on a simulated run is simulated;
* a missing value: unknown, whatever made it.
"""

from __future__ import annotations

from gpuprof_jupyter.core.analysis.provenance import base_metric
from gpuprof_jupyter.core.analysis.rule_units import quantity
from gpuprof_jupyter.core.analysis.windows import metric_tags
from gpuprof_jupyter.core.figure import Figure, cost, measured, simulated
from gpuprof_jupyter.core.metrics import METRICS, describe_provenance

STEP_HOOKS = "the step hooks (optimizer steps and loader waits)"
REQUEST_HOOK = "the request hook (one entry per served call)"
CLOCK = "the run's clock"

# Figures made of a GPU metric whose name does not start with it.
_GPU_DERIVED = {"energy_kwh", "cost", "energy_per_sample_j", "gpu_count", "gpu_mem_peak_bytes",
                "device_total_bytes", "headroom_frac", "outside_torch_bytes"}
_STEP_FIGURES = {"samples_per_s", "step_time_p50_s", "step_time_p95_s", "data_wait_frac", "steps", "batches",
                 "step_peak_p50_bytes", "step_peak_max_bytes"}
_TENSOR_MEMORY = {"memory_peak_bytes", "peak_bytes", "breakdown"}


def _gpu_basis(meta, metric: str | None) -> str:
    tags = metric_tags(meta, metric) if metric else []
    return "; ".join(f"{describe_provenance(t)}" for t in tags) or f"the GPU's {metric or 'readings'}"


def provenance_of(meta, key: str, memory: dict | None = None) -> tuple[str, str]:
    """(kind, basis) of the figure ``key`` of the run described by ``meta``."""
    if key in _TENSOR_MEMORY:
        return "measured", (memory or {}).get("basis") or "tensor sizes"
    if key in _STEP_FIGURES:
        if key.startswith("step_peak") and getattr(meta, "simulated", False):
            return "measured", "torch.cuda.max_memory_allocated (per step)"
        return "measured", STEP_HOOKS
    if key.startswith(("latency_", "ttft_", "requests_", "request_", "tokens_")) or key in ("busy_frac", "requests"):
        return "measured", REQUEST_HOOK
    if key == "requested_bytes":
        return "measured", "torch's out-of-memory message"
    if key in ("duration_s", "total_s"):
        return "measured", CLOCK
    metric = base_metric(key)
    scope = METRICS[metric].scope if metric in METRICS else None
    if scope == "host":
        tags = metric_tags(meta, metric)
        return "measured", "; ".join(describe_provenance(t) for t in tags) or "psutil (the kernel's process tree)"
    if scope == "gpu" or key in _GPU_DERIVED:
        if getattr(meta, "simulated", False):
            return "simulated", f"the simulated GPU ({meta.source})"
        return "measured", _gpu_basis(meta, metric)
    return "measured", "logged by the user" if key else CLOCK


def run_figure(meta, key: str, value, unit: str, *, memory: dict | None = None, currency: str = "$") -> Figure:
    """The figure ``key`` of one run, with ``value`` in ``unit`` and its provenance (unknown when missing)."""
    kind, basis = provenance_of(meta, key, memory)
    if unit == "cost":
        return cost(value, currency, kind, basis)
    return Figure(value, unit, kind, basis) if kind != "measured" else measured(value, unit, basis)


def step_figure(value, unit: str) -> Figure:
    """A figure of the run's steps (a count, a time, a share of waiting)."""
    return measured(value, unit, STEP_HOOKS)


def simulated_or_measured(meta, value, unit: str, basis: str) -> Figure:
    """A GPU figure of ``meta``'s run: simulated on a simulated run, else measured by ``basis``."""
    if getattr(meta, "simulated", False):
        return simulated(value, unit, f"the simulated GPU ({meta.source})")
    return measured(value, unit, basis)


_QUANTITY_UNITS = {"time": "time", "bytes": "B", "percent": "%", "share": "share"}


def metric_unit(metric: str) -> str:
    """The figure unit of a rule's metric (core/figure.py): a time, bytes, a percentage, a share,
    power, energy or a rate by its name; a logged metric's own unit, which the profiler cannot know."""
    unit = _QUANTITY_UNITS.get(quantity(metric) if metric else None)
    if unit is None:
        unit = ("W" if metric.endswith("_w") else "kWh" if metric.endswith("_kwh")
                else "/s" if metric.endswith("_per_s") else "logged")
    return unit


def metric_figure(tags, value, unit: str, *, simulated_run: bool = False, digits: int | None = None) -> Figure:
    """A figure of a metric measured by the APIs ``tags`` name (its provenance tags): simulated
    when a tag is, or when ``simulated_run`` says the figure rests on the simulated device."""
    if simulated_run or any(str(t).startswith("simulated") for t in tags):
        return Figure(value, unit, "simulated", "the simulated GPU", digits=digits)
    basis = "; ".join(describe_provenance(t) for t in tags) or "the run's summary"
    return Figure(value, unit, "measured", basis, digits=digits)


__all__ = ["metric_figure", "metric_unit", "provenance_of", "run_figure", "step_figure", "simulated_or_measured", "STEP_HOOKS", "REQUEST_HOOK"]
