"""The live view's changes, prepared here so that the kernel only forwards them.

Runs in the sampler process.

Once a second (main.py's live thread) ``LiveView.update`` turns the run's new rows (at most
LIVE_ROWS_PER_S per device, ``Run.live_batch``, ``live_buffer.py``) into a ``LiveUpdate``: the newest values per
device for the header, how many rows came, the new gaps and the alerts fired. Once the kernel
has put the plots on the page and named their data sources (``LiveTarget``), the update also
carries the PATCH-DOC texts for them: the new rows as one stream a second, the decimated
history at most once a minute, the phase and gap bands when they change. Rows that come
before the target are kept for it: the page's first stream has them. docs/live_view.md.
"""

from __future__ import annotations

import math
import threading
from collections import deque

from gpuprof_jupyter.core.plots.columns import LatestValues, LiveColumns, band_data
from gpuprof_jupyter.core.plots.patch_doc import replace_message, stream_message
from gpuprof_jupyter.core.plots.spec import PlotSpec
from gpuprof_jupyter.core.protocol import LIVE_ROWS_PER_S, LiveTarget, LiveUpdate, Malformed, Tick

STREAM_PERIOD_S = 1.0  # one stream a second: each is three comm messages the kernel sends (its CPU)
BANDS_PERIOD_S = 2.0
# The live loop's lateness: it waits for the fast lane's next tick after its second, and a loaded
# machine wakes it late. Without this slack, an update a little early after a late one found its
# stream not yet due, and the page got a stream every 2 s (0.6 a second measured, issue 40).
PERIOD_SLACK_S = 0.25
WAITING_ROWS = 20_000  # ticks kept for a live view that has not named its plots yet
_ROLES = ("recent", "history", "bands")


class LiveView:
    """One run's live view. ``update`` (the live thread) and ``attach`` (the request loop) may
    run at once: a lock keeps them apart. Preparing the plots' changes is an optional part
    (``guard``): its failure stops them with one note, the header's values and alerts go on."""

    def __init__(self, t0: float, interval: float, expect_target: bool, guard=None) -> None:
        self.t0 = t0
        self._guard = guard or (lambda part, fn: fn())  # guards.OptionalParts.call: a failure turns the plots off
        self.interval = interval
        self.latest = LatestValues()
        self.columns: LiveColumns | None = None
        self.target: LiveTarget | None = None
        self._waiting: deque | None = deque(maxlen=WAITING_ROWS) if expect_target else None
        self._slot = max(interval, 1.0 / LIVE_ROWS_PER_S)  # rows of different lanes in one slot: one row
        self._next_stream = self._next_bands = 0.0
        self._next_history = math.inf
        self._bands_key = None
        self._lock = threading.Lock()

    def attach(self, target: LiveTarget, now: float) -> None:
        """The kernel's plots are on the page: prepare their changes from now on."""
        if not isinstance(target.spec, PlotSpec) or not all(isinstance(target.sources.get(r), str) for r in _ROLES):
            raise Malformed("LiveTarget without a PlotSpec and the ids of its recent, history and bands sources")
        with self._lock:
            waiting, self._waiting = self._waiting or (), None
            self.columns = LiveColumns(target.spec, self.t0, self.interval, target.recent_rows)
            self.target = target
            for item in waiting:
                self._keep(item)
            self._next_history = now + target.history_refresh_s

    def update(self, rows: list, gaps: list, alerts: list, phases: list, now: float,
               final: bool = False) -> LiveUpdate | None:
        """The update for these new rows (``(mono, device, values)``), gaps and alerts; None when
        there is nothing to say. ``phases``: the kernel's, for the bands; ``final``: everything
        left, whatever the periods."""
        with self._lock:
            counts: dict[str, int] = {}
            newest: dict[str, float] = {}
            for tick in self._ticks(rows):
                for device, values in tick.reading.items():
                    self.latest.add(device, values, tick.mono - self.t0)
                    counts[device] = counts.get(device, 0) + 1
                    newest[device] = max(newest.get(device, -math.inf), tick.mono)
                self._keep(("tick", tick))
            for gap in gaps:
                self._keep(("gap", gap))
            patches = []
            if self.columns is not None:
                patches = self._guard("the live plots", lambda: self._patches(phases, now, final)) or []
            if not (counts or gaps or alerts or patches):
                return None
            return LiveUpdate(patches=patches, latest={d: self.latest.values[d] for d in counts}, rows=counts,
                              newest=newest, gaps=list(gaps), alerts=list(alerts))

    def slot_index(self, mono: float) -> int:
        """The plot's row for a reading at ``mono``: rows of different lanes (the host, a batched
        GPU source) within one slot are one row (``live_buffer.LiveBuffer`` sends whole slots)."""
        return round((mono - self.t0) / self._slot)

    def _ticks(self, rows: list) -> list[Tick]:
        slots: dict[int, dict] = {}
        for mono, device, values in rows:
            slots.setdefault(self.slot_index(mono), {}).setdefault(device, {}).update(values)
        return [Tick(self.t0 + k * self._slot, 0.0, reading) for k, reading in sorted(slots.items())]

    def _keep(self, item: tuple) -> None:
        kind, value = item
        if self.columns is not None:
            self.columns.push(value) if kind == "tick" else self.columns.add_gaps([value])
        elif self._waiting is not None:
            self._waiting.append(item)

    def _patches(self, phases: list, now: float, final: bool) -> list[tuple[str, str]]:
        columns, target = self.columns, self.target
        out = []
        if final or now >= self._next_stream:
            self._next_stream = now + STREAM_PERIOD_S - PERIOD_SLACK_S
            batch = columns.drain()
            if batch is not None:
                out.append(stream_message(target.sources["recent"], batch.data, columns.recent_rows))
        if now >= self._next_history:
            self._next_history = now + target.history_refresh_s
            out.append(replace_message(target.sources["history"], columns.history_data()))
        if final or now >= self._next_bands:
            self._next_bands = now + BANDS_PERIOD_S - PERIOD_SLACK_S
            now_s = now - self.t0
            key = (tuple((p["name"], p["start_s"], p["end_s"]) for p in phases), tuple(columns.gaps),
                   any(p["end_s"] is None for p in phases) and int(now_s // 10))  # an open phase grows
            if key != self._bands_key:
                self._bands_key = key
                out.append(replace_message(target.sources["bands"], band_data(phases, columns.gaps, now_s)))
        return out


__all__ = ["LiveView"]
