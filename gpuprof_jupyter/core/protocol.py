"""What crosses between the kernel and its sampler process: every message, typed and checked.

Runs in both processes (and below the sources, the store and the views): the standard library
only. Messages are these frozen dataclasses, pickled on the private socket pair the kernel
made (``runtime/link.py``); each side checks what it receives (``check``) and answers a
malformed message with an error, never by dying. A reading with its time (``Tick``) and a
stretch nobody saw (``Gap``) are the one pair of types the sources, the sampling lanes, the
store and the live view share; ``is_gap`` is the one gap rule. docs/architecture.md describes
the exchange.

    kernel -> process   Request(id, Begin | End | Status | Ping | Serve | Cancel | SessionQuery)
                        Events (the kernel's step events, once a second), LiveTarget, Quit,
                        SessionControl, CellMark (the session record: docs/session.md)
    process -> kernel   Ready, Reply(id, result | RemoteError), LiveUpdate, SessionNotice
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, ClassVar

from gpuprof_jupyter.core.fault_injection import FAKE_NVML_ENV, test_seconds

PROTOCOL_VERSION = 1
LIVE_ROWS_PER_S = 20  # per device and second, at most, in the live view's rows (and the exporter's)
GAP_INTERVALS = 2.0  # the gap rule: see ``is_gap``

Reading = dict[str, dict[str, float]]  # device key -> metric -> value
# Where the sampler process writes each kernel's session record and state, in the Jupyter runtime
# folder (beside the kernels' connection files): the kernel names it, the Jupyter server reads it
SESSION_RECORD_FOLDER = "gpuprof-sessions"


# -- readings and gaps ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Tick:
    """A reading with the time it describes: ``time.monotonic()`` (system-wide on Linux, so
    the kernel and the sampler process share it) and ``time.time()`` at the same moment."""

    mono: float
    wall: float
    reading: Reading


@dataclass(frozen=True)
class Gap:
    """A stretch that was not seen (monotonic seconds): from the last reading before it to the
    first after it. ``source``: whose gap, when not the sampling lane's own."""

    start: float
    end: float
    source: str | None = None

    @property
    def duration_s(self) -> float:
        return self.end - self.start

    def since(self, t0: float) -> list:
        """As the experiment keeps it (``meta.gaps``): seconds since ``t0``, the source if any."""
        return [self.start - t0, self.end - t0] + ([self.source] if self.source is not None else [])


def is_gap(previous: float, current: float, interval_s: float) -> bool:
    """The one gap rule: a source's next reading came more than two of its own intervals
    after the previous one (monotonic seconds)."""
    return current - previous > GAP_INTERVALS * interval_s


# -- kernel -> process ----------------------------------------------------------------------------
@typing.runtime_checkable
class SamplingOptions(typing.Protocol):
    """What the sampler process reads of a run's options. The kernel sends the run's whole
    options record (``runtime/run_options.RunOptions``, checked there), pickled: reading it
    imports that module and its few light ones in the sampler process, never torch or IPython.
    ``store`` is a ``core.store.directory.Store`` with an absolute root; ``checks`` and
    ``alerts`` are parsed rules (``core.analysis.rules.Rule``)."""

    interval: float
    store: Any
    source: str | None
    devices: list | None
    checks: list
    alerts: list


@dataclass(frozen=True)
class Begin:
    """Open the sources, create the experiment and sample. ``token`` names this begin, so a
    ``Cancel`` can name it too; ``options`` are the run's (``SamplingOptions``)."""

    token: str
    t0: float
    options: SamplingOptions
    meta: dict
    cwd: str | None = None
    environ: dict | None = None  # the kernel's GPUPROF_* settings (``is_kernel_setting``)
    cuda_visible_devices: str | None = None
    fail_step: str | None = None  # tests: a step of the sampler process that must fail
    live: bool = False  # a live view will name its plots (``LiveTarget``): keep its rows until then


@dataclass(frozen=True)
class Events:
    """The kernel's step events folded since the last batch (once a second, and with ``End``)."""

    as_of: float
    transitions: list = field(default_factory=list)
    steps: list = field(default_factory=list)  # tuples in ``core.finish.STEP_FIELDS`` order
    reported: bool = False
    phases: list = field(default_factory=list)  # {"name", "start_s", "end_s"}
    torch: dict | None = None  # torch memory statistics read in the kernel, when CUDA is initialised
    requests: list = field(default_factory=list)  # tuples in ``core.finish.REQUEST_FIELDS`` order


@dataclass(frozen=True)
class LiveTarget:
    """The live view of run ``token`` is on the page: the ids of its plots' data sources (role
    -> Bokeh model id: ``recent``, ``history``, ``bands``), the ``core.plots.spec.PlotSpec`` its
    columns follow, and the rows the page keeps (rollover). From then on the process prepares
    the view's changes (``LiveUpdate.patches``)."""

    token: str
    sources: dict
    spec: Any
    recent_rows: int
    history_refresh_s: float = 60.0


@dataclass(frozen=True)
class End:
    """The end of a run: what only its closer knows. Built here once, by the kernel at ``stop``
    or by the sampler process when the kernel is gone (``without_kernel``); ``apply_to`` is
    the one place it reaches the metadata. None: not known, the metadata keeps its own."""

    status: str
    error: str | None = None
    ended_at: str | None = None
    as_of: float | None = None  # monotonic time up to which the kernel's events are complete
    duration_s: float | None = None
    params: dict | None = None
    phases: list | None = None
    user_metrics: dict | None = None
    captured: dict | None = None
    trace: dict | None = None
    name: str | None = None
    context: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    events: Events | None = None

    META_FIELDS: ClassVar[tuple[str, ...]] = ("status", "error", "ended_at", "duration_s", "params", "phases",
                                              "user_metrics", "captured", "trace", "name")
    ALWAYS: ClassVar[tuple[str, ...]] = ("status", "error", "ended_at")  # set even when None

    @classmethod
    def without_kernel(cls, status: str, note: str, as_of: float, phases: list | None = None,
                       error: str | None = None) -> "End":
        """The record the sampler process writes when the kernel cannot (it died, or quit)."""
        return cls(status=status, error=error, ended_at=utc_now(), as_of=as_of, phases=phases, notes=[note])

    def apply_to(self, meta) -> None:
        """Set what this record knows on an ``ExperimentMeta`` (notes and context are merged by
        the caller, who knows which it already has)."""
        for name in self.META_FIELDS:
            value = getattr(self, name)
            if value is not None or name in self.ALWAYS:
                setattr(meta, name, value)


@dataclass(frozen=True)
class Status:
    """The visible GPUs (``%gpuprofile status``, ``gpu_available()``), as the kernel sees them."""

    cuda_visible_devices: str | None = None


@dataclass(frozen=True)
class Ping:
    """Alive? With ``lateness``: also the fast lane's tick lateness and the gaps (benchmarks)."""

    lateness: bool = False


@dataclass(frozen=True)
class Serve:
    """Start (or with ``stop``, stop) the Prometheus exporter in the sampler process."""

    port: int | None = None
    addr: str | None = None
    stop: bool = False
    token: str | None = None  # bearer token scrapes must carry (None: --no-auth)
    token_file: str | None = None  # where it is kept, for the printed scrape config
    source: str | None = None  # what the devices are read with between runs


@dataclass(frozen=True)
class Cancel:
    """The kernel stopped waiting for the ``Begin`` named ``token``: it must leave nothing."""

    token: str


@dataclass(frozen=True)
class Quit:
    """The kernel closes the profiler: finish a run still recording (``interrupted``) and exit."""


@dataclass(frozen=True)
class SessionControl:
    """The session record's settings (no reply): on or off, its cadence, the cell length past
    which a cell without the magic is kept as an experiment, the store those go to, the folder
    the record is written to (``record_dir``: the user's Jupyter runtime folder) and who the
    kernel is (``kernel``: id, user, pid, for the server extension). None: unchanged."""

    on: bool | None = None
    interval: float | None = None
    keep_after_s: float | None = None
    store: str | None = None
    kernel: dict | None = None
    record_dir: str | None = None
    notice_after_s: float | None = None  # idle while holding GPU memory this long: the kernel is told once


@dataclass(frozen=True)
class CellMark:
    """A cell of the kernel began (``event`` "start") or ended ("end"), at ``mono``/``wall``:
    the session record's marks (no reply). ``cell``: its execution count; ``source``: its
    first line; at the end its ``status`` and the ``experiment`` it was profiled as, if any."""

    event: str
    mono: float
    wall: float
    cell: int | None = None
    source: str | None = None
    status: str | None = None
    experiment: str | None = None


@dataclass(frozen=True)
class SessionQuery:
    """The session record as it is now (``core/analysis/session_account.SessionAccount.to_dict``
    and the record's settings)."""


REQUESTS = (Begin, End, Status, Ping, Serve, Cancel, SessionQuery)


@dataclass(frozen=True)
class Request:
    id: int
    body: Any  # one of REQUESTS


# -- process -> kernel ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Ready:
    pid: int
    version: int = PROTOCOL_VERSION


@dataclass(frozen=True)
class LiveUpdate:
    """What the kernel needs of the running experiment, once a second (sent even when empty: the
    kernel hands its events over on the same wake-up): PATCH-DOC texts for
    the live plots, ready to forward (``(header, content)``; none before a ``LiveTarget``),
    the newest values per device for the header, per device the rows that came and the time
    (monotonic) of the newest, the gaps recorded since the last update (``Gap.since``) and
    the alerts fired."""

    patches: list = field(default_factory=list)
    latest: dict = field(default_factory=dict)
    rows: dict = field(default_factory=dict)  # device -> number of rows in this update
    newest: dict = field(default_factory=dict)  # device -> monotonic time of its newest row
    gaps: list = field(default_factory=list)
    alerts: list = field(default_factory=list)


@dataclass(frozen=True)
class SessionNotice:
    """The GPUs have sat idle for ``idle_s`` while this kernel held ``memory_held_bytes`` of their
    memory (process -> kernel, no reply; the kernel says it once, at its next cell)."""

    idle_s: float
    memory_held_bytes: float
    since_wall: float | None = None


class RunCancelled(RuntimeError):
    """The kernel stopped waiting for a begin (``Cancel``): that run is not kept."""


class ExporterBindError(OSError):
    """The exporter's port is taken or its address cannot be bound (raised by the exporter,
    re-raised as itself in the kernel)."""


# Kinds of RemoteError, each re-raised in the kernel as the caller expects (``runtime/link.py``)
USAGE, PORT_TAKEN, FAILED, MALFORMED, CANCELLED = "usage", "port_taken", "failed", "malformed", "cancelled"


@dataclass(frozen=True)
class RemoteError:
    """Why a request failed, by kind (never by class name): ``usage`` (the caller's mistake, a
    ValueError there), ``port_taken`` (ExporterBindError), ``malformed`` (the request could not
    be read), ``cancelled``, ``failed`` (anything else; ``trace`` says where)."""

    kind: str
    message: str
    trace: str | None = None
    errno: int | None = None

    @classmethod
    def of(cls, exc: BaseException, trace: str | None = None) -> "RemoteError":
        if isinstance(exc, ExporterBindError):
            return cls(PORT_TAKEN, exc.strerror or str(exc), trace, exc.errno)
        if isinstance(exc, ValueError):
            return cls(USAGE, str(exc), trace)
        if isinstance(exc, RunCancelled):
            return cls(CANCELLED, str(exc), trace)
        return cls(FAILED, f"{type(exc).__name__}: {exc}", trace)


@dataclass(frozen=True)
class Reply:
    """The answer to ``Request`` ``id`` (None: to a message too malformed to have one)."""

    id: int | None
    result: Any = None
    error: RemoteError | None = None


# -- checking what arrives ------------------------------------------------------------------------
class Malformed(ValueError):
    """A message that is not one of this protocol's, or whose fields have the wrong types."""


def check(message: Any, expected: tuple[type, ...]) -> Any:
    """``message`` when it is one of ``expected`` with every field of its declared type
    (one level into lists and dicts is not looked at: their items are the reader's to trust);
    else Malformed, saying what is wrong."""
    if not isinstance(message, expected):
        raise Malformed(f"unexpected message {_short(message)}")
    _check_fields(message)
    if isinstance(message, Request):
        if not isinstance(message.body, REQUESTS):  # its fields were checked with the Request's
            raise Malformed(f"unknown request {_short(message.body)}")
    return message


def _check_fields(message: Any) -> None:
    hints = _hints(type(message))
    for f in dataclasses.fields(message):
        try:
            value = getattr(message, f.name)
        except AttributeError:
            raise Malformed(f"{type(message).__name__} without {f.name}") from None
        if not conforms(value, hints[f.name]):
            raise Malformed(f"{type(message).__name__}.{f.name} = {_short(value)}")
        if dataclasses.is_dataclass(value):
            _check_fields(value)


_HINTS: dict[type, dict] = {}


def _hints(cls: type) -> dict:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def conforms(value: Any, hint: Any, items: bool = False) -> bool:
    """Is ``value`` of the declared type ``hint``? With ``items``, the items of a list and the
    keys and values of a mapping are checked too, as deep as the hint says (``list[dict]``: a
    list of mappings, whatever they hold); without, only the container's own type is."""
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, arg, items) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is not None:
        if not isinstance(value, origin):
            return False
        if not items:
            return True
        args = typing.get_args(hint)
        if origin is list and args:
            return all(conforms(item, args[0], items) for item in value)
        if origin is dict and len(args) == 2:
            return all(conforms(k, args[0], items) and conforms(v, args[1], items) for k, v in value.items())
        return True
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


_conforms = conforms  # its earlier name


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a pickled object half built (fields missing): still Malformed
        text = f"<{type(value).__name__} that cannot be shown>"
    return text if len(text) <= 80 else text[:77] + "..."


# -- shared by both sides -------------------------------------------------------------------------
def utc_now() -> str:
    """Now, as the experiment's ``started_at``/``ended_at`` are written."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def is_kernel_setting(key: str) -> bool:
    """A GPUPROF_* variable the kernel hands to each run (the fake NVML is the process's own)."""
    return key.startswith("GPUPROF_") and key != FAKE_NVML_ENV


def apply_kernel_settings(cuda_visible: str | None, settings: dict[str, str] | None = None) -> None:
    """In the sampler process: take the kernel's CUDA_VISIBLE_DEVICES and, when given, its
    GPUPROF_* settings in place of the ones it had (notebooks change them between cells)."""
    if settings is not None:
        for key in [k for k in os.environ if is_kernel_setting(k)]:
            del os.environ[key]
        os.environ.update(settings)
    if cuda_visible is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible


def timeout_s(name: str, default: float) -> float:
    """A timeout of the exchange, ``default`` unless a test shortens it (core/fault_injection.py)."""
    return test_seconds(name, default)
