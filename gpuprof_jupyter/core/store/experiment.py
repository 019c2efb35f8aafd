"""An experiment as plain data: metadata with a schema version, samples and steps tables.

Runs in any process (core).

``ExperimentMeta`` round-trips through JSON; fields added later are read with defaults so
old stores keep loading. Samples are long-format: one row per (tick, device), columns
``t`` (s since start, monotonic), ``wall_time`` (UNIX s), ``device`` ("gpu0", "host") and one
float column per metric in the contract's unit (NaN: not measured).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuprof_jupyter.core.config import DEFAULT_INTERVAL_S
from gpuprof_jupyter.core.protocol import conforms

if TYPE_CHECKING:  # pandas is imported lazily: `import gpuprof_jupyter` stays fast
    import pandas as pd

    from gpuprof_jupyter.core.store.columns import Columns

SCHEMA_VERSION = 1


class RunStatus(enum.StrEnum):
    """An experiment's status, as ``meta.json`` stores it (a member equals its string)."""

    RUNNING = "running"
    OK = "ok"
    ERROR = "error"  # the profiled code raised
    INTERRUPTED = "interrupted"  # KeyboardInterrupt, or the kernel closed the profiler during the run
    DIED = "died"  # the kernel was killed during the run and the sampler process saved what it had
    CRASHED = "crashed"  # still marked running, but its writer (the sampler process) is gone
    STUCK = "stuck"  # gpuprof run --on-stuck stop: a rank made no step for too long; its stacks saved, the job stopped

    @classmethod
    def of_parts(cls, statuses) -> "RunStatus":
        """A multi-node job's status from its parts': running while one runs, else the worst."""
        statuses = set(statuses)
        order = (cls.RUNNING, cls.ERROR, cls.DIED, cls.CRASHED, cls.INTERRUPTED)
        return next((s for s in order if s in statuses), cls.OK)


@dataclass
class ExperimentMeta:
    id: str
    name: str
    status: str = RunStatus.RUNNING
    started_at: str = ""  # ISO 8601, UTC
    ended_at: str | None = None
    duration_s: float | None = None
    interval_s: float = DEFAULT_INTERVAL_S
    source: str = "host"  # "nvml", "sim:input-bound", "host"
    simulated: bool = False
    devices: list[dict] = field(default_factory=list)
    provenance: dict[str, dict[str, str]] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    gaps: list[list] = field(default_factory=list)  # [start_s, end_s] or [start_s, end_s, source], since start
    phases: list[dict] = field(default_factory=list)  # {name, start_s, end_s}
    params: dict[str, Any] = field(default_factory=dict)
    captured: dict[str, Any] = field(default_factory=dict)
    user_metrics: dict[str, Any] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    checks: list[dict] = field(default_factory=list)  # rule results at stop (analysis.rules.RuleResult)
    alerts: list[dict] = field(default_factory=list)  # --alert firings while it ran (analysis.live_alerts.Alert)
    trace: dict[str, Any] = field(default_factory=dict)  # the --trace window ({} when none; runtime.hooks.trace_window)
    pid: int | None = None
    host: str | None = None
    schema_version: int = SCHEMA_VERSION

    @property
    def sampling_interval_s(self) -> float:
        """The interval the samples were taken at (``DEFAULT_INTERVAL_S`` where none was stored)."""
        return self.interval_s or DEFAULT_INTERVAL_S

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "ExperimentMeta":
        """The metadata a ``meta.json`` holds, checked field by field against the declared
        types (items of lists and mappings included) and the summary's sections: ValueError
        naming the first field that is wrong. Unknown keys are ignored; a ``null`` where the
        field takes none is its default (an older writer's)."""
        if not isinstance(data, dict) or "id" not in data or "name" not in data:
            raise ValueError("not an experiment metadata object (no id/name)")
        hints = _meta_hints()
        fields = {}
        for name, value in data.items():
            if name not in hints or (value is None and not conforms(None, hints[name])):
                continue
            if not conforms(value, hints[name], items=True):
                raise ValueError(f"field {name!r} holds {_kind(value)}, not {_type_text(hints[name])}")
            fields[name] = value
        if "id" not in fields or "name" not in fields:
            raise ValueError("not an experiment metadata object (no id/name)")
        if fields.get("schema_version", 1) > SCHEMA_VERSION:
            raise ValueError(
                f"written by a newer gpuprof_jupyter (schema {fields['schema_version']} > {SCHEMA_VERSION})"
            )
        if "summary" in fields:
            fields["summary"] = _checked_summary(fields["summary"])
        return cls(**fields)

    @property
    def gpu_devices(self) -> list[dict]:
        return [d for d in self.devices if d.get("kind") == "gpu"]


class Experiment:
    """A saved experiment. ``samples`` and ``steps`` load from the store on first use."""

    def __init__(self, meta: ExperimentMeta, loader=None, samples=None, steps=None, trace=None, requests=None) -> None:
        self.meta = meta
        self._loader = loader
        self._samples = samples
        self._steps = steps  # the public DataFrame: given, else made from the step columns
        self._requests = requests  # a DataFrame given in memory, else read on first use
        self._step_columns = None
        self._rank_columns = None
        self._ranks = None
        self._trace = trace
        self._device_rows: tuple | None = None  # (the samples frame, device -> its rows in it)

    @classmethod
    def of_rank_columns(cls, meta: ExperimentMeta, ranks: "dict[int, Columns]", samples=None) -> "Experiment":
        """An experiment held in memory whose steps are given split by rank (a multi-node job's,
        ``core/job.py``): each rank's ``Columns`` holding the same columns, a ``rank`` among them.
        Split once here, never again by masks over every row (512 ranks)."""
        import numpy as np

        from gpuprof_jupyter.core.store.columns import Columns

        experiment = cls(meta, samples=samples)
        names = set.intersection(*(set(c.columns) for c in ranks.values())) if ranks else set()
        order = [n for n in next(iter(ranks.values())).columns if n in names] if ranks else []
        experiment._step_columns = (Columns({n: np.concatenate([c[n] for c in ranks.values()]) for n in order})
                                    if ranks else _empty_steps())
        experiment._rank_columns = {rank: Columns({n: c[n] for n in order}) for rank, c in ranks.items()}
        return experiment

    @property
    def id(self) -> str:
        return self.meta.id

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def status(self) -> str:
        return self.meta.status

    @property
    def params(self) -> dict:
        return self.meta.params

    @property
    def samples(self) -> "pd.DataFrame":
        if self._samples is None:
            self._samples = self._loader.samples() if self._loader else _empty_samples()
        return self._samples

    # -- one device at a time: what analysis and views use (memory: one device's few columns)
    def sample_devices(self) -> list[str]:
        """Devices with at least one sample, in order of first appearance."""
        if self._samples is None and self._loader is not None:
            return self._loader.sample_devices()
        samples = self.samples
        return [d for d in samples["device"].unique() if isinstance(d, str)] if len(samples) else []

    def sample_columns(self, with_values: bool = False) -> list[str]:
        """Metric columns of the samples (``with_values``: only those holding at least one value)."""
        if self._samples is None and self._loader is not None:
            return self._loader.sample_columns(with_values)
        samples = self.samples
        return [c for c in samples.columns
                if c not in ("t", "wall_time", "device") and (not with_values or samples[c].notna().any())]

    def device_frame(self, device: str, columns: list[str] | None = None) -> "pd.DataFrame":
        """One device's samples in time order: ``t`` and those of ``columns`` that are stored
        (default: every metric; ``wall_time`` when asked for). Reads only that device's rows and those columns from the
        store; ``samples`` (every row of every device) is never loaded for it.
        """
        if self._samples is None and self._loader is not None:
            return self._loader.device_columns(device, columns).frame()
        samples = self.samples
        names = [c for c in (self.sample_columns() if columns is None else columns)
                 if c in samples.columns and c not in ("t", "device")]
        rows = self._rows_of(samples).get(device, [])
        frame = samples.iloc[rows, [samples.columns.get_loc(c) for c in ("t", *names)]]
        if len(frame) > 1 and not frame["t"].is_monotonic_increasing:
            frame = frame.sort_values("t", kind="stable")
        return frame.reset_index(drop=True)

    def _rows_of(self, samples: "pd.DataFrame") -> dict:
        """device -> the positions of its rows in ``samples`` (held in memory), found once per
        frame: a mask over every row for each column read was most of a report's time."""
        if self._device_rows is None or self._device_rows[0] is not samples:
            self._device_rows = (samples, samples.groupby("device", sort=False).indices if len(samples) else {})
        return self._device_rows[1]

    def device_columns(self, device: str, columns: list[str] | None = None) -> "Columns":
        """``device_frame`` as numpy columns (``columns.Columns``): what the summary reads, so
        that the sampler process never imports pandas."""
        from gpuprof_jupyter.core.store.columns import Columns

        if self._samples is None and self._loader is not None:
            return self._loader.device_columns(device, columns)
        return Columns.of_frame(self.device_frame(device, columns))

    @property
    def all_steps(self) -> "pd.DataFrame":
        """Every process's steps; a ``rank`` column when the run's child processes reported."""
        if self._steps is None:
            self._steps = self.all_step_columns().frame()
        return self._steps

    @property
    def steps(self) -> "pd.DataFrame":
        """The run's steps: its own process's, else its lowest rank's (``rank_steps`` has each)."""
        return _run_steps(self.all_steps, self.rank_steps)

    def rank_steps(self) -> "dict[int, pd.DataFrame]":
        """rank -> its steps (``OWN_RANK``: the run's own process); {} without a ``rank`` column."""
        if self._ranks is None:
            self._ranks = {rank: columns.frame() for rank, columns in self.rank_step_columns().items()}
        return self._ranks

    @property
    def requests(self) -> "pd.DataFrame":
        """The serving requests, one row each (``core/finish.py`` REQUEST_FIELDS: ``latency_s``,
        ``host_s``, ``batch``, ``tokens``, ``ttft_s``, ``gc_s``, ``wait_s``, ``cuda``, ``kind``);
        empty when none."""
        if self._requests is None:
            self._requests = self.request_columns().frame()
        return self._requests

    def request_columns(self) -> "Columns":
        """``requests`` as numpy columns."""
        from gpuprof_jupyter.core.store.columns import Columns

        if self._requests is not None:
            return Columns.of_frame(self._requests)
        return self._loader.request_columns() if self._loader else _empty_requests()

    # -- the steps as numpy columns (``columns.Columns``): what the summary reads, without pandas
    def all_step_columns(self) -> "Columns":
        if self._step_columns is None:
            from gpuprof_jupyter.core.store.columns import Columns

            if self._steps is not None:  # given in memory
                self._step_columns = Columns.of_frame(self._steps)
            else:
                self._step_columns = self._loader.step_columns() if self._loader else _empty_steps()
        return self._step_columns

    def step_columns(self) -> "Columns":
        """``steps`` as numpy columns."""
        return _run_steps(self.all_step_columns(), self.rank_step_columns)

    def rank_step_columns(self) -> "dict[int, Columns]":
        """``rank_steps`` as numpy columns (split once)."""
        if self._rank_columns is None:
            steps = self.all_step_columns()
            if "rank" not in steps:
                return {}
            import numpy as np

            ranks = steps["rank"]
            self._rank_columns = {int(rank): steps.rows(ranks == rank) for rank in np.unique(ranks)}
        return self._rank_columns

    @property
    def trace(self) -> dict | None:
        """torch.profiler's Chrome trace of the ``--trace`` window (``traceEvents``,
        ``baseTimeNanoseconds``...) as saved, capped; None when the experiment has none."""
        if self._trace is None and self.meta.trace.get("file") and self._loader is not None:
            self._trace = self._loader.trace()
        return self._trace

    def rank_traces(self) -> dict[int, dict]:
        """rank -> its saved ``--trace`` window (``gpuprof run --trace-ranks``), the lowest rank's
        being ``trace``; {} for a run traced in one process. Unreadable files are left out."""
        ranks = self.meta.trace.get("ranks") or {}
        out = {}
        for rank, info in sorted(ranks.items(), key=lambda item: int(item[0])):
            if not info.get("file"):
                continue
            trace = self.trace if info["file"] == self.meta.trace.get("file") else (
                self._loader.trace(info["file"]) if self._loader else None)
            if trace:
                out[int(rank)] = trace
        return out

    def capture_traces(self) -> list[tuple[dict, dict]]:
        """(record, trace) of each window ``--trace on-alert`` took (``meta.trace["captures"]``), in
        order, the first being ``trace``; [] for other runs. Unreadable files are left out."""
        out = []
        for info in self.meta.trace.get("captures") or []:
            if not info.get("file"):
                continue
            trace = self.trace if info["file"] == self.meta.trace.get("file") else (
                self._loader.trace(info["file"]) if self._loader else None)
            if trace:
                out.append((info, trace))
        return out

    @property
    def summary(self) -> dict:
        """Per-device and overall figures, as stored when the experiment was saved ({} if that
        failed). Computing one is analysis' job: ``analysis.summary.summary_of``."""
        return self.meta.summary

    def __repr__(self) -> str:
        return f"<Experiment {self.name!r} id={self.id} status={self.status}>"


# The summary's sections that readers take as mappings (listing rows, renderers, diagnosis);
# ``phases`` is a list of mappings (analysis/summary.py writes them all).
SUMMARY_MAPPINGS = ("overall", "steps", "host", "devices", "ranks", "metric_windows", "gaps", "trace", "memory")


def _checked_summary(summary: dict) -> dict:
    """``summary`` with its ``null`` sections dropped (absent); ValueError for a section of
    another type than the summary writes."""
    summary = {k: v for k, v in summary.items() if v is not None}
    for name in SUMMARY_MAPPINGS:
        if name in summary and not isinstance(summary[name], dict):
            raise ValueError(f"summary section {name!r} holds {_kind(summary[name])}, not a mapping")
    for name in ("devices", "ranks"):
        bad = [k for k, v in summary.get(name, {}).items() if not isinstance(v, dict)]
        if bad:
            raise ValueError(f"summary section {name!r}: {bad[0]!r} is not a mapping")
    if not conforms(summary.get("phases", []), list[dict], items=True):
        raise ValueError("summary section 'phases' is not a list of mappings")
    return summary


@functools.cache
def _meta_hints() -> dict:
    import typing

    return typing.get_type_hints(ExperimentMeta)


def _kind(value) -> str:
    """What a wrong value is, without echoing a neighbour's text at length."""
    return f"{type(value).__name__} {value!r}" if isinstance(value, (bool, int, float)) or value is None \
        else f"a {type(value).__name__}"


def _type_text(hint) -> str:
    return getattr(hint, "__name__", None) if not getattr(hint, "__args__", None) else str(hint).replace("typing.", "")


OWN_RANK = -1  # the ``rank`` of the run's own process's steps, beside its child processes' ranks


def primary_rank(steps) -> int:
    """The rank whose steps are the run's: its own process's when it reported, else the lowest."""
    ranks = steps["rank"]
    return OWN_RANK if (ranks == OWN_RANK).any() else int(ranks.min())


def _run_steps(steps, by_rank):
    """The run's own steps among ``steps`` (a DataFrame or Columns); ``by_rank()``: per rank."""
    if "rank" not in steps or not len(steps):
        return steps
    return by_rank()[primary_rank(steps)]


def _empty_samples() -> "pd.DataFrame":
    import pandas as pd

    return pd.DataFrame({"t": pd.Series(dtype="float64"), "wall_time": pd.Series(dtype="float64"),
                         "device": pd.Series(dtype="object")})


def _empty_requests() -> "Columns":
    import numpy as np

    from gpuprof_jupyter.core.store.columns import Columns

    return Columns({c: np.zeros(0) for c in ("t_start_s", "latency_s", "host_s", "batch", "tokens", "ttft_s", "gc_s",
                                             "wait_s")})


def _empty_steps() -> "Columns":
    import numpy as np

    from gpuprof_jupyter.core.store.columns import Columns

    return Columns({c: np.zeros(0) for c in ("t_end_s", "duration_s", "wait_s", "n_samples")})
