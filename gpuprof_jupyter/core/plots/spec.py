"""Which panels and columns an experiment's plots have (``plot_spec``), and their colours.

Runs in both processes, and in the Jupyter server and the ``gpuprof`` command.

The live view and the static rendering both build their figures from a ``PlotSpec`` and fill
wide column tables whose names come from ``column_name(metric, device)``: one table holds
every series, so a batch of samples is one document update whatever the number of GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuprof_jupyter.core.format import GIB, fmt_watts
from gpuprof_jupyter.core.metrics import describe_provenance

FRAME_WIDTH = 720  # px of each plot's frame (render/figures.py)
FRAME_HEIGHT = 130


# Bokeh's Category10_10 and Category20_20 (bokeh.palettes), here so the PNG and the cached
# templates need no Bokeh import
_PALETTE_10 = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
               "#17becf")
_PALETTE_20 = ("#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a", "#d62728", "#ff9896", "#9467bd",
               "#c5b0d5", "#8c564b", "#c49c94", "#e377c2", "#f7b6d2", "#7f7f7f", "#c7c7c7", "#bcbd22", "#dbdb8d",
               "#17becf", "#9edae5")


def device_colour(index: int, count: int) -> str:
    """One colour per GPU, the same in the live plots, the static plots and the PNG."""
    palette = _PALETTE_10 if count <= 10 else _PALETTE_20
    return palette[index % len(palette)]


def column_name(metric: str, device: str) -> str:
    return f"{metric}__{device}"


@dataclass
class Series:
    column: str
    metric: str
    device: str
    label: str  # legend text
    colour_index: int  # index of the device among GPUs (host: 0)
    dash: str = "solid"
    scale: float = 1.0  # value shown = stored value * scale (bytes -> GiB)
    digits: int = 1


@dataclass
class Panel:
    key: str
    title: str
    y_label: str
    series: list[Series] = field(default_factory=list)
    y_range: tuple[float, float] | None = None
    limit_lines: list[tuple[float, str]] = field(default_factory=list)  # (y, label)
    zero_based: bool = False  # y axis starts at 0 (power, memory)


@dataclass
class PlotSpec:
    panels: list[Panel]
    simulated: bool
    title: str

    @property
    def columns(self) -> list[str]:
        return [s.column for p in self.panels for s in p.series]

    def series(self) -> list[Series]:
        return [s for p in self.panels for s in p.series]


def _provenance_words(meta, metric: str) -> str:
    tags = {meta.provenance.get(d["key"], {}).get(metric) for d in meta.devices}
    tags.discard(None)
    if not tags:
        return ""
    return "; ".join(sorted(describe_provenance(t) for t in tags))


def _axis_label(meta, metric: str, fallback: str) -> str:
    tags = {meta.provenance.get(d["key"], {}).get(metric) for d in meta.devices} - {None}
    if "nvml.utilization.gpu" in tags and metric == "sm_util":
        return "kernel-active time (%)"
    if "nvml.utilization.memory" in tags and metric == "mem_bw_util":
        return "memory-active time (%)"
    if tags == {"simulated"}:
        return f"{fallback} (simulated)"
    return fallback


def plot_spec(meta, metrics: list[str] | None = None) -> PlotSpec:
    """The panels for an experiment's metadata (devices, provenance) and present metrics."""
    present = set(metrics if metrics is not None else meta.units)
    gpus = meta.gpu_devices
    host = [d for d in meta.devices if d.get("kind") == "host"]
    sim = " [simulated]" if meta.simulated else ""

    def gpu_series(metric, dash="solid", scale=1.0, suffix="", digits=1):
        if metric not in present:
            return []
        return [
            Series(column_name(metric, d["key"]), metric, d["key"], f"{d['key']}{suffix}", i, dash, scale, digits)
            for i, d in enumerate(gpus)
        ]

    panels: list[Panel] = []
    if gpus:
        sm = Panel("sm", f"SM activity{sim}", _axis_label(meta, "sm_util", "SM util (%)"), y_range=(0, 105))
        sm.series += gpu_series("sm_util")
        sm.series += gpu_series("sm_occupancy", "dashed", suffix=" occupancy")
        sm.series += gpu_series("tensor_util", "dotted", suffix=" tensor")
        words = _provenance_words(meta, "sm_util")
        if "kernel-active" in words:
            sm.title = f"SM: kernel-active time{sim}"
        panels.append(sm)
        bw = Panel("bw", f"Memory bandwidth{sim}", _axis_label(meta, "mem_bw_util", "mem BW util (%)"), y_range=(0, 105))
        bw.series += gpu_series("mem_bw_util")
        panels.append(bw)
        power = Panel("power", f"Power{sim}", "power (W)", zero_based=True)
        power.series += gpu_series("power_w")
        limits = sorted({float(d["power_limit_w"]) for d in gpus if d.get("power_limit_w")})
        power.limit_lines = [(w, f"power limit {fmt_watts(w)}") for w in limits]
        panels.append(power)
        mem = Panel("mem", f"GPU memory{sim}", "memory (GiB)", zero_based=True)
        mem.series += gpu_series("gpu_mem_used_bytes", scale=1 / GIB, digits=2)
        mem.series += gpu_series("torch_mem_allocated_bytes", "dashed", 1 / GIB, " torch alloc", 2)
        mem.series += gpu_series("step_peak_memory_bytes", "dotted", 1 / GIB, " step peak", 2)
        panels.append(mem)
    if host and "cpu_util" in present:
        cpu = Panel("cpu", "Host CPU (kernel process tree)", "CPU (% of allowed CPUs)", y_range=(0, 105))
        cpu.series.append(Series(column_name("cpu_util", host[0]["key"]), "cpu_util", host[0]["key"], "cpu_util", 0))
        panels.append(cpu)
    panels = [p for p in panels if p.series]
    names = ", ".join(f"{d['key']}: {d['name']}" for d in gpus) or "no GPU"
    return PlotSpec(panels, bool(meta.simulated), f"{meta.name} ({names})" + (" SIMULATED" if meta.simulated else ""))


__all__ = ["PlotSpec", "Panel", "Series", "plot_spec", "column_name", "device_colour", "GIB",
           "FRAME_WIDTH", "FRAME_HEIGHT"]
