"""What a tuning run was asked for: trial length, budget, objective, opt-in knobs.

Runs in any process that holds a run: the kernel, or a script under ``gpuprof run``.

Parsed before anything runs, so a malformed ``--budget`` or ``--tune KEY=V1,V2`` stops the
cell with a clear message and nothing started.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuprof_jupyter.core.analysis.gain import BLOCKS, MIN_STEADY_STEPS, OBJECTIVES
from gpuprof_jupyter.runtime.record.settings import parse_value

DEFAULT_TRIAL_STEPS = 20
DEFAULT_BUDGET_S = 300.0
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?\s*$", re.IGNORECASE)
_UNIT_S = {None: 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class OptIn:
    """``train_config.batch_size=32,64``: a field of a captured object and the values to try."""

    variable: str  # the namespace variable (``train_config``)
    path: tuple[str, ...]  # attributes (or keys) below it (``("batch_size",)``)
    values: tuple

    @property
    def key(self) -> str:
        return ".".join((self.variable, *self.path))


@dataclass(frozen=True)
class TuneSpec:
    trial_steps: int = DEFAULT_TRIAL_STEPS
    budget_s: float = DEFAULT_BUDGET_S
    objective: str = "throughput"
    opt_ins: tuple[OptIn, ...] = field(default_factory=tuple)


def parse_budget(text: str | float | int | None) -> float:
    """``"5min"`` -> 300.0; ``"90s"``, ``"90"``, ``"1.5h"``; ValueError otherwise."""
    if text is None:
        return DEFAULT_BUDGET_S
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        match = _DURATION.match(text)
        if match is None:
            raise ValueError(f"--budget takes a duration like 5min, 90s or 1h; got {text!r}")
        seconds = float(match.group(1)) * _UNIT_S[(match.group(2) or "").lower() or None]
    if not seconds > 0:
        raise ValueError(f"--budget must be more than 0 s; got {text!r}")
    return seconds


def parse_opt_in(item: str) -> OptIn:
    """``train_config.amp=false,true`` -> OptIn; ValueError names what is wrong."""
    key, sep, values = item.partition("=")
    parts = key.strip().split(".")
    if not sep or len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise ValueError(f"--tune {item!r}: expected VARIABLE.FIELD=V1,V2 (a field of a captured config, "
                         "e.g. train_config.batch_size=32,64)")
    parsed = tuple(parse_value(v) for v in values.split(",") if v.strip())
    if len(parsed) < 1:
        raise ValueError(f"--tune {item!r}: give at least one value to try after '='")
    return OptIn(parts[0], tuple(parts[1:]), parsed)


def make_spec(tune: list[str] | None = None, trial_steps: int | None = None, budget=None,
              objective: str | None = None) -> TuneSpec:
    """The spec from the magic's (or ``tune()``'s) arguments; ValueError for a bad one."""
    steps = DEFAULT_TRIAL_STEPS if trial_steps is None else trial_steps
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < MIN_STEADY_STEPS:
        raise ValueError(f"--trial-steps must be an integer >= {MIN_STEADY_STEPS}: a trial's 95 % interval is taken "
                         f"over {BLOCKS} blocks of at least {MIN_STEADY_STEPS // BLOCKS} steady steps; got {steps!r}")
    objective = objective or "throughput"
    if objective not in OBJECTIVES:
        raise ValueError(f"--objective must be one of {', '.join(OBJECTIVES)}; got {objective!r}")
    opt_ins = tuple(parse_opt_in(item) for item in (tune or []) if item)
    keys = [o.key for o in opt_ins]
    if len(set(keys)) != len(keys):
        raise ValueError(f"--tune names a field twice: {', '.join(sorted({k for k in keys if keys.count(k) > 1}))}")
    return TuneSpec(steps, parse_budget(budget), objective, opt_ins)


__all__ = ["OBJECTIVES", "OptIn", "TuneSpec", "make_spec", "parse_budget", "parse_opt_in"]
