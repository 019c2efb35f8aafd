"""The rows the lanes recorded, held until the live view may have them.

Runs in the sampler process.

Every tick the recorder takes is appended here (``ticks``); once a second the live update
drains them (``drain``: every sample goes to the alerts first) and ``ready_rows`` gives the
rows the view may plot now: at most LIVE_ROWS_PER_S per device and second, and only whole
slots of the plot every device of the run has reported past (a batched source lags the
sampling lane), so one slot gets all its devices at once, in order. A device silent for longer
than its sources could lag (``Lanes.silence_s``: a lost GPU, one that never reported) holds
nobody back.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Callable

from gpuprof_jupyter.core.protocol import LIVE_ROWS_PER_S, Tick

FIRST_LIVE_WAIT_S = 5.0  # the live view waits this long for a device's first rows (a batched source starts late)


class LiveBuffer:
    """``ticks`` as recorded; ``slot_index(mono)``: the live plot's slot of a time."""

    def __init__(self, slot_index: Callable[[float], int]) -> None:
        self.slot_index = slot_index
        self.ticks: deque[Tick] = deque(maxlen=100_000)
        self._held: list[Tick] = []  # rows waiting for every device to reach their time
        self._newest: dict[str, float] = {}
        self._unseen: set[str] = set()

    def expect(self, devices, since: float) -> None:
        """The run's devices: the view waits for each (for longer before its first row,
        FIRST_LIVE_WAIT_S), from ``since``."""
        self._newest = {device: since for device in devices}
        self._unseen = set(self._newest)

    def drain(self) -> list[Tick]:
        """The ticks recorded since the last call."""
        ticks = self.ticks
        return [ticks.popleft() for _ in range(len(ticks))]  # the lanes only append meanwhile

    def ready_rows(self, ticks: list[Tick], last_sent: dict, silence_s: float, final: bool = False) -> list[tuple]:
        """``(mono, device, values)`` of the slots every device reached (``final``: all that is
        left), at most LIVE_ROWS_PER_S per device and second after ``last_sent`` (updated)."""
        newest = self._newest
        for tick in ticks:
            for device in tick.reading:
                newest[device] = max(newest.get(device, -math.inf), tick.mono)
                self._unseen.discard(device)
        held = self._held
        held.extend(ticks)
        now = time.monotonic()
        waiting_for = [t for device, t in newest.items()
                       if now - t <= (max(silence_s, FIRST_LIVE_WAIT_S) if device in self._unseen else silence_s)]
        ready = math.inf if final else min(waiting_for, default=max(newest.values(), default=-math.inf))
        slot = self.slot_index  # whole slots only: a later row could still fall in the slot of ``ready``
        ready_slot = ready if math.isinf(ready) else slot(ready)
        ticks, self._held = [], []
        for tick in held:
            (ticks if slot(tick.mono) < ready_slot else self._held).append(tick)
        spacing = 1.0 / LIVE_ROWS_PER_S
        rows = []
        for tick in sorted(ticks, key=lambda tick: tick.mono):
            for device, values in tick.reading.items():
                if tick.mono - last_sent.get(device, -1e18) >= spacing * 0.999:
                    last_sent[device] = tick.mono
                    rows.append((tick.mono, device, values))
        return rows


__all__ = ["FIRST_LIVE_WAIT_S", "LiveBuffer"]
