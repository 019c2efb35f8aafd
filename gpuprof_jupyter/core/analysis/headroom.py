"""Headroom and the largest batch that fits: memory = fixed + per-sample x batch.

Runs in any process (core).

``largest_batch(experiments, margin)`` fits a line through each run's peak tensor memory
(``summary["memory"]["peak_bytes"]``, ``core/analysis/memory.py``) against its batch size,
from runs (or ``--tune`` trials) of the same cell at two or more batch sizes, and gives the
largest batch whose predicted peak stays under the device's total memory less ``margin``.
One run with a breakdown is enough for an estimate (its activations grow with the batch,
its parameters, gradients and optimizer state do not), said in the warnings. The answer
carries its basis and a warning when the points are few or not on a line (docs/memory.md).
Runs that differ in what their peak counts (the CUDA allocator, CPU tensor sizes), in their
precision (autocast dtype) or in their model are refused: one line through them is no line.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from gpuprof_jupyter.core.analysis.run_batch import run_batch
from gpuprof_jupyter.core.analysis.summary import summary_of
from gpuprof_jupyter.core.format import fmt_bytes, fmt_frac, fmt_unit

DEFAULT_MARGIN = 0.10  # share of the device's memory the largest batch leaves free
NONLINEAR_SHARE = 0.05  # a point further than this share of its peak from the line: not linear
FIXED_CATEGORIES = ("parameters", "gradients", "optimizer_state")  # do not grow with the batch


@dataclass
class LargestBatch:
    """``batch``: the answer (None when memory does not grow with the batch in these runs; 0
    when not even one sample fits). Bytes throughout."""

    batch: int | None
    fixed_bytes: float
    per_sample_bytes: float
    device_bytes: float
    margin: float
    basis: str
    points: list = field(default_factory=list)  # [(batch, peak bytes, run name)]
    warnings: list = field(default_factory=list)
    simulated: bool = False

    def predicted_bytes(self, batch: float) -> float:
        return self.fixed_bytes + self.per_sample_bytes * batch

    def accumulation_for(self, effective_batch: int) -> tuple[int, int] | None:
        """(micro-batch, accumulation steps) that keep ``effective_batch`` within what fits, or
        None when nothing fits: the fewest steps whose micro-batch fits."""
        if not self.batch:
            return None
        steps = max(1, math.ceil(effective_batch / self.batch))
        return math.ceil(effective_batch / steps), steps

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        answer = ("no limit from memory in these runs" if self.batch is None
                  else f"largest batch that fits: {self.batch}")
        text = (f"{answer} (memory = {fmt_bytes(self.fixed_bytes)} + {fmt_bytes(self.per_sample_bytes)} x batch; "
                f"device {fmt_bytes(self.device_bytes)} less a {fmt_unit(100 * self.margin, '%')} margin)"
                + (" [SIMULATED]" if self.simulated else ""))
        lines = [text, f"basis: {self.basis}"] + [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def run_memory(experiment) -> dict:
    return summary_of(experiment).get("memory") or {}


def _device_bytes(experiments) -> float | None:
    totals = [run_memory(e).get("device_total_bytes") for e in experiments]
    totals = [t for t in totals if _finite(t)]
    return float(min(totals)) if totals else None


def largest_batch(experiments, margin: float = DEFAULT_MARGIN) -> LargestBatch:
    """The fit and its answer; ValueError (saying what is missing) when there is nothing to fit."""
    if not (_finite(margin) and 0 <= margin < 1):
        raise ValueError(f"margin is a share of the device's memory kept free, 0 <= margin < 1; got {margin!r}")
    experiments = list(experiments)
    if not experiments:
        raise ValueError("largest_batch needs at least one run (two or more batch sizes for a fit)")
    warnings, points, left_out = [], [], []
    for e in experiments:
        batch, peak = run_batch(e), run_memory(e).get("peak_bytes")
        if batch is None or not _finite(peak):
            left_out.append(f"{e.name} ({'no batch size' if batch is None else 'no memory peak'} recorded)")
        else:
            points.append((batch, float(peak), e.name))
    if left_out:
        warnings.append("left out: " + ", ".join(left_out))
    if not points:
        raise ValueError("none of these runs recorded both a batch size (steps with a sample count, or a "
                         "batch_size param) and a memory peak (docs/memory.md)")
    fitted = [e for e in experiments if e.name in {name for _, _, name in points}]
    _refuse_unlike(fitted)
    device = _device_bytes(experiments)
    if device is None:
        counted_cpu = any(run_memory(e).get("counts") == "cpu_tensors" for e in fitted)
        raise ValueError("these runs recorded no device memory total (NVML or a simulated GPU gives it)"
                         + ("; their peaks are CPU tensor sizes, which no GPU's total applies to" if counted_cpu else ""))
    simulated = any(e.meta.simulated for e in experiments)
    basis_of = run_memory(fitted[0]).get("basis", "peak tensor memory")
    if len(fitted) > 1:
        basis_of += f" (every run: {', '.join(e.name for e in fitted)})"
    sizes = sorted({b for b, _, _ in points})
    if len(sizes) >= 2:
        x = np.array([b for b, _, _ in points])
        y = np.array([p for _, p, _ in points])
        per_sample, fixed = (float(v) for v in np.polyfit(x, y, 1))
        listed = ", ".join(f"batch {b:g}: {fmt_bytes(p)}" for b, p, _ in sorted(points))
        basis = f"linear fit over {len(points)} runs at {len(sizes)} batch sizes ({listed}); peaks from {basis_of}"
        if len(sizes) == 2:
            warnings.append("only two batch sizes: the line goes through both, so whether memory is linear in "
                            "the batch is not checked; a run at a third size would check it")
        else:
            deviation = np.abs(y - (fixed + per_sample * x)) / np.maximum(y, 1.0)
            worst = int(np.argmax(deviation))
            if deviation[worst] > NONLINEAR_SHARE:
                warnings.append(f"memory is not linear in the batch: batch {x[worst]:g} is {fmt_frac(deviation[worst])} "
                                "off the line, so the answer is an estimate (allocator fragmentation, "
                                "size-dependent kernels' workspaces)")
    else:
        fixed, per_sample, basis = _from_breakdown(experiments, points, basis_of)
        warnings.append(f"too few points: every run is at batch {sizes[0]:g}; estimated from one run's breakdown "
                        "(activations grow with the batch; parameters, gradients and optimizer state do not). "
                        "Runs at two or more batch sizes give a fit")
    usable = device * (1.0 - margin)
    if per_sample <= 0:
        warnings.append("memory does not grow with the batch in these runs: memory sets no limit on it here")
        batch = None
    else:
        batch = max(0, math.floor((usable - fixed) / per_sample))
        if batch == 0:
            warnings.append(f"not even one sample fits: the fixed part alone is {fmt_bytes(fixed)} of "
                            f"{fmt_bytes(usable)} usable")
    return LargestBatch(batch, fixed, per_sample, device, margin, basis, sorted(points), warnings, simulated)


def _precision(params: dict) -> str | None:
    """The autocast dtype the run's forward pass used ("no autocast" when it trained without),
    as the hooks or --param recorded it; None when nothing says."""
    if params.get("amp.autocast") is True:
        return f"autocast {params.get('amp.dtype', 'on')}"
    if params.get("amp.autocast") is False:
        return "no autocast"
    return None


def _model(params: dict) -> str | None:
    """The trained model as recorded: its parameter count and dtype (None when not recorded)."""
    count = params.get("model.parameters")
    return None if count is None else f"{count} parameters" + (f" ({params['model.dtype']})" if params.get("model.dtype") else "")


_TRAITS = (("what the peak counts", lambda e: run_memory(e).get("basis")),
           ("precision", lambda e: _precision(e.meta.params)),
           ("model", lambda e: _model(e.meta.params)))


def _refuse_unlike(experiments) -> None:
    """ValueError when the runs differ in what their peak counts, their precision or their model:
    one line through them would mix memory models (an fp32 and a bf16 run's activations; an
    allocator's peak and tensor sizes). Unrecorded traits are not compared."""
    for what, trait in _TRAITS:
        values = {e.name: trait(e) for e in experiments}
        known = {v for v in values.values() if v is not None}
        if len(known) > 1:
            listed = "; ".join(f"{name}: {value or 'not recorded'}" for name, value in values.items())
            raise ValueError(f"largest_batch fits one line through runs of one kind, and these differ in {what} "
                             f"({listed}): give runs that differ only in the batch size")


def _from_breakdown(experiments, points, basis_of) -> tuple[float, float, str]:
    for e in experiments:
        memory = run_memory(e)
        breakdown, batch = memory.get("breakdown"), run_batch(e)
        if breakdown and batch and _finite(memory.get("peak_bytes")):
            fixed = float(sum(breakdown.get(c, 0.0) for c in FIXED_CATEGORIES))
            per_sample = (float(memory["peak_bytes"]) - fixed) / batch
            return fixed, per_sample, (f"one run ({e.name}, batch {batch:g}): fixed = parameters + gradients + "
                                       f"optimizer state ({fmt_bytes(fixed)}), the rest of its peak "
                                       f"({fmt_bytes(memory['peak_bytes'])}, {basis_of}) per sample")
    names = ", ".join(sorted({name for _, _, name in points}))
    raise ValueError(f"largest_batch needs runs at two or more batch sizes, or one run with a memory breakdown; "
                     f"{names} are all at batch {points[0][0]:g} and none has a breakdown")


__all__ = ["DEFAULT_MARGIN", "LargestBatch", "largest_batch", "run_memory"]
