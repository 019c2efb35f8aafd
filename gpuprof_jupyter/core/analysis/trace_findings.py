"""Findings from a ``--trace`` window (analysis.trace_summary): tiny kernels, a host-bound GPU, one dominant operator, idle or exposed time.

Runs in any process (core).

Thresholds are module constants so tests and users can see them.
"""

from __future__ import annotations

from gpuprof_jupyter.core.analysis.breakdown_findings import waste_finding
from gpuprof_jupyter.core.analysis.finding import Finding
from gpuprof_jupyter.core.format import as_float
from gpuprof_jupyter.core.analysis.summary import summary_of
from gpuprof_jupyter.core.analysis.finding_text import traced_fig


# From a --trace window (analysis.trace_summary):
TRACE_TINY_KERNEL_US = 20.0  # median kernel shorter than this...
TRACE_TINY_KERNELS_PER_STEP = 100  # ...at least this many launches per step...
TRACE_GPU_IDLE_SHARE = 0.30  # ...and the GPU idle between kernels at least this share of the window
TRACE_HOST_BOUND_IDLE = 0.50  # GPU idle between (longer) kernels at least this share: host-bound
TRACE_DOMINANT_SHARE = 0.50  # one operator took at least this share of the traced window


def _trace(experiment) -> dict:
    return (summary_of(experiment).get("trace") or {}) if experiment.meta.trace else {}


def tiny_kernels(experiment) -> Finding | None:
    """Many short kernels with the GPU idle between them: launch overhead dominates."""
    t = _trace(experiment)
    idle, per_step, median = t.get("gpu_idle") or {}, as_float(t.get("kernels_per_step")), as_float(t.get("kernel_median_us"))
    share = as_float(idle.get("share"))
    if per_step is None or median is None or share is None:
        return None
    if per_step < TRACE_TINY_KERNELS_PER_STEP or median >= TRACE_TINY_KERNEL_US or share < TRACE_GPU_IDLE_SHARE:
        return None
    return Finding("trace-tiny-kernels", "Many tiny kernels: launch overhead", "high",
                   f"in the traced window ({t.get('spec')}) each step launched {traced_fig(per_step, 'count')} kernels, "
                   f"median {traced_fig(median / 1e6, 'time')} long, and the GPU sat idle between kernels "
                   f"{traced_fig(share, 'share')} of the window",
                   "capture the step in a CUDA graph (torch.compile(model, mode='reduce-overhead') or "
                   "torch.cuda.graphs) or fuse kernels with torch.compile; a larger batch makes each kernel longer",
                   {"kernels_per_step": per_step, "kernel_median_us": median, "gpu_idle_share": share})


def host_bound(experiment) -> Finding | None:
    """The GPU idle between kernels that are not tiny: the host does not launch work fast enough."""
    t = _trace(experiment)
    share = as_float((t.get("gpu_idle") or {}).get("share"))
    if share is None or share < TRACE_HOST_BOUND_IDLE or tiny_kernels(experiment) is not None:
        return None
    ops = t.get("operators") or []
    top = ", ".join(r["name"] for r in ops[:3]) or "no operator"
    return Finding("trace-host-bound", "Host-bound: the GPU waits for the CPU between kernels", "high",
                   f"in the traced window ({t.get('spec')}) the GPU ran no kernel {traced_fig(share, 'share')} of the time; the "
                   f"operators with most GPU time were {top}",
                   "open the merged trace (gpuprof trace NAME) and look at the CPU between kernels: .item()/.cpu() "
                   "syncs (aten::_local_scalar_dense), preprocessing inside the loop, Python overhead; move work "
                   "into DataLoader workers and torch.compile the model",
                   {"gpu_idle_share": share})


_OP_ADVICE = (
    (("addmm", "aten::mm", "bmm", "matmul", "linear", "conv", "gemm"),
     "the math itself: use mixed precision (torch.autocast) for tensor cores, channels_last for convolutions, "
     "and check the shapes are multiples of 8"),
    (("copy_", "aten::to", "_to_copy", "memcpy"),
     "data movement: pin_memory=True with .to(device, non_blocking=True), keep tensors on the GPU between steps"),
    (("_local_scalar_dense", "aten::item"),
     "a synchronisation (.item(), .cpu(), printing a tensor): read values every N steps, not every step"),
)


def dominant_operator(experiment) -> Finding | None:
    """One operator took most of the traced window."""
    t = _trace(experiment)
    ops = t.get("operators") or []
    share = as_float(ops[0].get("share")) if ops else None
    if share is None or share < TRACE_DOMINANT_SHARE:
        return None
    name = ops[0]["name"]
    advice = next((text for keys, text in _OP_ADVICE if any(k in name for k in keys)),
                  "find where it is called (record_function ranges in the merged trace) and whether it can run "
                  "less often, on smaller tensors or in a fused form (torch.compile)")
    basis = "GPU time of its kernels" if t.get("operator_time") == "cuda" else "CPU self time (CPU activities only)"
    return Finding("trace-dominant-op", f"One operator dominates: {name}", "medium",
                   f"{name} took {traced_fig(share, 'share')} of the traced window ({t.get('spec')}) by {basis}, "
                   f"{traced_fig(as_float(ops[0].get('calls_per_step')), 'count')} calls per step",
                   f"this is {advice}", {"operator": name, "share": share, "basis": t.get("operator_time")})


def window_waste(experiment) -> Finding | None:
    """Idle time or exposed communication dominating a traced window (analysis.breakdown_findings);
    the GPU's idle time only when ``host_bound`` has not said it."""
    return waste_finding(_trace(experiment), gpu_idle_said=host_bound(experiment) is not None)
