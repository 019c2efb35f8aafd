"""The child processes' event channel: messages from a profiled child process to its run.

Runs in both ends: the child (``runtime/jobs/child.py``, started by the startup hook in every
Python process of a profiled job) and the process that holds the run (``runtime/
jobs/children_listener.py``: the kernel, or ``gpuprof run``). A sibling of the kernel/sampler protocol
(``core/protocol.py``), whose field checks it shares.

The channel is a unix stream socket named in the child's environment, in a directory only the
run's user can enter. One JSON object per line, in this order on one connection:

* ``hello``: who the child is (pid, rank, local rank, world size, visible devices, argv, its
  spawn index, the pid it was forked from when it is a fork of a child, and its place in a
  multi-node job: host, node rank, restart count, the job's id: ``core/job_identity.py``);
* ``events``: a batch of ``(kind, monotonic time, value)`` events, exactly as the kernel's
  ``EventBuffer.drain()`` gives them (docs/events.md), packed (``pack_events``), twice a second
  once connected, with the time they cover up to (``as_of``);
* ``final``: at the child's exit: the settings its hooks saw, phases, ``log()`` values, its
  notes, the device its tensors used, the error that ended it, if one did, its ``--trace``
  window (``trace``: the window's record, its ``file`` a gzipped trace beside the socket) and
  its sampled step's memory breakdown (``memory``, docs/memory.md), and what explains its
  out-of-memory error if it died of one (``oom``).

* ``capture``: a ``--trace on-alert`` window this child took at its run's request (below):
  the window's record (``TraceWindow.finish``, its ``file`` the gzipped trace beside the socket,
  ``bytes`` its size), sent when the window closes.

The other way, the run writes one line to a child only to ask for a trace: ``trace``
(``TRACE_REQUEST``: ``steps`` to trace from its next step boundary, ``name`` of the file to
write beside the socket, and the ``alert`` that caused it). A child reads it in its sender
thread (``runtime/jobs/child.py``), twice a second; the run never waits for it.

A child that cannot connect appends one line (``{"pid", "why"}``) to the notes file named
beside the socket and runs unprofiled.

What arrives is read as the kernel/sampler protocol reads its messages (``core/protocol.py``):
``parse`` turns one line into a frozen record (``Hello``, ``Batch``, ``Final``) whose every field
is checked, or raises ``Malformed`` saying which field is wrong. A line is at most ``MAX_LINE``
bytes (the reader never reads more before giving up), its JSON nests at most ``MAX_DEPTH`` deep,
and a child splits its events into messages of at most ``MAX_EVENTS_PER_MESSAGE``.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
import os
import re
import signal
from array import array
from dataclasses import dataclass, field
from typing import Any

from gpuprof_jupyter.core.protocol import Malformed, _short, check
from gpuprof_jupyter.core.format import fmt_bytes

CHANNEL_ENV = "GPUPROF_CHILD_CHANNEL"  # the socket's path; absent: the startup hook does nothing
NOTES_ENV = "GPUPROF_CHILD_NOTES"  # where a child that cannot connect says so
T0_ENV = "GPUPROF_CHILD_T0"  # the run's start, time.monotonic() (one clock for every process on a host)
MEMORY_HISTORY_ENV = "GPUPROF_MEMORY_HISTORY"  # gpuprof run --memory-history: the experiment's folder for the snapshot
RUN_METRICS_ENV = "GPUPROF_RUN_METRICS"  # gpuprof run: the file log() writes to outside a run
WALL0_ENV = "GPUPROF_CHILD_WALL0"  # the run's start, time.time() (a trace window's clock)
TRACE_ENV = "GPUPROF_CHILD_TRACE"  # gpuprof run --trace: the window (steps=A:B), traced in the child
TRACE_RANKS_ENV = "GPUPROF_CHILD_TRACE_RANKS"  # --trace-ranks: "all", or ranks separated by commas

HELLO, EVENTS, FINAL, CAPTURE = "hello", "events", "final", "capture"
TRACE_REQUEST = "trace"  # the run to a child: trace your next steps (--trace on-alert)
# the stack dump: a child that connected registers faulthandler on this signal, writing every
# thread's stack to STACKS_FILE in the channel's folder (runtime/jobs/stuck_watch.py sends it). A
# real-time signal nobody else uses (SIGUSR1/2 are often the job's own: Slurm, elastic agents)
STACKS_SIGNAL = int(getattr(signal, "SIGRTMIN", signal.SIGUSR2)) + (7 if hasattr(signal, "SIGRTMIN") else 0)
STACKS_FILE = "stacks-{pid}.txt"
MAX_LINE = 8 << 20  # bytes of one message, newline included: a full events message is ~4.5 MiB
MAX_EVENTS_PER_MESSAGE = 200_000  # 17 bytes each before base64: a child splits a bigger batch
MAX_DEPTH = 16  # nesting of a message's JSON (settings, log() values, a trace record)
MAX_RANK = 1 << 20  # ranks, local ranks, world sizes and spawn indices are below this


def encode(kind: str, **fields) -> bytes:
    """One message: a JSON line. Non-JSON values (numpy scalars, objects) become their repr."""
    return (json.dumps({"type": kind, **fields}, default=repr, separators=(",", ":")) + "\n").encode()


def pack_events(events: list[tuple]) -> dict:
    """``events`` fields of an ``events`` message: kinds, times and values as packed arrays
    (base64), about 4x cheaper to encode than JSON lists in the training process (the values,
    ints, floats or None, travel as float64 with NaN for None: an optimizer's id, a batch size
    and NO_BATCH are exact)."""
    if not events:
        return {"kinds": "", "times": "", "values": ""}
    kinds, times, values = zip(*events)
    nan = math.nan
    return {"kinds": base64.b64encode(bytes(kinds)).decode(),
            "times": base64.b64encode(array("d", times).tobytes()).decode(),
            "values": base64.b64encode(array("d", [nan if v is None else v for v in values]).tobytes()).decode()}


def pack_sendable(events: list[tuple]) -> tuple[dict, int]:
    """``pack_events`` of the events a child can send, and how many it could not (dropped):
    a time that is not a finite number (the run would drop it anyway), a kind beyond a byte, a
    time or value that is not a number. One pass when all are fine (the usual case)."""
    try:
        fields = pack_events(events)
        if math.isfinite(sum(t for _, t, _ in events)):
            return fields, 0
    except (TypeError, ValueError, OverflowError):
        pass
    good = [event for event in events if _sendable(event)]
    return pack_events(good), len(events) - len(good)


def _sendable(event: tuple) -> bool:
    try:
        pack_events([event])
        return math.isfinite(event[1])
    except (TypeError, ValueError, OverflowError):
        return False


def unpack_events(kinds: str, times: str, values: str) -> list[tuple]:
    """The ``(kind, time, value)`` events of an ``events`` message (ints back where exact);
    ValueError when the arrays are not base64, not float64 or differ in length."""
    kind_bytes = base64.b64decode(kinds, validate=True)
    time_array, value_array = array("d"), array("d")
    time_array.frombytes(base64.b64decode(times, validate=True))
    value_array.frombytes(base64.b64decode(values, validate=True))
    if not len(kind_bytes) == len(time_array) == len(value_array):
        raise ValueError("an events message whose arrays differ in length")
    return [(k, t, None if v != v else (int(v) if v.is_integer() else v))
            for k, t, v in zip(kind_bytes, time_array, value_array)]


# -- what arrives: one record per message, every field checked ----------------------------------
@dataclass(frozen=True)
class Hello:
    """Who a child is, first on its connection. ``forked_from``: the pid it was forked from
    (a fork reports as a child of its own, never as its parent's rank)."""

    pid: int
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    cuda_visible_devices: str | None = None
    argv: list = field(default_factory=list)
    process_index: int | None = None
    forked_from: int | None = None
    # its place in a multi-node job (core/job_identity.rank_identity); None where no launcher said
    host: str | None = None
    node_rank: int | None = None
    restart_count: int | None = None
    job: str | None = None
    launcher: str | None = None  # torchrun, slurm, ray (a Ray Train worker: runtime/jobs/ray_train.py)

    def validate(self) -> None:
        _positive(self, "pid")
        for name in ("rank", "local_rank", "world_size", "process_index", "node_rank", "restart_count"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < MAX_RANK:
                raise Malformed(f"Hello.{name} = {value!r} (not a rank)")
        if self.forked_from is not None:
            _positive(self, "forked_from")
        _strings(self, "argv")


@dataclass(frozen=True)
class Batch:
    """An ``events`` message: packed events (``pack_events``) up to ``as_of`` (monotonic s);
    ``events`` holds them unpacked once ``parse`` checked them."""

    kinds: str
    times: str
    values: str
    as_of: float
    events: list = field(default_factory=list, repr=False)

    def validate(self) -> None:
        """``as_of`` only: each event's kind, time and value are checked by the run before it
        folds them (``runtime/record/event_check.py``), so one bad event costs only itself."""
        if not math.isfinite(self.as_of):
            raise Malformed(f"Batch.as_of = {self.as_of!r}")


@dataclass(frozen=True)
class Final:
    """What a child says at its exit (module docstring)."""

    params: dict = field(default_factory=dict)
    torch_filled: list = field(default_factory=list)
    phases: list = field(default_factory=list)
    user_metrics: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    error: str | None = None
    device: str | None = None
    process_index: int | None = None
    trace: dict | None = None
    # where its memory went (runtime/hooks/memory_hooks.breakdown_record): {"counted": {category:
    # bytes}, "sampled_peak_bytes": bytes or None, "uncounted_saved_tensors": count}
    memory: dict | None = None
    # it died of torch.OutOfMemoryError (runtime/hooks/oom_record.oom_context): {"error": message,
    # "counted": {category: bytes}, "memory_history": {"snapshot": path or None, ...}}
    oom: dict | None = None
    # --memory-history saved the snapshot when its headroom ran low (runtime/hooks/oom_record.MemoryHistory.watch):
    # {"snapshot": path or None, "headroom_frac": share, "device": index, "step": count, ...}
    memory_history: dict | None = None

    def validate(self) -> None:
        _strings(self, "torch_filled")
        _strings(self, "notes")
        if self.memory is not None:
            counted = self.memory.get("counted")
            peak = self.memory.get("sampled_peak_bytes")
            if not (isinstance(counted, dict) and all(isinstance(k, str) and _number(v) for k, v in counted.items())
                    and (peak is None or _number(peak))):
                raise Malformed(f"Final.memory = {_short(self.memory)}")
        if self.oom is not None:
            oom = self.oom if isinstance(self.oom, dict) else {}
            counted = oom.get("counted", {})
            history = oom.get("memory_history", {})
            if not (isinstance(oom.get("error"), str) and isinstance(counted, dict)
                    and (oom.get("optimizer_steps") is None or _number(oom["optimizer_steps"]))
                    and all(isinstance(k, str) and _number(v) for k, v in counted.items())
                    and isinstance(history, dict) and isinstance(history.get("snapshot", ""), (str, type(None)))
                    and (history.get("low_headroom") is None or _low_headroom(history["low_headroom"]))):
                raise Malformed(f"Final.oom = {_short(self.oom)}")
        if self.memory_history is not None and not _low_headroom(self.memory_history):
            raise Malformed(f"Final.memory_history = {_short(self.memory_history)}")
        for i, phase in enumerate(self.phases):
            if not (isinstance(phase, dict) and isinstance(phase.get("name"), str) and _number(phase.get("start_s"))
                    and (phase.get("end_s") is None or _number(phase.get("end_s")))):
                raise Malformed(f"Final.phases[{i}] = {_short(phase)}")
        if self.trace is not None and not isinstance(self.trace.get("file", ""), str):
            raise Malformed(f"Final.trace = {_short(self.trace)}")


def _low_headroom(low: Any) -> bool:
    """A low-headroom snapshot's record (``MemoryHistory.watch``) with each value the views print of its kind."""
    return (isinstance(low, dict) and isinstance(low.get("snapshot", ""), (str, type(None)))
            and _number(low.get("headroom_frac")) and _number(low.get("step"))
            and (low.get("threshold") is None or _number(low["threshold"]))
            and (low.get("device") is None or _count(low["device"])) and isinstance(low.get("why", ""), str))


# what the run reads of a capture's record (runtime/jobs/children_listener.py renumbers its steps, the
# summary and the report print the rest), each checked to its value as Final's fields are
_CAPTURE_TIMES = ("start_s", "end_s", "start_cost_s", "stop_cost_s", "export_cost_s")  # None or finite seconds
_CAPTURE_COUNTS = ("first_step", "end_step", "steps", "events", "dropped_events", "base_time_ns")  # None or >= 0
_CAPTURE_TEXTS = ("status", "window")


@dataclass(frozen=True)
class Capture:
    """A ``capture`` message: the record of a window traced at the run's request (module
    docstring): its file a bare name beside the socket, its size, times, step counts, texts,
    activities and alert of their kind, so that a bad value costs this message only."""

    window: dict

    def validate(self) -> None:
        w = self.window
        file, size = w.get("file"), w.get("bytes", 0)
        good = ((file is None or (isinstance(file, str) and os.path.basename(file) == file)) and _number(size)
                and all(w.get(k) is None or _number(w[k]) for k in _CAPTURE_TIMES)
                and all(w.get(k) is None or _count(w[k]) for k in _CAPTURE_COUNTS)
                and all(w.get(k) is None or isinstance(w[k], str) for k in _CAPTURE_TEXTS)
                and isinstance(w.get("activities", []), list) and all(isinstance(a, str) for a in w.get("activities", []))
                and isinstance(w.get("alert") or {}, dict))
        if not good:
            raise Malformed(f"Capture.window = {_short(w)}")


RECORDS: dict[str, type] = {HELLO: Hello, EVENTS: Batch, FINAL: Final, CAPTURE: Capture}


def parse(line: bytes) -> Hello | Batch | Final | Capture:
    """One message, as its record with every field checked; ``Malformed`` (a ValueError) for
    anything else, saying what is wrong. Never another error, never unbounded work: the line
    is at most ``MAX_LINE`` bytes and its nesting is bounded (the JSON parser's own recursion
    limit first, then ``MAX_DEPTH``)."""
    if len(line) > MAX_LINE:
        raise Malformed(f"a message of more than {fmt_bytes(MAX_LINE, 0)}")
    try:
        message = json.loads(line)
    except RecursionError:
        raise Malformed(f"a message nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer too long to read
        raise Malformed(f"not a JSON line ({type(exc).__name__}: {_short(str(exc))})") from None
    kind = message.get("type") if isinstance(message, dict) else None
    cls = RECORDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise Malformed(f"not a child message: {_short(line[:80])}")
    if _depth(message) > MAX_DEPTH:
        raise Malformed(f"a message nested deeper than {MAX_DEPTH} levels")
    wire = {f.name: message[f.name] for f in dataclasses.fields(cls) if f.name in message and f.name != "events"}
    try:
        record = check(cls(**wire), (cls,))  # unknown fields (a newer child's) are left aside
    except TypeError as exc:
        raise Malformed(f"{cls.__name__} without a required field ({exc})") from None
    if cls is Batch:
        try:
            record = dataclasses.replace(record, events=unpack_events(record.kinds, record.times, record.values))
        except (ValueError, binascii.Error) as exc:
            raise Malformed(f"Batch arrays that cannot be read ({exc})") from None
    record.validate()
    return record


def _depth(value: Any) -> int:
    """How deep lists and dicts nest in ``value`` (iterative: no recursion of ours)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if level <= MAX_DEPTH:
                stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _positive(record, name: str) -> None:
    value = getattr(record, name)
    if value <= 0:
        raise Malformed(f"{type(record).__name__}.{name} = {value!r} (not a pid)")


def _strings(record, name: str) -> None:
    for i, item in enumerate(getattr(record, name)):
        if not isinstance(item, str):
            raise Malformed(f"{type(record).__name__}.{name}[{i}] = {_short(item)}")


def resolve_rank(rank: int | None, local_rank: int | None, process_index: int | None) -> int | None:
    """A process's rank, the one answer for the run's ranks (``runtime/jobs/children_listener.py``) and
    ``--trace-ranks``: ``RANK`` (torchrun, accelerate), else ``LOCAL_RANK`` (a one-node launcher
    that sets only it), else ``torch.multiprocessing.spawn``'s process index; None without any
    (the run then numbers it in connection order, and ``traced`` counts it as rank 0)."""
    return next((r for r in (rank, local_rank, process_index) if r is not None), None)


def parse_trace_ranks(text: str) -> str | frozenset[int]:
    """``--trace-ranks``: ``"all"``, or ranks separated by commas (``"0"``, ``"0, 2"``) as a set.
    ValueError for anything else, so a typo is refused before the job starts (``gpuprof run``)."""
    compact = text.replace(" ", "")
    if not re.fullmatch(r"all|-?\d+(,-?\d+)*", compact):
        raise ValueError(f"--trace-ranks takes all or ranks separated by commas; got {text!r}")
    return "all" if compact == "all" else frozenset(int(r) for r in compact.split(","))


def traced(rank: int | None, ranks: str) -> bool:
    """Whether ``rank`` (``resolve_rank``; None: a process without one, traced as rank 0) is
    among ``--trace-ranks`` (``parse_trace_ranks``; ValueError when malformed)."""
    chosen = parse_trace_ranks(ranks)
    return chosen == "all" or (rank or 0) in chosen


def append_run_metrics(metrics: dict) -> bool:
    """``log()`` in a process of ``gpuprof run`` that reports to no run (its hooks could not
    connect, or an older child): one JSON line in the run's metrics file, read when the
    command ends. False when there is no such file."""
    path = os.environ.get(RUN_METRICS_ENV)
    if not path:
        return False
    clean = {k: (v.item() if hasattr(v, "item") else v) for k, v in metrics.items()}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(clean, default=repr) + "\n")
    return True


def identity(environ=os.environ) -> dict:
    """The ``hello`` fields a child reads from its own environment (a value that is no rank,
    ``LOCAL_RANK=-1`` as some launchers write, is None: the run would refuse it). A rank
    started by ``srun`` without ``RANK`` takes Slurm's (``job_identity.slurm_rank``)."""
    from gpuprof_jupyter.core.job_identity import rank_identity, slurm_rank

    environ = {**slurm_rank(environ), **environ}

    def number(name):
        try:
            value = int(environ[name])
        except (KeyError, ValueError, TypeError):
            return None
        return value if 0 <= value < MAX_RANK else None
    place = rank_identity(environ)
    return {"pid": os.getpid(), "rank": number("RANK"), "local_rank": number("LOCAL_RANK"),
            "world_size": number("WORLD_SIZE"), "cuda_visible_devices": environ.get("CUDA_VISIBLE_DEVICES"),
            **{k: v for k, v in place.items() if not (isinstance(v, int) and v >= MAX_RANK)}}


__all__ = ["RUN_METRICS_ENV", "STACKS_FILE", "STACKS_SIGNAL", "append_run_metrics", "Batch", "CHANNEL_ENV", "EVENTS", "FINAL", "Final", "HELLO", "Hello",
           "MAX_DEPTH", "MAX_EVENTS_PER_MESSAGE", "MAX_LINE", "Malformed", "NOTES_ENV", "T0_ENV", "TRACE_ENV",
           "TRACE_RANKS_ENV", "WALL0_ENV", "encode", "identity", "pack_events", "pack_sendable", "parse", "parse_trace_ranks",
           "resolve_rank", "traced", "unpack_events"]
