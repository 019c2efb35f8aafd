"""The kernel's session, cell by cell: what each cell and each idle stretch between cells cost the GPUs.

Runs in any process (core): the sampler process feeds it; the kernel and the server read what it wrote.

The session record's readings (1 Hz by default: ``ticks``) and the kernel's cell marks
(``start``/``end``) come in separately and in any order within a tick: a tick's interval
``[previous, now]`` is shared among the stretches it overlaps, by overlap. A stretch is a cell
(from its start mark to its end mark) or an idle stretch (from a cell's end, or the record's
start, to the next cell's start). Per stretch:

* ``gpu_busy_s``: device-seconds with a kernel running (NVML ``utilization.gpu``, summed
  over the devices, times the time it covers); an interval longer than the gap rule's
  (``protocol.is_gap``) counts nothing and is reported as ``gap_s``, never filled;
* ``energy_j``: the sum of the devices' energy counter deltas (measured across a gap too);
* ``memory_held_bytes``: the memory held at the stretch's end (the first reading after it).

Each figure names where it came from (``provenance``): they are the session's cadence, not a
profiled cell's. The timeline's series are kept by ``MinMaxHistory`` (the live view's
bounded decimation), so a week-long kernel keeps a bounded record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuprof_jupyter.core.analysis.decimate import MinMaxHistory
from gpuprof_jupyter.core.protocol import is_gap

SERIES = ("gpu_busy", "memory_held_bytes", "power_w")  # per device, in the timeline
SERIES_BUCKETS = 1500  # at most 3000 rows in the timeline, whatever the session's length
SERIES_BATCH = 30  # readings handed to the decimation at once
MAX_ROWS = 20_000  # stretches kept (cells and idle stretches); older ones are counted, then dropped
# What the record costs, as %gpuprofile session off says it (benchmarks/bench_session.py measures it)
RECORD_COST = ("two small messages on the sampler process's socket per cell (no reply awaited, no kernel thread "
               "woken, no hook installed) and one NVML read of every GPU a second in the sampler process")
BUSY_THRESHOLD = 1.0  # % of utilization.gpu at or below which a device counts as idle


@dataclass
class Stretch:
    """A cell or an idle stretch, and what the GPUs did during it (see the module docstring)."""

    kind: str  # "cell" | "idle"
    start_mono: float
    start_wall: float
    end_mono: float | None = None
    cell: int | None = None
    source: str | None = None
    status: str | None = None
    experiment: str | None = None
    gpu_busy_s: float = 0.0
    energy_j: float | None = None
    memory_held_bytes: float | None = None
    covered_s: float = 0.0  # of its time, seen by a reading of utilization
    gap_s: float = 0.0  # of its time, in a gap (no reading: its busy time is not counted)

    @property
    def duration_s(self) -> float | None:
        return None if self.end_mono is None else self.end_mono - self.start_mono

    def row(self) -> dict:
        """The stretch as ``session()`` lists it; figures unseen by any reading are None."""
        return {"kind": self.kind, "cell": self.cell, "source": self.source, "started": self.start_wall,
                "duration_s": self.duration_s,
                "gpu_busy_s": self.gpu_busy_s if self.covered_s > 0 else None,
                "energy_j": self.energy_j,
                "memory_held_bytes": self.memory_held_bytes,
                "status": self.status, "experiment": self.experiment,
                "idle_s": self.duration_s if self.kind == "idle" else None,
                "gap_s": self.gap_s}


@dataclass
class Totals:
    """One reading of every device, summed: what a stretch adds up."""

    busy_frac: float | None  # sum over devices of utilization.gpu / 100
    energy_j: float | None  # sum of the devices' energy counters (J since the record opened)
    memory_held_bytes: float | None
    busy: bool  # any device above BUSY_THRESHOLD


def totals(reading: dict, memory_metric: str) -> Totals:
    """A reading (device -> metric -> value) summed over its devices. ``memory_metric``: the
    metric that says what this kernel holds (``own_gpu_mem_bytes`` where NVML's process lists
    attribute it, else the devices' ``gpu_mem_used_bytes``)."""
    busy = [v["gpu_busy"] for v in reading.values() if _num(v.get("gpu_busy"))]
    energy = [v["energy_j"] for v in reading.values() if _num(v.get("energy_j"))]
    memory = [v[memory_metric] for v in reading.values() if _num(v.get(memory_metric))]
    return Totals(sum(busy) / 100.0 if busy else None, sum(energy) if energy else None,
                  sum(memory) if memory else None, any(b > BUSY_THRESHOLD for b in busy))


def _num(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class SessionAccount:
    """Cells and idle stretches of one kernel's session, from its readings and cell marks.

    ``interval_s``: the session record's cadence (the gap rule's unit); ``provenance``: what
    the figures were measured with (filled by the sampler process when its sources open)."""

    interval_s: float
    started_mono: float
    started_wall: float
    provenance: dict = field(default_factory=dict)
    devices: list = field(default_factory=list)
    done: list = field(default_factory=list)  # finished Stretches, oldest first
    open: list = field(default_factory=list)  # stretches a reading has not passed the end of yet
    dropped: int = 0  # finished stretches dropped past MAX_ROWS
    last_mono: float | None = None
    last: Totals | None = None
    last_busy_mono: float | None = None  # the last reading with a device busy
    series: MinMaxHistory | None = None
    gaps: list = field(default_factory=list)  # [start_wall, end_wall] of the record's gaps
    no_readings: bool = False  # no GPU source: stretches carry times only
    _series_rows: list = field(default_factory=list)  # timeline rows not yet decimated (SERIES_BATCH)

    def __post_init__(self) -> None:
        if not self.open:
            self.open.append(Stretch("idle", self.started_mono, self.started_wall))

    # -- marks -------------------------------------------------------------------------------
    @property
    def current(self) -> Stretch:
        return self.open[-1]

    def cell_started(self, mono: float, wall: float, cell: int | None, source: str | None) -> None:
        """The kernel began a cell: the idle stretch (or an unfinished cell) ends here."""
        self._close_current(mono)
        self.open.append(Stretch("cell", mono, wall, cell=cell, source=source))

    def cell_ended(self, mono: float, wall: float, status: str | None, experiment: str | None) -> None:
        """The kernel finished a cell: an idle stretch begins. An end without its start (the
        record was turned on mid-cell) is a cell from the last stretch's start."""
        cell = self.current
        if cell.kind != "cell":
            cell.kind = "cell"
        cell.status, cell.experiment = status, experiment
        self._close_current(mono)
        self.open.append(Stretch("idle", mono, wall))

    def _close_current(self, mono: float) -> None:
        current = self.current
        current.end_mono = max(mono, current.start_mono)
        if current.kind == "cell" and current.status is None:
            current.status = "unfinished"  # a start without an end (a silent execution)
        self.finish_passed()

    # -- readings -------------------------------------------------------------------------------
    def tick(self, mono: float, wall: float, reading: dict, memory_metric: str = "gpu_mem_used_bytes") -> None:
        """A reading of every device at ``mono``: its interval since the last reading is shared
        among the stretches it overlaps; the stretches it passed the end of are finished."""
        now = totals(reading, memory_metric)
        previous, before = self.last_mono, self.last
        if now.memory_held_bytes is None and before is not None:  # a slower source (NVML's process lists,
            now.memory_held_bytes = before.memory_held_bytes  # 1 s) did not read this time: its last value
        if previous is not None and mono > previous:
            gap = is_gap(previous, mono, self.interval_s)
            if gap:
                self.gaps.append([wall - (mono - previous), wall])
                if self.series is not None:
                    self._flush_series()
                    self.series.mark_gap(wall - (mono - previous))
            energy = (now.energy_j - before.energy_j) if now.energy_j is not None and before.energy_j is not None else None
            for stretch in self.open:
                overlap = _overlap(previous, mono, stretch.start_mono, stretch.end_mono)
                if overlap <= 0:
                    continue
                share = overlap / (mono - previous)
                if gap:
                    stretch.gap_s += overlap
                elif now.busy_frac is not None:
                    stretch.gpu_busy_s += now.busy_frac * overlap
                    stretch.covered_s += overlap
                if energy is not None:
                    stretch.energy_j = (stretch.energy_j or 0.0) + energy * share
        if now.busy:
            self.last_busy_mono = mono
        self.last_mono, self.last = mono, now
        self._add_series(wall, reading, memory_metric)
        self.finish_passed()

    def _add_series(self, wall: float, reading: dict, memory_metric: str) -> None:
        keys = sorted(reading)
        if not keys:
            return
        if self.series is None or keys != self.devices:
            if self.series is None:
                self.devices = keys
                self.series = MinMaxHistory(len(keys) * len(SERIES), SERIES_BUCKETS, width_s=self.interval_s)
            else:
                return  # a device lost or gained: the timeline keeps the devices it began with
        row = [float(reading[d].get("gpu_busy", math.nan)) for d in keys]
        row += [float(reading[d].get(memory_metric, math.nan)) for d in keys]
        row += [float(reading[d].get("power_w", math.nan)) for d in keys]
        self._series_rows.append((wall, row))
        if len(self._series_rows) >= SERIES_BATCH:
            self._flush_series()

    def _flush_series(self) -> None:
        """Hand the rows waiting to the decimation in one batch (one row at a time costs ten times more)."""
        rows, self._series_rows = self._series_rows, []
        if rows and self.series is not None:
            self.series.add([t for t, _ in rows], [r for _, r in rows])

    def finish_passed(self) -> None:
        """Stretches whose end a reading has passed are finished, with that reading's memory;
        without GPU readings (``no_readings``) a stretch is finished at its end."""
        keep = []
        for stretch in self.open:
            passed = stretch.end_mono is not None and (
                self.no_readings or (self.last_mono is not None and self.last_mono >= stretch.end_mono))
            if not passed:
                keep.append(stretch)
                continue
            stretch.memory_held_bytes = self.last.memory_held_bytes if self.last is not None else None
            self.done.append(stretch)
        self.open = keep
        if len(self.done) > MAX_ROWS:
            cut = len(self.done) - MAX_ROWS
            self.dropped += cut
            del self.done[:cut]

    # -- what it says ----------------------------------------------------------------------------
    def rows(self) -> list[dict]:
        """Every stretch, oldest first; the open ones with what is known so far."""
        out = [s.row() for s in self.done]
        for stretch in self.open:
            row = stretch.row()
            if stretch.end_mono is None and self.last_mono is not None:
                row["duration_s"] = max(0.0, self.last_mono - stretch.start_mono)
                if stretch.kind == "idle":
                    row["idle_s"] = row["duration_s"]
                row["memory_held_bytes"] = self.last.memory_held_bytes if self.last else None
            out.append(row)
        return out

    def idle_held(self, now_mono: float) -> dict:
        """The GPU idle while this kernel holds its memory: seconds since the later of the last
        cell's end and the last busy reading (0 while a cell runs or nothing is held)."""
        current, last = self.current, self.last
        held = last.memory_held_bytes if last is not None else None
        if current.kind == "cell" or not held:
            return {"idle_s": 0.0, "memory_held_bytes": held, "since_wall": None}
        since = max(current.start_mono, self.last_busy_mono or -math.inf)
        idle = max(0.0, now_mono - since)
        return {"idle_s": idle, "memory_held_bytes": held, "since_wall": current.start_wall + (since - current.start_mono)}

    def timeline(self) -> dict:
        """The bounded series for the timeline: wall times and, per device, each of SERIES."""
        if self.series is None:
            return {"t": [], "devices": [], "columns": {}}
        self._flush_series()
        t, Y = self.series.points()
        n = len(self.devices)
        columns = {}
        for i, name in enumerate(SERIES):
            for j, device in enumerate(self.devices):
                columns[f"{device}.{name}"] = [None if math.isnan(v) else float(v) for v in Y[:, i * n + j]]
        return {"t": [float(x) for x in t], "devices": list(self.devices), "columns": columns}

    def to_dict(self, now_mono: float) -> dict:
        """What the record writes to disk and answers ``session()`` with (JSON-safe)."""
        return {"version": 1, "interval_s": self.interval_s, "started": self.started_wall,
                "provenance": dict(self.provenance), "devices": list(self.devices),
                "rows": self.rows(), "dropped_rows": self.dropped, "gaps": list(self.gaps),
                "idle_held": self.idle_held(now_mono), "timeline": self.timeline()}


def _overlap(a: float, b: float, start: float, end: float | None) -> float:
    """Seconds of ``[a, b]`` inside ``[start, end]`` (``end`` None: still open)."""
    hi = b if end is None else min(b, end)
    return max(0.0, hi - max(a, start))


__all__ = ["SessionAccount", "Stretch", "Totals", "totals", "SERIES", "MAX_ROWS"]
