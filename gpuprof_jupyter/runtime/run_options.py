"""A run's options, declared once and checked once: the record every front end builds.

Runs in any process that holds a run: the kernel, a script under ``gpuprof run``, or the ``gpuprof`` command.

The flags and keywords are declared in the table of options (``runtime/option_table.py``:
its ``record`` options are this record's fields). The magic (``notebook/cell_options.py``),
``gpuprof run`` and ``gpuprof check`` (``cli.py``), ``profile()`` (``runtime/profile.py``) and
``tune()`` (``notebook/tune_view.py``) build a ``RunOptions``; ``ProfileSession`` takes it and
sends it whole to the sampler process (``core/protocol.Begin.options``). A bad value raises
ValueError naming it, before anything starts; each front end only turns that into its own
error (UsageError, ``gpuprof: error:``, the caller's ValueError).

``RunOptions(...)`` checks and normalises what it is given (``"0,1"`` devices, ``"K=V"``
params, rule texts, a ``--trace`` text, a store path) and can be checked again: ``replace()``
of a record is a record. ``RunOptions.resolve(...)`` is what a run uses: the caller's values,
then the config file's and the environment's (``core/config.py``), then the defaults.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from gpuprof_jupyter.core.config import DEFAULT_INTERVAL_S, load_config
from gpuprof_jupyter.core.sources.spec import validate_source_spec
from gpuprof_jupyter.core.store.directory import Store
from gpuprof_jupyter.runtime.record.settings import parse_params
from gpuprof_jupyter.runtime.hooks.trace_window import TraceSpec, parse_trace
from gpuprof_jupyter.runtime.record.values import jsonable
from gpuprof_jupyter.core.format import fmt_unit

MIN_INTERVAL_S, MAX_INTERVAL_S = 0.001, 3600.0


@dataclass(frozen=True)
class RunOptions:
    """What one run records and how. Constructing it checks every field (ValueError names the
    bad one); the fields then hold the checked values:

    * ``name``: the experiment's name (None: ``run-N``); never blank;
    * ``interval``: seconds between samples, in 0.001..3600;
    * ``devices``: visible GPU indices (``"0,1"`` or a list), distinct and >= 0; None: all;
    * ``source``: ``nvml``, ``host``, ``sim[:SCENARIO[:NGPUS]]`` or ``prometheus=URL [match=SEL]``
      (``match``, the magic's ``--match``, folds into it); None: nvml if a GPU is visible, else host;
    * ``store``: a ``Store`` (a path or None becomes one);
    * ``params``: recorded settings (a dict, or ``KEY=VALUE`` texts), JSON-friendly values;
    * ``checks``: rules judged at the end; ``alerts``: rules watched while the run goes (parsed);
    * ``trace``: the torch.profiler window (``steps=A:B`` / ``seconds=S:T`` / ``on-alert[=N]``, which
      needs ``alerts``; or a TraceSpec);
    * ``memory_history``: torch's allocator history recorded, its snapshot saved when a step's
      headroom falls under 5 % and on out-of-memory;
    * ``stuck_after``: the least seconds without a step that count as stuck (None: 30; 0 or
      ``off``: no watch); a process is stuck after ten times its median step, at least that
      (``core/analysis/stuck.py``, docs/flight-recorder.md).
    """

    name: str | None = None
    interval: float = DEFAULT_INTERVAL_S
    devices: list[int] | None = None
    source: str | None = None
    store: Store | None = None
    params: dict[str, Any] = field(default_factory=dict)
    checks: list = field(default_factory=list)
    alerts: list = field(default_factory=list)
    trace: TraceSpec | None = None
    memory_history: bool = False  # record torch's allocator history; on out-of-memory, save its snapshot
    stuck_after: float | str | None = None  # --stuck-after: seconds, or "off" (0); None: the default (30 s)
    match: dataclasses.InitVar[str | None] = None

    def __post_init__(self, match: str | None) -> None:
        from gpuprof_jupyter.core.analysis.live_alerts import parse_alerts
        from gpuprof_jupyter.core.analysis.rules import parse_rules
        from gpuprof_jupyter.core.analysis.stuck import parse_stuck_after

        if self.name is not None and not self.name.strip():
            raise ValueError("--name must not be empty")
        interval = self.interval
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) \
                or not MIN_INTERVAL_S <= interval <= MAX_INTERVAL_S:
            raise ValueError(f"--interval must be between {MIN_INTERVAL_S:g} and {fmt_unit(MAX_INTERVAL_S, 's')}, got {interval!r}")
        if not isinstance(self.memory_history, bool):
            raise ValueError(f"memory_history is True or False, got {self.memory_history!r}")
        store = self.store if isinstance(self.store, Store) else Store(self.store)
        params = parse_params(list(self.params)) if isinstance(self.params, (list, tuple)) else dict(self.params)
        checked = {
            "interval": float(interval),
            "devices": _devices(self.devices),
            "source": validate_source_spec(_with_match(self.source, match)),
            "store": store,
            "params": {key: jsonable(value) for key, value in params.items()},  # numpy 64 -> 64
            "checks": parse_rules(list(self.checks)),
            "alerts": parse_alerts(list(self.alerts)),
            "trace": parse_trace(self.trace) if isinstance(self.trace, str) else self.trace,
            "stuck_after": parse_stuck_after(self.stuck_after),
        }
        if checked["trace"] is not None and checked["trace"].kind == "on-alert" and not checked["alerts"]:
            raise ValueError("--trace on-alert traces the steps after an --alert rule fires: give at least one "
                             "--alert RULE (e.g. --alert \"sm_util < 50 for >30% within step\")")
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @classmethod
    def resolve(cls, name: str | None = None, *, interval: float | None = None, source: str | None = None,
                checks=(), alerts=(), **given) -> "RunOptions":
        """The options a run uses: the caller's, then the config file's and the environment's
        (``core/config.load_config``: its checks and alerts come first), then the defaults.
        ValueError for a bad value or a malformed config file."""
        config = load_config()
        return cls(name, interval=(config.interval or DEFAULT_INTERVAL_S) if interval is None else interval,
                   source=config.source if source is None else source,
                   checks=(*config.checks, *(checks or ())), alerts=(*config.alerts, *(alerts or ())), **given)

    def replace(self, **changes) -> "RunOptions":
        """A copy with ``changes``, checked again (a trial's own name and params)."""
        return dataclasses.replace(self, **changes)


#: The options a caller may give (``profile()``'s keywords among them).
FIELDS = tuple(f.name for f in dataclasses.fields(RunOptions)) + ("match",)


def _devices(devices) -> list[int] | None:
    """``"0,1"`` or ``[0, 1]`` -> [0, 1]; None or ``""``: every visible device."""
    if devices is None or devices == "":
        return None
    if isinstance(devices, str):
        try:
            devices = [int(part) for part in devices.split(",") if part.strip()]
        except ValueError:
            raise ValueError(f"--devices takes visible GPU indices like 0,1; got {devices!r}") from None
    devices = list(devices)
    if not devices or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in devices) \
            or len(set(devices)) != len(devices):
        raise ValueError(f"--devices takes distinct indices >= 0 like 0,1; got {devices!r}")
    return devices


def _with_match(source: str | None, match: str | None) -> str | None:
    """``--match`` folds into a Prometheus spec (``prometheus=URL match=SELECTOR``, the form
    core/sources/prometheus.py parses), so one string carries the choice to the sampler."""
    if match is None:
        return source
    if not (source or "").startswith("prometheus="):
        raise ValueError("--match needs --source prometheus=http://HOST:9090")
    return f"{source} match={match}"


__all__ = ["FIELDS", "RunOptions"]
