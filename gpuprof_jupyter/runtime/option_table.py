"""The table of options: each declared once (name, type, default, help), with the front ends it means something on.

Runs in any process that holds a run: the kernel, a script under ``gpuprof run``, or the ``gpuprof`` command.

Built from it: the magic's arguments (``notebook/magic.py``), the argparse of ``gpuprof run``,
``check`` and ``compare`` (and ``--store``/``--price-*`` of every ``gpuprof`` command,
``cli.py``), and the keywords of ``profile()`` (``runtime/profile.py``) and ``tune()``
(``notebook/tune_view.py``). A run's options (``record=True``) are ``RunOptions``' fields
(``runtime/run_options.py``), which checks their values; ``given()`` picks them out of parsed
arguments for it. tests/test_option_table.py walks the table against every parser and signature.

Adding an option (docs/development.md, "Adding an option"): one ``Option`` in ``OPTIONS`` with
the front ends it means something on; a run's option (``record=True``) is also a field of
``RunOptions`` with its check, and every front end that starts a run then takes it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from gpuprof_jupyter.core.config import DEFAULT_INTERVAL_S

# The front ends. A ``gpuprof`` subcommand is named by its own name.
MAGIC, RUN, CHECK, COMPARE, PROFILE, TUNE = "%%gpuprofile", "run", "check", "compare", "profile()", "tune()"
EVERY_COMMAND = frozenset({RUN, CHECK, COMPARE, "export", "report", "trace", "list"})
PARSED = (MAGIC, RUN, CHECK, COMPARE)  # the parsers whose every option (not positional) is the table's

_AS_DEFAULT = object()  # a keyword front end shows ``default``
VALUE, MANY, SWITCH = "value", "many", "switch"  # one value; repeatable (a list); present or not (True/False)


@dataclass(frozen=True)
class Option:
    """One option. ``default`` is what a front end holds when it is not given (None: the config,
    then RunOptions' default); ``keyword_default`` what ``tune()``'s signature shows, where it
    spells out the default the magic leaves to None."""

    name: str
    flags: tuple[str, ...]
    help: str
    fronts: frozenset[str]
    type: Callable | None = None  # argparse's type=; None: the text as given
    default: Any = None
    kind: str = VALUE
    metavar: str | None = None
    record: bool = False  # one of a run's options: a field of RunOptions
    bare: str | None = None  # a MANY option given without a value holds this (``--tune`` alone)
    choices: tuple[str, ...] | None = None  # the only values it takes (argparse's choices=)
    keyword_default: Any = _AS_DEFAULT

    @property
    def dest(self) -> str:
        """The attribute argparse names it by: the first long flag, with ``_`` for ``-``."""
        long = next((f for f in self.flags if f.startswith("--")), None)
        return long[2:].replace("-", "_") if long else self.name

    @property
    def api_default(self) -> Any:
        """The default a keyword front end shows."""
        return self.default if self.keyword_default is _AS_DEFAULT else self.keyword_default

    def argparse_kwargs(self) -> dict:
        """What ``add_argument`` (argparse's or IPython's ``@argument``) takes after the flags."""
        if self.kind == SWITCH:
            return {"action": "store_true", "help": self.help}
        kwargs: dict[str, Any] = {"help": self.help}
        if self.kind == MANY:
            kwargs.update(action="append", default=list(self.default))
            if self.bare is not None:
                kwargs.update(nargs="?", const=self.bare)
        else:
            kwargs["default"] = self.default
        if self.type is not None:
            kwargs["type"] = self.type
        if self.metavar is not None:
            kwargs["metavar"] = self.metavar
        if self.choices is not None:
            kwargs["choices"] = self.choices
        return kwargs


def _on(*fronts) -> frozenset[str]:
    out: set[str] = set()
    for front in fronts:
        out |= front if isinstance(front, frozenset) else {front}
    return frozenset(out)


_RUN_FRONTS = _on(MAGIC, RUN, PROFILE, TUNE)  # a run's options: every front end that starts a run

OPTIONS: tuple[Option, ...] = (
    # -- a run's options (RunOptions' fields, in its order) ------------------------------------
    Option("name", ("-n", "--name"), "Experiment name (default: run-N, unique in the store); re-using a name "
           "keeps history.", _RUN_FRONTS, record=True),
    Option("interval", ("--interval",), f"Sampling interval in seconds (default: config, else {DEFAULT_INTERVAL_S:g}).",
           _RUN_FRONTS, type=float, record=True),
    Option("devices", ("--devices",), "Visible GPU indices to profile, e.g. 0,1 (default: all visible).",
           _RUN_FRONTS, record=True),
    Option("source", ("--source",), "nvml, host, sim[:SCENARIO[:NGPUS]] or prometheus=http://HOST:9090 "
           "(default: nvml if a GPU is visible, else host).", _RUN_FRONTS, record=True),
    Option("match", ("--match",), "With --source prometheus=URL: label matchers restricting the series, "
           "e.g. 'job=\"train\"'.", _RUN_FRONTS, record=True),
    Option("store", ("--store",), "Store directory (default: $GPUPROF_STORE or .gpuprof/).",
           _on(_RUN_FRONTS, EVERY_COMMAND), record=True),
    Option("params", ("--param",), "Record a setting (repeatable).", _RUN_FRONTS, default=(), kind=MANY,
           metavar="KEY=VALUE", record=True),
    Option("checks", ("--check",), "Rule checked when the run ends (repeatable), e.g. \"sm_util > 60 for >=80%%\" "
           "or \"accuracy >= 0.92\".", _RUN_FRONTS, default=(), kind=MANY, metavar="RULE", record=True),
    Option("alerts", ("--alert",), "Rule watched while the run goes (repeatable), shown in the live header and "
           "kept with the run when it fires, e.g. \"sm_util < 50 for >30%% within step\" (each step) or "
           "\"sm_util < 50 for >30%%\" (the last minute); a figure of the steps (data_wait_frac, step_time_p50_s, "
           "step_time_p95_s, steps_per_s, e.g. 'data_wait_frac > 0.3') is judged on each rank's steps of the last "
           "minute; with --trace on-alert the steps after it fires are traced (under gpuprof run, the offending "
           "rank's).", _RUN_FRONTS, default=(), kind=MANY, metavar="RULE", record=True),
    Option("trace", ("--trace",), "torch.profiler for a window of the reported steps: steps A to B-1, or T seconds "
           "from S s (at step boundaries; under gpuprof run in the ranks of --trace-ranks), or on-alert[=N]: the N "
           "steps (default 5) after an --alert rule fires, under gpuprof run in the rank the alert names "
           "(docs/trace-on-alert.md); operators, kernels and a merged Perfetto trace (gpuprof trace NAME).",
           _on(MAGIC, RUN, PROFILE), metavar="steps=A:B|seconds=S:T|on-alert[=N]", record=True),
    Option("memory_history", ("--memory-history",), "Record torch's allocator history while the run goes (once "
           "CUDA is initialised; under gpuprof run in the command's processes); its snapshot is saved with the run, "
           "per process, when a step leaves under 5%% of the GPU free and on out-of-memory, for "
           "pytorch.org/memory_viz (docs/memory.md).", _RUN_FRONTS, kind=SWITCH, default=False, record=True),
    Option("stuck_after", ("--stuck-after",), "A run that made steps and then none for this long, and for ten "
           "times its median step, is stuck: every thread's (every rank's) stacks are saved and it is said "
           "(default 30; off: not watched; docs/flight-recorder.md).", _on(MAGIC, RUN, PROFILE),
           metavar="SECONDS|off", record=True),
    # -- gates: rules judged on a run ----------------------------------------------------------
    Option("fail_on_check", ("--fail-on-check",), "Raise after saving when a --check rule fails or cannot be "
           "judged (CANNOT JUDGE: no reading, run or steps too short).", _on(MAGIC, PROFILE), kind=SWITCH,
           default=False),
    Option("rule", ("--rule",), "Rule judged on the saved run (repeatable; default: the rules it was run with).",
           _on(CHECK), default=(), kind=MANY, metavar="RULE"),
    Option("pipeline", ("--pipeline",), "Also check the step's profiling.thresholds (default step: train).",
           _on(RUN, CHECK), metavar="FILE[:STEP]"),
    Option("accept_unjudged", ("--accept-unjudged",), "Exit 0 (not 3) when rules that cannot be judged (no "
           "reading, run or steps too short) are the only ones not passing; they still print CANNOT JUDGE.",
           _on(RUN, CHECK), kind=SWITCH, default=False),
    # -- one front end's own -------------------------------------------------------------------
    Option("capture", ("--capture",), "Record these variables' values after the cell.", _on(MAGIC),
           metavar="VAR,..."),
    Option("no_live", ("--no-live",), "No live dashboard while the cell runs.", _on(MAGIC), kind=SWITCH,
           default=False),
    Option("quiet", ("--quiet",), "Show nothing (implies --no-live); the experiment is still saved.", _on(MAGIC),
           kind=SWITCH, default=False),
    Option("sample", (), "Profile this share of the calls (or with entries), the first included: 0.1 is one in "
           "ten.", _on(PROFILE), type=float, default=1.0),
    Option("on_stuck", ("--on-stuck",), "stop: end the job once a stuck rank's stacks are saved, exit 4 with "
           "status stuck (default wait: keep watching).", _on(RUN), default="wait", choices=("wait", "stop")),
    Option("trace_ranks", ("--trace-ranks",), "Ranks of the command that --trace traces (default: 0; --trace "
           "on-alert traces the rank an alert names).", _on(RUN),
           default="0", metavar="all|R[,R...]"),
    Option("price_kwh", ("--price-kwh",), "Price per kWh (default: $GPUPROF_PRICE_KWH).", EVERY_COMMAND, type=float),
    Option("price_gpu_hour", ("--price-gpu-hour",), "Price per GPU-hour (default: $GPUPROF_PRICE_GPU_HOUR).",
           EVERY_COMMAND, type=float),
    # -- --tune --------------------------------------------------------------------------------
    Option("tune", ("--tune",), "Run the cell as short measured trials and find the fastest DataLoader settings "
           "(docs/tune.md); with VAR.FIELD=V1,V2 also try these values of a config field (batch size, AMP: "
           "opt-in only).", _on(MAGIC, TUNE), default=(), kind=MANY, metavar="VAR.FIELD=V1,V2", bare=""),
    Option("trial_steps", ("--trial-steps",), "With --tune: steady steps measured per trial (default 20, at "
           "least 10).", _on(MAGIC, TUNE), type=int),
    Option("budget", ("--budget",), "With --tune: time for the whole search, e.g. 5min, 90s (default 5min).",
           _on(MAGIC, TUNE), keyword_default="5min"),
    Option("objective", ("--objective",), "With --tune: throughput (default), energy_per_sample or time.",
           _on(MAGIC, TUNE), keyword_default="throughput"),
    # -- comparing and serving (the magic's line form) -------------------------------------------
    Option("baseline", ("--baseline",), "compare: the baseline, a name or id (default: the first).",
           _on(MAGIC, COMPARE)),
    Option("all", ("--all",), "compare: every run in the store, in run order (default: the last two, or the "
           "names given).", _on(MAGIC, COMPARE), kind=SWITCH, default=False),
    Option("port", ("--port",), "serve: Prometheus exporter port (default: config, else 9464; 0 picks a free one).",
           _on(MAGIC), type=int),
    Option("addr", ("--addr",), "serve: address to listen on (default: config, else 127.0.0.1, this machine only).",
           _on(MAGIC)),
    Option("no_auth", ("--no-auth",), "serve: no bearer token (default: a scrape needs the token, see "
           "docs/prometheus.md).", _on(MAGIC), kind=SWITCH, default=False),
    Option("keep_after", ("--keep-after",), "session: keep a cell that ran longer than this without the magic as "
           "an experiment from the session record (default 60s; 0: never).", _on(MAGIC), metavar="DURATION"),
)

BY_NAME = {option.name: option for option in OPTIONS}


def options_of(front: str) -> tuple[Option, ...]:
    """The options ``front`` takes, in the table's order."""
    return tuple(option for option in OPTIONS if front in option.fronts)


def add_options(parser, front: str) -> None:
    """Add ``front``'s flags to an argparse parser (or an argument group)."""
    for option in options_of(front):
        if option.flags:
            parser.add_argument(*option.flags, **option.argparse_kwargs())


def given(args, front: str) -> dict[str, Any]:
    """The run's options of parsed arguments, by RunOptions' field names (``--check`` ->
    ``checks``): what ``RunOptions.resolve`` takes."""
    return {option.name: getattr(args, option.dest) for option in options_of(front) if option.record}


def keywords(front: str) -> tuple[str, ...]:
    """The keywords ``front`` (``PROFILE``, ``TUNE``) takes, in the table's order."""
    return tuple(option.name for option in options_of(front))


__all__ = ["BY_NAME", "CHECK", "COMPARE", "EVERY_COMMAND", "MAGIC", "OPTIONS", "Option", "PARSED",
           "PROFILE", "RUN", "TUNE", "add_options", "given", "keywords", "options_of"]
