"""An out-of-memory run's explanation in words (``summary["memory"]["oom"]``, core/analysis/oom.py).

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

Printed before the traceback: by a profiled cell (notebook/profiled_cell.py), by
``profile()`` as its block ends, and on stderr by ``gpuprof run`` (docs/memory.md, "Out of memory").
"""

from __future__ import annotations

import sys

from gpuprof_jupyter.core.analysis.oom import MEMORY_VIEWER, on_gpu as oom_on_gpu
from gpuprof_jupyter.core.figure import estimated, measured, simulated as simulated_figure
from gpuprof_jupyter.core.format import fmt_figure
from gpuprof_jupyter.render.memory_html import low_headroom_text

TORCH_MESSAGE = "torch's out-of-memory message"


def explain_oom(experiment, file=None) -> str | None:
    """Print the run's out-of-memory explanation (``file``: stderr) and return it; None (and
    nothing printed) when the run did not die of out-of-memory."""
    oom = ((experiment.meta.summary or {}).get("memory") or {}).get("oom")
    if not oom:
        return None
    text = oom_text(oom, simulated=bool(experiment.meta.simulated))
    print(text, file=file or sys.stderr, flush=True)
    return text


def oom_text(oom: dict, simulated: bool = False) -> str:
    """The explanation in words, for the cell's output (before the traceback) and stderr;
    ``simulated``: the run's GPU figures came from a simulated source, and it says so."""
    def device(value, by: str = TORCH_MESSAGE) -> str:
        """A figure of the device: simulated on a simulated run."""
        return fmt_figure(simulated_figure(value, "B") if simulated else measured(value, "B", by))

    def counted(value) -> str:
        return fmt_figure(measured(value, "B", "tensor sizes counted at the last step"))

    when = (f" at step {oom['step']}" if oom.get("step") else
            f" after {oom['optimizer_steps']} optimizer step(s)" if "optimizer_steps" in oom else "")
    lines = [f"gpuprof: out of {'GPU ' if oom_on_gpu(oom) else ''}memory" + when
             + (f" (batch {fmt_figure(measured(oom['batch'], 'count', 'the step hooks'))})" if oom.get("batch") else "")
             + (" [SIMULATED GPU: the device figures are simulated]" if simulated else "")]
    if "requested_bytes" in oom:
        text = f"  requested {fmt_figure(measured(oom['requested_bytes'], 'B', TORCH_MESSAGE))}"
        if "free_bytes" in oom:
            text += f" with {device(oom['free_bytes'])} free"
        if "device_total_bytes" in oom:
            text += f" of {device(oom['device_total_bytes'])}" + (f" on GPU {oom['device']}" if "device" in oom else "")
        lines.append(text)
    breakdown = oom.get("breakdown")
    if breakdown:
        parts = ", ".join(f"{k.replace('_', ' ')} {counted(v)}" for k, v in breakdown.items())
        lines.append(f"  at the last step: {parts}"
                     + (f"; its peak {counted(oom['last_step_peak_bytes'])}" if "last_step_peak_bytes" in oom else ""))
    elif "last_step_peak_bytes" in oom:
        lines.append(f"  the last step's peak: {counted(oom['last_step_peak_bytes'])}")
    for key, d in sorted((oom.get("other_processes") or {}).items()):
        n = d.get("processes", 0)
        used = d.get("used_memory_bytes")
        lines.append(f"  other processes on {key}: {n}" + (f", holding {device(used, 'NVML')}" if used else ""))
    fit = oom.get("largest_batch")
    if fit and fit.get("batch") is not None:
        basis = fit.get("basis") or "a fit over earlier runs of the cell"
        answer = estimated(fit["batch"], "count", basis + (" (simulated device)" if fit.get("simulated") else ""))
        lines.append(f"  largest batch that fits: {fmt_figure(answer)}")
        lines += [f"    warning: {w}" for w in fit.get("warnings") or ()]
    history = oom.get("memory_history")
    if history and history.get("snapshot"):
        lines.append(f"  allocator history saved: {history['snapshot']}; open it in PyTorch's memory viewer: "
                     f"drag the file onto {MEMORY_VIEWER}")
    elif history:
        lines.append(f"  allocator history not saved: {history.get('why', 'no reason given')}")
    if history and history.get("low_headroom"):  # saved earlier, when the headroom ran low
        lines.append(f"  earlier, {low_headroom_text(history['low_headroom'])}")
    lines.append("  next steps:")
    lines += [f"    {i}. {s}" for i, s in enumerate(oom.get("next_steps") or (), 1)]
    return "\n".join(lines)


__all__ = ["explain_oom", "oom_text"]
