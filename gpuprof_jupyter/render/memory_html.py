"""Where each run's memory went: a stacked bar per run (HTML) and its plain-text twin.

Runs in the kernel, the Jupyter server and the ``gpuprof`` command.

Drawn from ``summary["memory"]`` (``core/analysis/memory.py``, docs/memory.md): one bar per
run, the categories of its peak side by side on a scale shared by every bar, so two runs read
against each other; plain HTML and CSS, so it shows in nbconvert pages, offline reports and
viewers without JavaScript. Built through render/html.py (names escaped); simulated runs say so on their bar.
"""

from __future__ import annotations

from gpuprof_jupyter.core.analysis.memory import CATEGORIES
from gpuprof_jupyter.core.analysis.oom import MEMORY_VIEWER
from gpuprof_jupyter.core.analysis.summary import summary_of
from gpuprof_jupyter.core.analysis.run_figures import run_figure
from gpuprof_jupyter.core.figure import measured, unknown
from gpuprof_jupyter.core.format import MISSING, fmt_figure, fmt_figures, fmt_unit
from gpuprof_jupyter.render.html import Markup, bullet_list, coloured, html, join

COLOURS = {"parameters": "#1f77b4", "gradients": "#ff7f0e", "optimizer_state": "#2ca02c",
           "activations": "#d62728", "other": "#9e9e9e"}
BAR_PX = 420


def _memory(experiment) -> dict:
    return summary_of(experiment).get("memory") or {}


def _figure(meta, memory: dict):
    """A function (key, value, unit) -> a typed memory figure of ``meta``'s run (core/figure.py)."""
    return lambda key, value, unit="B": run_figure(meta, key, value, unit, memory=memory)


def memory_facts(meta, memory: dict) -> list[str]:
    """The run's memory figures in words (peak, headroom, per-step peaks, out of memory, outside PyTorch)."""
    fig = _figure(meta, memory)
    facts = []
    if "peak_bytes" in memory:
        text = f"peak {fmt_figure(fig('peak_bytes', memory['peak_bytes']))}"
        if "device_total_bytes" in memory:
            text += (f" of {fmt_figure(fig('device_total_bytes', memory['device_total_bytes']))} "
                     f"(headroom {fmt_figure(fig('headroom_frac', memory.get('headroom_frac'), 'share'))})")
        facts.append(f"{text}; from {memory.get('basis', MISSING)}")
    if "step_peak_max_bytes" in memory:
        facts.append("step peak p50 / max " + fmt_figures([fig("step_peak_p50_bytes", memory["step_peak_p50_bytes"]),
                                                            fig("step_peak_max_bytes", memory["step_peak_max_bytes"])]))
    oom = memory.get("oom")
    if oom:  # the whole explanation is printed before the traceback (render/oom_text.py)
        text = "out of memory" + (f" at step {oom['step']}" if oom.get("step") else "")
        if "requested_bytes" in oom:
            text += f" (requested {fmt_figure(fig('requested_bytes', oom['requested_bytes']))})"
        facts.append(text + (f"; first: {oom['next_steps'][0]}" if oom.get("next_steps") else ""))
    for low in memory.get("low_headroom") or ():
        facts.append(low_headroom_text(low))
    if "outside_torch_bytes" in memory:
        facts.append(f"outside PyTorch {fmt_figure(fig('outside_torch_bytes', memory['outside_torch_bytes']))} "
                     "(NVML's memory of this kernel minus torch's reserved: CUDA context, NCCL, cuBLAS workspaces)")
    return facts


LOW_HEADROOM_BASIS = "torch.cuda.mem_get_info and the allocator's statistics at a step's end"


def low_headroom_text(low: dict) -> str:
    """'headroom fell to 3 % (under 5 %) on GPU 0 at step 12 (rank 1): allocator history saved: PATH ...'."""
    rank = f" (rank {low['rank']})" if low.get("rank") is not None else ""
    threshold = low.get("threshold")
    under = f" (under {fmt_unit(100 * threshold, '%')})" if isinstance(threshold, (int, float)) else ""
    text = (f"headroom fell to {fmt_figure(measured(low.get('headroom_frac'), 'share', LOW_HEADROOM_BASIS))}{under} "
            f"on GPU {low.get('device')} at step {low.get('step')}{rank}: ")
    if low.get("snapshot"):
        return text + f"allocator history saved: {low['snapshot']} (open it in {MEMORY_VIEWER})"
    return text + f"allocator history not saved: {low.get('why', 'no reason given')}"


def _bar(name: str, meta, memory: dict, scale: float) -> Markup:
    breakdown = memory.get("breakdown") or {}
    fig = _figure(meta, memory)
    segments = []
    for category in CATEGORIES:
        value = float(breakdown.get(category, 0.0))
        if value > 0:
            segments.append(html("<span class='gpuprof-mem-{}' title='{}: {}' style='display:inline-block;height:14px;"
                                 "width:{}px;background:{}'></span>", category, category, fmt_figure(fig("breakdown", value)),
                                 f"{max(1.0, BAR_PX * value / scale):.1f}", COLOURS[category]))
    return html("<div class='gpuprof-mem-bar' style='margin:2px 0;white-space:nowrap'>"
                "<span style='display:inline-block;width:160px;overflow:hidden;vertical-align:middle'>{}{}</span>"
                "<span style='display:inline-block;vertical-align:middle'>{}</span> {}</div>",
                name, " [simulated]" if meta.simulated else "", join(segments),
                coloured(fmt_figure(fig("peak_bytes", memory.get("peak_bytes"))), "muted"))


def _category(fig, memory: dict, category: str):
    """One category of the breakdown as a figure. "other" is the peak less what was counted: where
    the peak is itself the counted sum (tensor sizes, no allocator) nothing measures it: unknown."""
    if category == "other" and str(memory.get("basis", "")).startswith("tensor sizes"):
        return unknown("B", "not measured: the peak is the tensors counted")
    return fig("breakdown", (memory.get("breakdown") or {}).get(category))


def memory_bars_html(experiments) -> Markup:
    """The stacked bars of the runs that have a breakdown, one scale for all (empty when none has)."""
    runs = [(e, _memory(e)) for e in experiments]
    runs = [(e, m) for e, m in runs if m.get("breakdown")]
    if not runs:
        return Markup("")
    scale = max(sum(m["breakdown"].values()) for _, m in runs) or 1.0
    legend = join(html("<span style='margin-right:10px'><span style='display:inline-block;width:10px;height:10px;"
                       "background:{}'></span> {}</span>", COLOURS[c], c) for c in CATEGORIES)
    bars = join(_bar(e.name, e.meta, m, scale) for e, m in runs)
    return html("<div class='gpuprof-memory' style='margin:4px 0'><b>where the memory went</b> "
                "(one sampled step; docs/memory.md)<div style='font-size:11px'>{}</div>{}</div>", legend, bars)


def memory_html(experiment) -> Markup:
    """One run's memory: its figures and its bar (empty when the run recorded none)."""
    memory = _memory(experiment)
    if not memory:
        return Markup("")
    return html("{}{}", bullet_list(memory_facts(experiment.meta, memory), cls="gpuprof-memory-facts", title="memory"),
                memory_bars_html([experiment]))


def memory_text(experiment) -> list[str]:
    """One run's memory in plain text lines ([] when it recorded none)."""
    memory = _memory(experiment)
    if not memory:
        return []
    lines = [f"memory: {fact}" for fact in memory_facts(experiment.meta, memory)]
    breakdown = memory.get("breakdown")
    if breakdown:
        fig = _figure(experiment.meta, memory)
        lines.append("memory breakdown: " + ", ".join(f"{c} {fmt_figure(_category(fig, memory, c))}"
                                                      for c in CATEGORIES))
    return lines


def memory_bars_text(experiments) -> list[str]:
    return [f"{e.name}: {line}" for e in experiments for line in memory_text(e) if line.startswith("memory breakdown")]


__all__ = ["low_headroom_text", "memory_bars_html", "memory_bars_text", "memory_facts", "memory_html", "memory_text"]
