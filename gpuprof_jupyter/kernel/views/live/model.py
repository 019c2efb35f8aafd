"""The dashboard's data model in plain Python: which plots and columns, batching, gaps, history.

Runs in the kernel; the Jupyter server and the ``gpuprof`` command render it too.

No Bokeh here, so it is tested without a browser. The live dashboard and the static
rendering both build their figures from a ``PlotSpec`` and fill wide column tables whose
names come from ``column_name(metric, device)``: one table holds every series, so a batch of
samples is one document update whatever the number of GPUs.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from gpuprof_jupyter.core.analysis.decimate import MinMaxHistory
from gpuprof_jupyter.core.analysis.stats import gap_spans
from gpuprof_jupyter.core.format import fmt_gap, fmt_seconds
from gpuprof_jupyter.core.metrics import METRICS, PROCESS_SHARE_METRICS, describe_provenance

GIB = 1024.0**3
RECENT_ROWS = 1500  # rows kept at full rate in the browser (rollover)
HISTORY_BUCKETS = 1500  # -> at most 3000 decimated rows: under 5,000 points per series in all
FRAME_WIDTH = 720  # px of each plot's frame (views.live.figures)
FRAME_HEIGHT = 130
SHARE_HOLD_S = 2.5  # own/other shares come once a second: the header keeps them this long
_SHARES = frozenset(PROCESS_SHARE_METRICS)


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
        power.limit_lines = [(w, f"power limit {w:.0f} W") for w in limits]
        panels.append(power)
        mem = Panel("mem", f"GPU memory{sim}", "memory (GiB)", zero_based=True)
        mem.series += gpu_series("gpu_mem_used_bytes", scale=1 / GIB, digits=2)
        mem.series += gpu_series("torch_mem_allocated_bytes", "dashed", 1 / GIB, " torch alloc", 2)
        panels.append(mem)
    if host and "cpu_util" in present:
        cpu = Panel("cpu", "Host CPU (kernel process tree)", "CPU (% of allowed CPUs)", y_range=(0, 105))
        cpu.series.append(Series(column_name("cpu_util", host[0]["key"]), "cpu_util", host[0]["key"], "cpu_util", 0))
        panels.append(cpu)
    panels = [p for p in panels if p.series]
    names = ", ".join(f"{d['key']}: {d['name']}" for d in gpus) or "no GPU"
    return PlotSpec(panels, bool(meta.simulated), f"{meta.name} ({names})" + (" SIMULATED" if meta.simulated else ""))


@dataclass(frozen=True)
class _GapMark:
    start: float  # seconds since the session start
    end: float


@dataclass
class Batch:
    """Rows to stream: ``{"t": [...], column: [...]}`` (NaN rows mark gaps)."""

    data: dict[str, list]
    rows: int


def _round(values: np.ndarray, digits: int) -> list:
    out = np.round(values, digits)
    return out.tolist()


class DashboardModel:
    """Turns sampler ticks into column batches, recent + decimated history, and header facts.

    ``push(tick)`` and ``add_gaps`` are called in the link's thread (append only); everything
    else runs in the UI thread.
    """

    def __init__(self, spec: PlotSpec, t0: float, interval: float, recent_rows: int = RECENT_ROWS,
                 history_buckets: int = HISTORY_BUCKETS) -> None:
        self.spec = spec
        self.t0 = t0
        self.recent_rows = recent_rows
        self.series = spec.series()
        self.pending: deque = deque()
        self.history = MinMaxHistory(len(self.series), history_buckets, width_s=max(interval, 0.05))
        self.gaps: list[tuple[float, float]] = []
        self.latest: dict[str, dict[str, float]] = {}
        self.rows_streamed = 0
        self._share_t: dict[str, float] = {}  # device -> time of its last own/other share reading
        # per device: (metric, column index, scale) of its series; columns grouped by digits
        self._by_device: dict[str, list[tuple[str, int, float]]] = {}
        for j, s in enumerate(self.series):
            self._by_device.setdefault(s.device, []).append((s.metric, j, s.scale))
        self._digit_groups = [(d, [j for j, s in enumerate(self.series) if s.digits == d])
                              for d in sorted({s.digits for s in self.series})]

    def push(self, tick) -> None:
        """The link's thread: hand over only."""
        self.pending.append(tick)

    def add_gaps(self, gaps) -> None:
        """Gaps the sampler process recorded (``[start_s, end_s(, source)]``): the one definition
        (docs/architecture.md); the view never infers one from the spacing of rows."""
        self.pending.extend(_GapMark(start, end) for start, end in gap_spans(gaps))

    def drain(self) -> Batch | None:
        """New rows since the last call as one batch (a NaN row at each recorded gap), or None."""
        pending = self.pending
        items = [pending.popleft() for _ in range(len(pending))]  # the link's thread only appends
        if not items:
            return None
        ncols = len(self.series)
        rows: list[tuple[float, bool, dict]] = []  # (t, real, reading)
        for item in items:
            if isinstance(item, _GapMark):
                self.gaps.append((item.start, item.end))
                self.history.mark_gap(item.start)
                rows.append(((item.start + item.end) / 2, False, {}))
            else:
                rows.append((item.mono - self.t0, True, item.reading))
        rows.sort(key=lambda row: row[0])  # a gap is reported with the rows after it
        Y = np.full((len(rows), ncols), math.nan)
        by_device = self._by_device
        for i, (t, real, reading) in enumerate(rows):
            row = Y[i]
            for device, values in reading.items():
                self.latest[device] = self._with_recent_shares(device, values, t)
                for metric, j, scale in by_device.get(device, ()):
                    value = values.get(metric)
                    if value is not None:
                        row[j] = float(value) * scale
        n = len(rows)
        T = np.asarray([row[0] for row in rows])
        real = np.asarray([row[1] for row in rows])
        keep = real & (~np.isnan(Y).all(axis=1) | (ncols == 0))
        self.history.add(T[keep], Y[keep])
        data = {"t": _round(T, 3)}
        columns: list = [None] * ncols
        for digits, idx in self._digit_groups:  # one round and one tolist per group of columns
            for j, values in zip(idx, np.round(Y[:, idx], digits).T.tolist()):
                columns[j] = values
        for s, values in zip(self.series, columns):
            data[s.column] = values
        self.rows_streamed += n
        return Batch(data, n)

    def _with_recent_shares(self, device: str, values: dict, t: float) -> dict:
        """``values``, plus the device's last own/other shares while they are recent (they come
        from a 1 s source, so most ticks lack them; the header must not flicker)."""
        if not _SHARES.isdisjoint(values):
            self._share_t[device] = t
            return values
        if t - self._share_t.get(device, -math.inf) > SHARE_HOLD_S:
            return values  # most rows: no share seen lately
        previous = self.latest.get(device)
        if not previous:
            return values
        kept = {m: previous[m] for m in PROCESS_SHARE_METRICS if m in previous}
        return {**values, **kept} if kept else values

    def history_data(self) -> dict[str, list]:
        """The decimated history (everything so far) as columns, float32-rounded lists."""
        T, Y = self.history.points()
        data = {"t": _round(T, 3)}
        for j, s in enumerate(self.series):
            data[s.column] = _round(Y[:, j], s.digits) if len(T) else []
        return data

    def points_per_series(self, history_rows: int) -> int:
        """Points one series has in the browser: recent window (rollover) + history."""
        return min(self.rows_streamed, self.recent_rows) + history_rows


def band_data(phases, gaps, now_s: float | None) -> dict[str, list]:
    """Labelled bands: phases (open ones end at ``now_s``) and recorded gaps (grey; either
    stored shape, :func:`analysis.stats.gap_spans`)."""
    palette = ["#8dd3c7", "#fdb462", "#bebada", "#fb8072", "#80b1d3", "#b3de69", "#fccde5"]
    left, right, names, colours, labels = [], [], [], [], []
    names_seen: dict[str, int] = {}
    for p in phases:
        start = p["start_s"] if isinstance(p, dict) else p.start_s
        end = p["end_s"] if isinstance(p, dict) else p.end_s
        name = p["name"] if isinstance(p, dict) else p.name
        if end is None:
            end = now_s if now_s is not None else start
        k = names_seen.setdefault(name, len(names_seen))
        left.append(float(start)); right.append(float(end)); names.append(name)
        colours.append(palette[k % len(palette)]); labels.append(name)
    for start, end in gap_spans(gaps):
        left.append(float(start)); right.append(float(end))
        names.append(fmt_gap(start, end, at=False)); colours.append("#9e9e9e")
        labels.append(names[-1] if end - start >= 2.0 else "")  # short gaps: band only, no clutter
    return {"left": left, "right": right, "name": names, "colour": colours, "label": labels}


def current_values_text(spec: PlotSpec, latest: dict) -> list[str]:
    """Per device: 'gpu0 SM 93 % · BW 51 % · 385 W · 14.5 GiB'."""
    parts = []
    by_device: dict[str, list[str]] = {}
    short = {"sm_util": "SM", "mem_bw_util": "BW", "power_w": "", "gpu_mem_used_bytes": "", "cpu_util": "CPU"}
    for s in spec.series():
        if s.metric not in short:
            continue
        value = latest.get(s.device, {}).get(s.metric)
        if value is None or value != value:
            text = "n/a"
        elif s.metric == "power_w":
            text = f"{value:.0f} W"
        elif s.metric == "gpu_mem_used_bytes":
            text = f"{value / GIB:.1f} GiB"
        else:
            text = f"{short[s.metric]} {value:.0f} %"
        by_device.setdefault(s.device, []).append(text)
    for device, values in latest.items():
        share = share_text(values)
        if share:
            by_device.setdefault(device, []).append(share)
    for device, items in by_device.items():
        parts.append(f"{device} " + " · ".join(items))
    return parts


def share_text(values: dict) -> str:
    """This kernel's share of one GPU against other processes: 'yours SM 60 % / others 25 %,
    mem 3.0 / 5.0 GiB'; '' when not measured (no attribution source, MIG, or not matched)."""
    def known(metric):
        v = values.get(metric)
        return v if v is not None and v == v else None

    own_sm, other_sm = known("own_sm_util"), known("other_sm_util")
    own_mem, other_mem = known("own_gpu_mem_bytes"), known("other_gpu_mem_bytes")
    items = []
    if own_sm is not None and other_sm is not None:
        items.append(f"SM {own_sm:.0f} % / others {other_sm:.0f} %")
    if own_mem is not None and other_mem is not None:
        items.append(f"mem {own_mem / GIB:.1f} / {other_mem / GIB:.1f} GiB")
    return ("yours " + ", ".join(items)) if items else ""


def rank_step_times(children, now_s: float, window_s: float = 10.0) -> str:
    """``step time per rank (last 10 s): 0 238 ms · 1 239 ms`` for a run whose child processes
    report steps (``runtime.children``); "" with fewer than two."""
    times = []
    for child in list(children.children):
        facts = step_facts(child.activity.steps, now_s, window_s)
        if facts and facts.get("steps_per_s"):
            times.append(f"{child.rank} {fmt_seconds(1 / facts['steps_per_s'])}")
    return f"step time per rank (last {window_s:g} s): " + " · ".join(times) if len(times) > 1 else ""


def step_facts(steps, now_s: float, window_s: float = 10.0) -> dict | None:
    """Throughput and data-wait share over the last ``window_s`` of reported steps."""
    cutoff = now_s - window_s
    recent = []
    for s in itertools.islice(reversed(steps), 2000):  # newest first; never copies the whole list
        if s.t_end_s < cutoff:
            break  # steps are recorded in the order they end
        recent.append(s)
    if not recent:
        return None
    span = sum(s.duration_s for s in recent)
    wait = sum(s.wait_s for s in recent)
    samples = [s.n_samples for s in recent if s.n_samples == s.n_samples]
    out = {"steps_per_s": len(recent) / span if span > 0 else None,
           "data_wait_frac": wait / span if span > 0 else None, "count": len(steps)}
    if samples and span > 0:
        out["samples_per_s"] = sum(samples) / span
    return out


__all__ = ["PlotSpec", "Panel", "Series", "plot_spec", "DashboardModel", "column_name", "band_data",
           "current_values_text", "share_text", "rank_step_times", "step_facts", "METRICS"]
