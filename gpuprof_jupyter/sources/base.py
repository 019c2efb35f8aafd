"""The one small interface every source implements.

A source lists its devices once (``open``), then gives one reading per sampler tick
(``read``): for each device key, metric name -> value in the contract's unit (NaN or
absent means "not measured"; never a 0 that looks real). Provenance and notes say
which API made each metric and which metrics were dropped and why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol


@dataclass
class DeviceInfo:
    """One device a source reads. ``key`` is the column value in samples ("gpu0", "host")."""

    key: str
    kind: str  # "gpu" or "host"
    name: str
    index: int | None = None  # index among the visible devices (CUDA_VISIBLE_DEVICES order)
    uuid: str | None = None
    simulated: bool = False
    power_limit_w: float | None = None
    memory_total_bytes: float | None = None
    mig_parent_uuid: str | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "DeviceInfo":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


Reading = dict[str, dict[str, float]]  # device key -> metric -> value


class Source(Protocol):
    """What the sampler needs from a source. Sources never import IPython or Bokeh."""

    name: str  # "nvml", "host", "sim:input-bound", "torch"
    simulated: bool

    def open(self) -> list[DeviceInfo]:
        """Find devices; raise SourceUnavailable when the source cannot run at all."""

    def read(self) -> Reading:
        """One non-blocking reading of every device. May raise; the sampler contains it."""

    def provenance(self) -> dict[str, dict[str, str]]:
        """device key -> metric -> provenance tag (see metrics.PROVENANCE)."""

    def notes(self) -> list[str]:
        """Human-readable notes: dropped metrics, lost devices, fallbacks."""

    def context(self) -> dict:
        """Versions and facts for the experiment metadata (driver, CUDA, ...)."""

    def close(self) -> None: ...

    # Optional: ``final_context() -> dict``, facts known only at the end of a run (other
    # processes on the GPUs, torch memory peaks), merged into the experiment's context.


class SourceUnavailable(RuntimeError):
    """The source cannot run here (no NVML library, no GPU): one clear message."""


class NoteBook:
    """Collects notes once each, in order (a metric dropped is said once, not per tick)."""

    def __init__(self) -> None:
        self._notes: list[str] = []
        self._seen: set[str] = set()

    def add(self, note: str) -> None:
        if note not in self._seen:
            self._seen.add(note)
            self._notes.append(note)

    def __iter__(self):
        return iter(list(self._notes))

    def list(self) -> list[str]:
        return list(self._notes)
