"""The one small interface every source implements.

Runs in any process (core).

A source lists its devices once (``open``) and declares its native interval
(``interval_s``: how often its values can change: NVML's fast lane is the session's interval,
host slow metrics 1 s, a Prometheus server its scrape interval). Then either

* it is *polled* (``read``): one reading of now per sampler tick, for each device key
  metric name -> value in the contract's unit (NaN or absent means "not measured"; never a
  0 that looks real); or
* it is *batched* (``read_batch``): the readings that became available since the last call,
  each with the time it describes (a Prometheus range query, the simulated GPU driven by
  the kernel's step events, torch memory statistics sent from the kernel). A batched source
  records its own gaps against its own interval (``take_gaps``): gaps are recorded where
  they happen, never inferred afterwards (docs/architecture.md).

Provenance and notes say which API made each metric and which metrics were dropped and why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol

from gpuprof_jupyter.core.protocol import Gap, Reading, Tick  # noqa: F401  (what sources produce)


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


class Source(Protocol):
    """What the sampler needs from a source. Sources never import IPython or Bokeh."""

    name: str  # "nvml", "host", "sim:input-bound", "torch"
    simulated: bool
    interval_s: float | None  # native interval; None: the session's sampling interval

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
    # Batched sources have ``read_batch(final=False) -> list[Tick]`` (oldest first, only what
    # is new; ``final``: the run ends, include a last partial interval) and
    # ``take_gaps() -> list[Gap]`` (``Gap.source`` set, judged by ``protocol.is_gap``) instead
    # of a meaningful ``read``.


def merged_provenance(sources) -> dict[str, dict[str, str]]:
    """Device -> metric -> provenance tag, over every source (later sources add their tags)."""
    provenance: dict[str, dict[str, str]] = {}
    for source in sources:
        for device, tags in source.provenance().items():
            provenance.setdefault(device, {}).update(tags)
    return provenance


def close_all(sources) -> None:
    """Close every source; one that fails to close does not keep the others open."""
    for source in sources:
        try:
            source.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass


def is_batched(source) -> bool:
    return callable(getattr(source, "read_batch", None))


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
